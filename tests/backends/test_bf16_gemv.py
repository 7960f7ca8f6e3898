"""Linnet's bf16 GEMV (linnet/backends/torch/kernels/bf16_gemv.cpp; docs/torch.md
"Quantized weights"): used for bf16 linears of at most a few rows where the kernels run
(AVX512-BF16's dot products, or AVX2's widening FMAs), refused elsewhere; against exact
(f64) sums within f32 summation error and one bf16 rounding."""

from __future__ import annotations

import pytest
import torch

from linnet.backends.torch import kernels, prelude
from tests.backends.avx2_build import cpu_flags, run_avx2_build


def _native() -> bool:
    """x86 with AVX2 and FMA at least (an AVX-512 CPU without BF16 takes the AVX2 path)."""
    return kernels.cpu_supported()


def _bound(x, w, b, exact):
    """gamma_(K+1) sum |x||w| (+|b|) for the f32 sums, then one rounding to bf16 (unit
    roundoff 2^-8) of a value that far from the exact one."""
    n, u = x.shape[-1] + 1, 2.0**-24
    magnitude = x.double().abs() @ w.double().abs().t() + b.double().abs()
    f32 = n * u / (1 - n * u) * magnitude
    return f32 + 2.0**-8 * (exact.abs() + f32)


def test_op_offered_exactly_where_the_kernels_run():
    w, x = torch.randn(8, 64).bfloat16(), torch.randn(1, 64).bfloat16()
    assert (kernels.bf16_linear_op(x, w) is not None) == _native()
    assert kernels.bf16_linear_op(x.float(), w.float()) is None
    assert kernels.bf16_linear_op(x, torch.randn(64, 8).bfloat16().t()) is None  # strided


@pytest.mark.parametrize(
    "rows,cols,batch", [(97, 576, 1), (5, 64, 3), (1536, 96, 2), (13, 128, 8), (7, 64, 5)]
)
def test_linear_lowp_matches_exact_sums(rows, cols, batch, amd_tuning, monkeypatch):
    """97 rows: tiles of 4 and a ragged end; 96 columns: three 32-blocks; batches of 1 to
    8 (AVX2 takes x rows two at a time: odd batches end on one); AVX512-BF16's rows side by
    side and in sequence (kernels/cpu_tuning.h)."""
    calls = []
    offered = kernels.bf16_linear_op
    monkeypatch.setattr(kernels, "bf16_linear_op", lambda *a: calls.append(1) or offered(*a))
    w, x, b = (torch.randn(s).bfloat16() for s in ((rows, cols), (batch, cols), (rows,)))
    x[0, 3] = 0.0  # an exact zero among the products
    got = prelude.linear_lowp(x, w, b)
    exact = x.double() @ w.double().t() + b.double()
    assert got.dtype == torch.bfloat16 and got.shape == exact.shape
    ok = (got.double() - exact).abs() <= _bound(x, w, b, exact)  # NaN fails
    assert ok.all(), (got.double() - exact).abs().max()
    assert calls == [1]


def _avx512_bf16() -> bool:
    return "avx512_bf16" in cpu_flags()


def test_rows_in_sequence_give_the_same_bits():
    """kernels/cpu_tuning.h: with AVX512-BF16, AMD's walk (each row front to back) sums each
    row in the same order as the side-by-side tiles, so the two give the same bits (97
    rows: a ragged end). The AVX2 build's AMD walk sums in four chains, another order
    (`test_the_avx2_build_matches_exact_sums`)."""
    if not kernels.cpu_supported() or not _avx512_bf16():
        ones = torch.ones(1, 64).bfloat16(), torch.ones(4, 64).bfloat16()
        assert (kernels.bf16_linear_op(*ones) is None) == (not kernels.cpu_supported())
        return
    w, x, b = (torch.randn(s).bfloat16() for s in ((97, 576), (3, 576), (97,)))
    before = kernels.force_amd_tuning(0)
    try:
        tiles = kernels.step_ops().bf16_linear(x, w, b)
        kernels.force_amd_tuning(1)
        rows = kernels.step_ops().bf16_linear(x, w, b)
    finally:
        kernels.force_amd_tuning(before)
    assert torch.equal(tiles, rows)


def test_kernels_off_keeps_torchs_linear(monkeypatch):
    """LINNET_KERNELS=0: no op offered, linear_lowp is torch's own F.linear, bit for bit."""
    monkeypatch.setenv("LINNET_KERNELS", "0")
    w, x = torch.randn(40, 128).bfloat16(), torch.randn(1, 128).bfloat16()
    assert kernels.bf16_linear_op(x, w) is None
    torch.testing.assert_close(
        prelude.linear_lowp(x, w), torch.nn.functional.linear(x, w), rtol=0, atol=0
    )


_AVX2_SCRIPT = """
for amd in (0, 1, 0):
    ops.amd_tuning(amd)
    for rows, cols, batch in ((97, 576, 1), (13, 1536, 3), (5, 96, 2), (7, 32, 1)):
        w, x, b = (torch.randn(s).bfloat16() for s in ((rows, cols), (batch, cols), (rows,)))
        got = ops.bf16_linear(x, w, b).double()
        exact = x.double() @ w.double().t() + b.double()
        n, u = cols + 1, 2.0**-24
        mag = x.double().abs() @ w.double().abs().t() + b.double().abs()
        f32 = n * u / (1 - n * u) * mag
        bound = f32 + 2.0**-8 * (exact.abs() + f32)
        assert ((got - exact).abs() <= bound).all(), (amd, rows, cols, (got - exact).abs().max())
print(ops.bf16_gemv_native(), ops.amd_tuned())
"""


@pytest.mark.skipif(not _avx512_bf16(), reason="the AVX2 build is tested beside an AVX-512 one")
def test_the_avx2_build_matches_exact_sums(tmp_path):
    """A CPU without AVX512-BF16 runs the AVX2 kernel: bf16_gemv.cpp built alone with AVX2
    code (`avx2_build`), both walks (the Xeon's tiles with prefetch; AMD's rows front to
    back in four chains) within the exact sums' bound (97 rows: tiles and a ragged end; 32
    columns: one pass of the four chains; batches of 1 to 3)."""
    out = run_avx2_build("bf16_gemv.cpp", _AVX2_SCRIPT, tmp_path)
    assert out.split() == ["True", "False"]
