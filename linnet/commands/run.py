"""`linnet run` (generate text, streamed) and `linnet parity` (the gate against transformers).

Both take a zoo name (pulled, or found in the HF cache), an HF repo id, a local folder or a
`.gguf` file;
`--checkpoint PATH` pairs a zoo name with a local copy of its weights.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from linnet.commands.session import (
    BACKEND_OPTION,
    MODE_OPTION,
    NUMERICS_OPTION,
    generate_streamed,
    load_model,
    mode_option,
    placement_flags,
    placement_options,
    resolve_numerics,
)
from linnet.commands.zoo import fail_hub, warnings_to_stderr
from linnet.errors import CheckpointError

_TARGET = click.argument("target", metavar="NAME_OR_PATH")
_CHECKPOINT = click.option(
    "--checkpoint",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="a local folder with this entry's weights (instead of the HF cache)",
)
_REVISION = click.option("--revision", default=None, help="a branch, tag or commit to pull")


def _locate(target: str, checkpoint, revision):
    from linnet.hub import HubError
    from linnet.targets import locate

    with warnings_to_stderr():
        try:
            return locate(target, checkpoint=checkpoint, revision=revision)
        except HubError as err:
            fail_hub(err)


def _check_checkpoint(path) -> None:
    """Config and headers checked by Linnet (each value's type, range and fit with the
    tensors) before transformers reads anything: a bad value is our one-line error."""
    from linnet.weights.checkpoint import open_checkpoint

    open_checkpoint(path)


class TextStream:
    """Prints generated tokens as they come, holding back an incomplete UTF-8 sequence (a
    token that ends in the middle of a character). Each step decodes only the tokens from
    the last written one's predecessor on (`start`), not everything so far: what a token
    adds can depend on the one before it (a word's leading space), and decoding the whole
    answer every step grows with its length (and wakes the tokenizer's threads)."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.start = 0  # the window's first token
        self.written = 0  # tokens whose text is out
        self.out = out or sys.stdout

    def __call__(self, token) -> None:
        self.ids.append(int(token.reshape(-1)[0]))
        decode = self.tokenizer.decode
        before = decode(self.ids[self.start : self.written], skip_special_tokens=True)
        text = decode(self.ids[self.start :], skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(before) or len(text) == len(before):
            return
        self.out.write(text[len(before) :])
        self.out.flush()
        self.start, self.written = self.written, len(self.ids)

    def text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)


def eos_ids(folder, tokenizer) -> list[int]:
    """The tokens that end generation, as transformers' `generate` takes them: the
    checkpoint's generation_config.json, else the tokenizer's EOS."""
    eos = _generation_eos(Path(folder) / "generation_config.json")
    if eos is None:
        eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def _generation_eos(path: Path):
    """`eos_token_id` of a generation_config.json (read as data: transformers' loader would
    take the file's other fields as attributes), None when the file or the field is absent."""
    if not path.is_file():
        return None
    try:
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{path}: not a JSON object ({err})", file=str(path)) from err
    ids = [eos] if isinstance(eos, int) else eos
    if eos is not None and not (
        isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        raise CheckpointError(f"{path}: eos_token_id must be a token id or a list of them")
    return eos


@click.command()
@_TARGET
@click.option("--prompt", required=True, help="the user message (or plain text with --no-chat)")
@click.option("--max-new-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("--chat/--no-chat", default=None, help="apply the chat template (default: if any)")
@click.option(
    "--dtype", default=None,
    help="f32, bf16 or f16 (default: the checkpoint's); PyTorch also q8_0, q4_0, q4_k "
    "(weights kept packed, weight-only quantized linears)",
)  # fmt: skip
@BACKEND_OPTION
@MODE_OPTION
@NUMERICS_OPTION
@_CHECKPOINT
@_REVISION
@click.option(
    "--tensor-parallel", type=click.IntRange(1), default=None,
    help="split the model over N ranks, one process each: torchrun --nproc-per-node N "
    "-m linnet run ... (docs/parallel.md)",
)  # fmt: skip
@placement_flags
def run(
    target, prompt, max_new_tokens, chat, dtype, backend, mode, numerics, checkpoint, revision,
    tensor_parallel, devices, split, device_budget,
) -> None:  # fmt: skip
    """Generate text greedily with Linnet, streaming tokens as they come."""
    from linnet.parity import encode_prompts

    numerics = resolve_numerics(numerics, backend, mode)
    found = _locate(target, checkpoint, revision)
    tokenizer, chat = open_tokenizer(found, chat)
    ids = encode_prompts(tokenizer, [prompt], chat)[0]
    model, load_s = load_model(
        found.checkpoint, backend=backend, mode=mode, dtype=dtype,
        positions=ids.shape[-1] + max_new_tokens, tensor_parallel=tensor_parallel,
        placement=placement_options(devices, split, device_budget), numerics=numerics,
        entries=["decode"],  # all that generation runs
    )  # fmt: skip
    if getattr(model, "placement", None) is not None:
        click.echo(model.placement.describe(), err=True)
    quiet = getattr(model, "rank", 0) != 0  # tensor parallel: rank 0 prints
    stream = TextStream(tokenizer, out=open(os.devnull, "w") if quiet else None)
    eos = eos_ids(found.folder, tokenizer)
    timing = generate_streamed(model, ids, max_new_tokens, eos=eos, stream=stream, load_s=load_s)
    stream.out.write("\n")
    stream.out.flush()
    if not quiet:
        click.echo(timing.report(), err=True)


def open_tokenizer(found, chat: bool | None):
    """The checkpoint checked by Linnet, then its tokenizer; `chat` resolved (the entry's
    choice, else whether the tokenizer has a template). Exits 2 for a chat without one."""
    from linnet.parity import load_tokenizer

    _check_checkpoint(found.checkpoint)
    tokenizer = load_tokenizer(found.folder, found.gguf.name if found.gguf else None, light=True)
    if chat is None:
        chat = found.entry.chat if found.entry else bool(tokenizer.chat_template)
    if chat and not tokenizer.chat_template:
        click.echo(f"error: {found.folder} has no chat template; use --no-chat", err=True)
        sys.exit(2)
    return tokenizer, chat


@click.command()
@_TARGET
@click.option(
    "--backend", type=click.Choice(["torch", "jax", "onnx"]), default="torch", show_default=True
)
@click.option("--dtype", type=click.Choice(["f32", "bf16"]), default="f32", show_default=True)
@click.option(
    "--prompt", "prompts", multiple=True, help="a prompt (repeatable; default: the entry's)"
)
@click.option("--results", default=None, help="where records go (default results/parity)")
@mode_option("interpret")
@_CHECKPOINT
@_REVISION
def parity(target, backend, dtype, prompts, results, mode, checkpoint, revision) -> None:
    """Compare Linnet with transformers on the same weights and dtype; exit 1 past tolerance."""
    from linnet.parity import format_table, run_gate, write_record

    found = _locate(target, checkpoint, revision)
    _check_checkpoint(found.checkpoint)
    if found.entry is None:
        click.echo(
            f"note: {found.folder} matches no zoo entry; using the default prompts and tolerances",
            err=True,
        )
    if mode is not None and backend != "torch":
        raise click.UsageError(f"--mode {mode} is PyTorch's; --backend {backend} has one mode")
    report = run_gate(
        found.checkpoint, entry=found.entry, backend=backend, dtype=dtype,
        prompts=list(prompts), mode=mode,
    )  # fmt: skip
    report.repo = found.repo or report.repo
    report.revision, report.commit = found.revision, found.commit
    click.echo(format_table(report))
    click.echo(f"record: {write_record(report, results)}")
    if not report.passed:
        sys.exit(1)
