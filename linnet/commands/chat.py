"""`linnet chat NAME`: a conversation in the terminal, with the checkpoint's chat template,
streamed answers and the history of the conversation in every prompt.

Each line read from standard input is a user turn; `/reset` forgets the history, `/exit` or
end of input ends the chat. When the history no longer fits the cache, the oldest turns are
dropped (the system message stays).
"""

from __future__ import annotations

import sys

import click

from linnet.commands.run import (
    _CHECKPOINT,
    _REVISION,
    _TARGET,
    TextStream,
    _locate,
    eos_ids,
    open_tokenizer,
)
from linnet.commands.session import (
    BACKEND_OPTION,
    MODE_OPTION,
    NUMERICS_OPTION,
    generate_streamed,
    load_model,
    resolve_numerics,
)
from linnet.parity.prompts import chat_ids


@click.command()
@_TARGET
@click.option("--system", default=None, help="a system message that starts the conversation")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--context", type=click.IntRange(16), default=2048, show_default=True,
              help="tokens the cache holds: history plus the answer")  # fmt: skip
@click.option("--dtype", default=None, help="f32, bf16 or f16 (default: the checkpoint's)")
@BACKEND_OPTION
@MODE_OPTION
@NUMERICS_OPTION
@_CHECKPOINT
@_REVISION
def chat(
    target, system, max_new_tokens, context, dtype, backend, mode, numerics, checkpoint, revision
):  # fmt: skip
    """Chat with a model: one user turn per line of input, answers streamed."""
    numerics = resolve_numerics(numerics, backend, mode)
    found = _locate(target, checkpoint, revision)
    tokenizer, _ = open_tokenizer(found, chat=True)
    model, load_s = load_model(
        found.checkpoint, backend=backend, mode=mode, dtype=dtype, positions=context,
        numerics=numerics, entries=["decode"],
    )  # fmt: skip
    eos = eos_ids(found.folder, tokenizer)
    history = [{"role": "system", "content": system}] if system else []
    interactive = sys.stdin.isatty()
    while (line := _read_turn(interactive)) is not None:
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            del history[1 if system else 0 :]
            continue
        history.append({"role": "user", "content": line})
        ids = _fit(tokenizer, history, context - max_new_tokens, bool(system))
        if ids is None:
            click.echo(f"error: that message does not fit --context {context}", err=True)
            history.pop()
            continue
        stream = TextStream(tokenizer)
        timing = generate_streamed(model, ids, max_new_tokens, eos=eos, stream=stream,
                                   load_s=load_s)  # fmt: skip
        click.echo("")
        history.append({"role": "assistant", "content": stream.text()})
        if interactive:
            click.echo(timing.report(), err=True)
        load_s = 0.0


def _read_turn(interactive: bool) -> str | None:
    """The next non-empty line of input (a `> ` prompt on a terminal), None at the end."""
    while True:
        if interactive:
            click.echo("> ", nl=False, err=True)
        line = sys.stdin.readline()
        if not line:
            return None
        if line.strip():
            return line.strip()


def _fit(tokenizer, history: list[dict], budget: int, keep_first: bool):
    """The templated history as [1, S] ids, dropping the oldest exchanges until S fits
    (None when the last message alone does not)."""
    import torch

    while True:
        ids = chat_ids(tokenizer, history)
        first = 1 if keep_first else 0
        if len(ids) <= budget or len(history) - first <= 1:
            break
        del history[first : first + 2]  # the oldest user turn and its answer
    if len(ids) > budget:
        return None
    return torch.tensor([list(ids)], dtype=torch.long)
