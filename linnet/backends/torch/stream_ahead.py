"""Decode steps on one core with the weights streamed ahead on the other
(kernels/stream_ahead.h; docs/torch.md, "Session 25").

One thread reads a CPU decode step's weights about as fast as two, and what is not a
linear (norms, attention, the step's Python) runs on one thread either way; splitting each
linear over both cores left the memory idle through that serial part. Under
`one_core_step()` the step runs on the calling thread alone (torch set to one thread for
it, so no op wakes torch's other thread onto the helper's core), and Linnet's decode
linears tell the helper thread which weight they start; it reads the bytes that come next
into the shared L3. SmolLM2-135M's bf16 step, the Zen 4 EPYC: see docs/torch.md.

It applies where it can help and nothing else changes: a one-token step of at most
`MAX_ROWS` rows, at least two torch threads, Linnet's C++ kernels loaded, a model whose
matrices are bf16 or q8_0 (`worth_streaming`), and LINNET_STREAM_AHEAD not 0 (MB read
ahead, default `DEFAULT_MB`).
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
    """Whether the module's matrices are all of the kinds a streamed step was measured to
    read faster than a split one (SmolLM2, the Zen 4 EPYC, two threads, interleaved
    rounds; docs/torch.md, "Session 25"): bf16 where Linnet's bf16 GEMV builds (12.0 ms a
    step against 13.6 split) and q8_0 (7.8 against 9.6). Not f32: faster alone (22.4
    against 26.0) but slower beside the benchmark's other models (27.3 against 23.8), so
    not streamed until that is understood; not 4- and 5-bit codes, which one thread decodes
    slower than the memory streams them (q4_K_M 8.8 against 8.4, q4_0 7.8 against 7.7);
    not torch's linears (one thread would only slow them)."""
    if kernels.load() is None:
        return False
    bf16_ours = kernels.bf16_gemv_available() or kernels.bf16_columns_preferred()
    for t in module.parameters():
        if isinstance(t, PackedWeight):
            worth = t.kind == "q8_0"
        elif isinstance(t, PackedTensor):  # MXFP4 experts: their kernels note no weights
            worth = False
        else:
            worth = t.dim() != 2 or (t.dtype == torch.bfloat16 and bf16_ours)
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
    """Run the block (one decode step) on this thread with the helper reading ahead, where
    the machine gives torch two threads or more and the kernels load; else as it is."""
    threads = torch.get_num_threads()
    ops = kernels.load() if threads >= 2 else None
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
