"""What `linnet run` and `linnet chat` share: a model on the backend and mode asked for, and
one streamed generation timed the way a user feels it.

    model, load_s = load_model(checkpoint, backend="torch", mode=None, dtype=None, positions=512)
    timing = generate_streamed(model, ids, 64, eos=[2], stream=TextStream(tokenizer))
    timing.report()     # "load 1.2 s · first token 0.09 s · 63 tokens in 2.1 s, 30.0 tokens/s"
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import click

BACKENDS = ("torch", "jax", "onnx")
MODES = ("interpret", "generated", "compile")
# The fastest PyTorch path that needs no long compile (docs/torch.md has the figures).
DEFAULT_MODE = "generated"

BACKEND_OPTION = click.option(
    "--backend", type=click.Choice(BACKENDS), default="torch", show_default=True,
    help="torch, jax (XLA) or onnx (onnxruntime; exports the checkpoint once, cached)",
)  # fmt: skip


def mode_option(default: str):
    """PyTorch's --mode; `default` is what leaving it out means for this command."""
    return click.option(
        "--mode", type=click.Choice(MODES), default=None,
        help=f"PyTorch only: interpret (Core IR per call), generated or compile [default: "
        f"{default}]",
    )  # fmt: skip


MODE_OPTION = mode_option(DEFAULT_MODE)
NUMERICS_OPTION = click.option(
    "--numerics", type=click.Choice(("fast", "equivalent")), default=None,
    help="PyTorch only: fast (the decode step's fused C++ ops; packed weights and GPT-OSS's "
    "MXFP4 experts with x rounded to int8) or equivalent (the reference decompositions op "
    "for op) [default: fast; equivalent with --mode interpret]",
)  # fmt: skip


def resolve_numerics(numerics: str | None, backend: str, mode: str | None) -> str:
    """--numerics as load_model takes it: PyTorch's default is fast, except the interpreter
    (it runs the reference decompositions only); other backends have no such choice."""
    if numerics is not None and backend != "torch":
        raise click.UsageError(f"--numerics is PyTorch's; --backend {backend} has one")
    if numerics is None:
        return "equivalent" if mode == "interpret" else "fast"
    if numerics == "fast" and mode == "interpret":
        raise click.UsageError(
            "--mode interpret runs the reference decompositions: --numerics equivalent"
        )
    return numerics


def _devices(ctx, param, value):
    return None if value is None else [d.strip() for d in value.split(",") if d.strip()]


def _split(ctx, param, value):
    try:
        return None if value is None else [int(n) for n in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r}: layer counts per device, e.g. 12,18") from None


def placement_flags(command):
    """--devices, --split and --device-budget (layers across devices, host offload)."""
    options = [
        click.option(
            "--devices", default=None, callback=_devices,
            help="split the layers over these devices in order, e.g. cuda:0,cuda:1 "
            "(PyTorch, interpret or generated; docs/parallel.md)",
        ),
        click.option(
            "--split", default=None, callback=_split,
            help="layers per device with --devices, e.g. 12,18 (default: balanced by bytes)",
        ),
        click.option(
            "--device-budget", default=None,
            help="bytes each device may hold, e.g. 8GiB: the layers beyond stay in host "
            "memory and are copied in ahead of use",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def placement_options(devices, split, budget) -> dict | None:
    """linnet.torch.load's placement keywords, or None when none was given."""
    if devices is None and split is None and budget is None:
        return None
    if split is not None and devices is None:
        raise click.UsageError("--split needs --devices")
    return dict(devices=devices, split=split, max_device_bytes=budget)


def load_model(
    checkpoint, *, backend: str, mode: str | None, dtype, positions: int, tensor_parallel=None,
    placement: dict | None = None, numerics: str = "equivalent", entries=None,
):  # fmt: skip
    """A decoder on `backend`, and the seconds loading took; `positions`: the cache length;
    `tensor_parallel`: this torchrun rank's share of N (PyTorch, docs/parallel.md);
    `numerics`: PyTorch's ("fast" takes the decode-step ops, docs/torch.md); `entries`: only
    those lowered (PyTorch, a whole model: `linnet run` and `chat` take ["decode"], which
    is ~1 s less to load)."""
    if tensor_parallel is not None and backend not in ("torch", "jax"):
        raise click.UsageError("--tensor-parallel runs on --backend torch or jax")
    if placement is not None and backend != "torch":
        raise click.UsageError("--devices and --device-budget run on --backend torch")
    if mode is not None and backend != "torch":
        raise click.UsageError(f"--mode {mode} is PyTorch's; --backend {backend} has one mode")
    t0 = time.perf_counter()
    if backend == "torch":
        import linnet.torch

        whole = tensor_parallel in (None, 1) and placement is None
        model = linnet.torch.load(
            checkpoint, dtype=dtype, mode=mode or DEFAULT_MODE, max_positions=positions,
            tensor_parallel=tensor_parallel, numerics=numerics, **(placement or {}),
            entries=entries if whole else None,
        )  # fmt: skip
    elif backend == "jax":
        import linnet.jax

        if tensor_parallel not in (None, 1):  # a mesh of that many devices, one process
            from linnet.shard.jax_rows import load_on_mesh

            model = load_on_mesh(checkpoint, tensor_parallel, dtype=dtype, max_positions=positions)
        else:
            model = linnet.jax.load(checkpoint, dtype=dtype, max_positions=positions)
    else:
        if dtype is not None:
            raise click.UsageError("--dtype: an ONNX export keeps the checkpoint's dtype")
        import linnet.onnx

        model = linnet.onnx.load(checkpoint)
    return model, time.perf_counter() - t0


@dataclass
class Timing:
    load_s: float
    first_token_s: float  # from the call to the first token: prefill and one pick
    tokens: int
    total_s: float

    def report(self) -> str:
        rest = self.total_s - self.first_token_s
        speed = f", {(self.tokens - 1) / rest:.1f} tokens/s after it" if self.tokens > 1 else ""
        return (
            f"(load {self.load_s:.1f} s; first token {self.first_token_s:.2f} s; "
            f"{self.tokens} tokens in {self.total_s:.1f} s{speed})"
        )


def generate_streamed(model, ids, max_new_tokens: int, *, eos, stream, load_s: float) -> Timing:
    """Greedy tokens after `ids` ([1, S] token ids), each passed to `stream` as it comes."""
    import numpy as np

    first: list[float] = []
    t0 = time.perf_counter()

    def on_token(token) -> None:
        if not first:
            first.append(time.perf_counter() - t0)
        stream(token)

    model.generate(np.asarray(ids), max_new_tokens, eos_token_id=eos, on_token=on_token)
    total = time.perf_counter() - t0
    return Timing(load_s, first[0] if first else total, len(stream.ids), total)
