"""What the server serves: a checkpoint's rows, its tokenizer and its end-of-sequence ids.

engine = open_engine("smollm2-135m-instruct", rows=8, backend="torch")
engine.encode_prompt("Hello")        # token ids (ApiError 400 for ids outside the vocab)
engine.encode_chat(messages)          # the checkpoint's chat template, with the generation prompt
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

from linnet.serve.protocol import ApiError
from linnet.serve.serial_rows import RowDecoder, row_decoder


@dataclass
class Engine:
    rows: RowDecoder
    tokenizer: object  # transformers' tokenizer of the checkpoint
    eos: frozenset[int]
    name: str  # what requests must name in `model`
    vocab: int
    # transformers' fast tokenizers are not to be used from two threads at once
    lock: threading.Lock = field(default_factory=threading.Lock)

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            with self.lock:
                return list(self.tokenizer(prompt)["input_ids"])
        bad = [t for t in prompt if t >= self.vocab]
        if bad:
            raise ApiError(
                400,
                f"token id {bad[0]} is outside the vocabulary [0, {self.vocab})",
                param="prompt",
            )
        return list(prompt)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(400, f"{self.name} has no chat template: use /v1/completions")
        with self.lock:
            try:
                out = self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=True
                )
            except Exception as err:  # noqa: BLE001 - a template's own refusal (roles, order)
                raise ApiError(400, f"the chat template refused the messages: {err}") from err
        return list(out["input_ids"])

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)


def open_engine(
    target: str,
    *,
    rows: int = 8,
    positions: int | None = None,
    backend: str = "torch",
    mode: str | None = None,
    dtype: str | None = None,
    checkpoint=None,
    revision: str | None = None,
    name: str | None = None,
    threads: int | None = None,
    tensor_parallel: int | None = None,
) -> Engine:
    """Locate `target` (a zoo name, an HF repo id, a folder or a .gguf), check the checkpoint,
    load its tokenizer and the model (as `linnet run` does), and give it `rows` cache rows of
    `positions` tokens (default: the model's cache, its context capped at 4096). `threads`:
    torch's intra-op threads for this process (None leaves torch's default);
    `tensor_parallel`: this torchrun rank's share (linnet/shard/tp_rows.py mirrors the rows)."""
    from linnet.commands.run import eos_ids
    from linnet.commands.session import load_model
    from linnet.parity import load_tokenizer
    from linnet.targets import locate
    from linnet.weights.checkpoint import open_checkpoint

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    found = locate(target, checkpoint=checkpoint, revision=revision)
    opened = open_checkpoint(found.checkpoint)  # Linnet's checks before transformers reads
    tokenizer = load_tokenizer(found.folder, found.gguf.name if found.gguf else None)
    # native rows keep one cache slot back (idle rows write there): a row of `positions`
    # tokens needs a cache of positions + 1
    cache = None if positions is None else positions + 1
    dtype = serving_dtype(dtype, backend, opened.config["act"], found.gguf is not None)
    fast = _fast_rows(backend, mode, found.gguf is not None, tensor_parallel)
    with _every_huge_page(backend):
        model, _ = load_model(
            found.checkpoint, backend=backend, mode=mode, dtype=dtype, positions=cache,
            tensor_parallel=tensor_parallel, numerics="fast" if fast else "equivalent",
        )  # fmt: skip
    return Engine(
        rows=row_decoder(model, rows, positions),
        tokenizer=tokenizer,
        eos=frozenset(eos_ids(found.folder, tokenizer)),
        name=name or target,
        vocab=int(model.config["vocab"]),
    )


def _every_huge_page(backend: str):
    """A server loads once and decodes for hours: on PyTorch its weights wait for every
    2 MB page, however slowly the kernel gives them (huge_pages.py: `linnet run` stops at
    the first slow one). LINNET_HUGE_PAGES, where set, still decides."""
    if backend != "torch":
        return contextlib.nullcontext()
    from linnet.backends.torch.huge_pages import every_page

    return every_page()


def serving_dtype(dtype: str | None, backend: str, stored: str, gguf: bool) -> str | None:
    """What the rows compute in: `dtype` when asked; else the checkpoint's, but f32 for a
    bf16/f16 HF checkpoint on PyTorch where the CPU has no bf16/f16 dot product and no
    Linnet GEMV for it (f16 always; bf16 where the kernels cannot load): there every
    low-precision matmul widens its tiles to f32 on each use, and the f32 step and prefill
    took less CPU (docs/serve.md, "Session 12: AVX2 CPU"). With the bf16 GEMV (AVX2's
    widening FMAs read half the bytes) a bf16 row step of 1 to 8 rows is faster than f32's
    (docs/serve.md, "Session 13"). A GGUF's packed weights stay packed."""
    if dtype is not None or backend != "torch" or gguf or stored not in ("bf16", "f16"):
        return dtype
    import torch

    from linnet.backends.torch import kernels
    from linnet.backends.torch.prelude import _LOWP_NATIVE

    if _LOWP_NATIVE[torch.bfloat16 if stored == "bf16" else torch.float16]:
        return None
    return None if stored == "bf16" and kernels.bf16_gemv_available() else "f32"


def _fast_rows(backend: str, mode: str | None, gguf: bool, tensor_parallel) -> bool:
    """Whether the rows run numerics "fast" (decode_ops.cpp's per-row attention, norms and
    rope; SDPA for a prefill chunk): PyTorch's generated code (compiled or not) of an HF
    checkpoint in one process. It took 41% less CPU a 32-row step and 11% less a prompt
    token than "equivalent" here, with transformers' greedy tokens (docs/serve.md,
    "Session 12: AVX2 CPU"). GGUF's packed weights would take int8 activations there."""
    from linnet.commands.session import DEFAULT_MODE

    return (
        backend == "torch"
        and (mode or DEFAULT_MODE) in ("generated", "compile")
        and not (gguf or tensor_parallel)
    )
