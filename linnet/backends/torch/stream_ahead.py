"""Decode steps on the calling thread and a helper thread of Linnet's own, which reads
the weights ahead whenever it is not sharing a linear (kernels/stream_ahead.h;
docs/torch.md, "Session 25" and "Session 26").

What is not a linear (norms, attention, the step's Python) runs on one thread either way;
splitting each linear over torch's threads left the memory idle through that serial part.
Under `one_core_step()` torch is set to one thread for the step (so no op wakes torch's
other thread onto the helper's core); Linnet's decode linears tell the helper which weight
they start and hand it part of their rows (`parallel_rows`); between linears it reads the
bytes that come next into the shared L3. SmolLM2-135M, the Zen 4 EPYC: see docs/torch.md.

It applies where it can help and nothing else changes: a one-token step of at most
`MAX_ROWS` rows, torch at `THREADS` threads, Linnet's C++ kernels loaded, a model whose
matrices all go through those kernels (`worth_streaming`), and LINNET_STREAM_AHEAD not 0
(MB read ahead, default `DEFAULT_MB`).
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch

from linnet.backends.torch import kernels
from linnet.backends.torch.packed_tensor import PackedTensor
from linnet.backends.torch.quantized import PackedWeight

DEFAULT_MB = 2  # read ahead (SmolLM2, one model, two threads: q8_0 best at 2, bf16 at 2-4)
MAX_ROWS = kernels.F32_GEMV_ROWS  # a step's rows up to which its linears are GEMVs
# The step's thread and one helper: measured on 2 cores only. With more threads each linear
# splits over torch's threads as before (one helper would leave the other cores idle).
THREADS = 2


def budget_bytes() -> int:
    """LINNET_STREAM_AHEAD in bytes (MB given; 0, off, false, no: none)."""
    raw = os.environ.get("LINNET_STREAM_AHEAD", str(DEFAULT_MB)).strip().lower()
    if raw in kernels.OFF_VALUES:
        return 0
    try:
        mb = float(raw)
    except ValueError:
        warnings.warn(
            f"LINNET_STREAM_AHEAD={raw!r} is not a number of MB: {DEFAULT_MB} taken", stacklevel=2
        )
        return DEFAULT_MB << 20
    return max(0, int(mb * (1 << 20)))


def worth_streaming(module: torch.nn.Module) -> bool:
    """Whether every matrix of the module is read by one of Linnet's decode kernels, which
    note their weights for the helper and share their rows with it: bf16 where the bf16
    GEMV builds, f32 where f32_gemv.cpp is preferred (AMD's choices), packed weights the
    kernels take. Torch's own linears (f32 elsewhere, MXFP4 experts) split over torch's
    threads, and under a one-core step would run on one."""
    if kernels.load() is None:
        return False
    bf16_ours = kernels.bf16_gemv_available() or kernels.bf16_columns_preferred()
    for t in module.parameters():
        if isinstance(t, PackedWeight):
            worth = t.kernel_ready
        elif isinstance(t, PackedTensor):  # MXFP4 experts: torch's threads split them
            worth = False
        elif t.dim() != 2:
            worth = True
        elif t.dtype == torch.bfloat16:
            worth = bf16_ours
        else:  # f32 (or other): the decode step's own choice for this weight, asked once
            probe = t.new_empty(1, t.shape[1], dtype=torch.float32)
            worth = kernels.f32_linear_op(probe, t) is not None
        if not worth:
            return False
    return True


def one_token_step(inputs) -> bool:
    """Token ids (B, 1) with B <= MAX_ROWS: a decode step, not a prompt."""
    ids = inputs[0] if inputs else None
    return (
        isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[1] == 1
        and ids.shape[0] <= MAX_ROWS
    )  # fmt: skip


@contextlib.contextmanager
def one_core_step():
    """Run the block (one decode step) on this thread, the helper sharing its linears and
    reading ahead, where torch has `THREADS` threads and the kernels load; else as it is."""
    threads = torch.get_num_threads()
    ops = kernels.load() if threads == THREADS else None
    budget = budget_bytes() if ops is not None else 0
    if budget <= 0:
        yield
        return
    ops.stream_ahead(budget)  # every step: what the environment says now (~1 us)
    torch.set_num_threads(1)
    ops.stream_ahead_step(True)
    try:
        yield
    finally:
        ops.stream_ahead_step(False)
        torch.set_num_threads(threads)
