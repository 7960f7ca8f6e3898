"""Linnet's f32 GEMV (linnet/backends/torch/kernels/f32_gemv.cpp): under numerics="fast",
f32 linears of at most `kernels.F32_GEMV_ROWS` rows where the kernels were built (AVX512F,
or AVX2 with FMA) and take AMD's choices (kernels/cpu_tuning.h); torch's F.linear
everywhere else. Against exact (f64) sums within f32 summation error; both choices forced
on this machine, and the AVX2 build too on an AVX-512 one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linnet.backends.torch import kernels, prelude
from tests.backends.avx2_build import avx512f, run_avx2_build


def _offered(amd_tuning: int) -> bool:
    return bool(amd_tuning) and kernels.cpu_supported()  # AVX2 with FMA at least


def _bound(x, w, b, exact):
    """gamma_(K+1) sum |x||w| (+|b|): f32 sums of exact f32 products, any order."""
    n, u = x.shape[-1] + 1, 2.0**-24
    magnitude = x.double().abs() @ w.double().abs().t()
    if b is not None:
        magnitude = magnitude + b.double().abs()
    return n * u / (1 - n * u) * magnitude


def test_op_offered_exactly_where_it_runs(amd_tuning, monkeypatch):
    w, x = torch.randn(8, 64), torch.randn(1, 64)
    assert (kernels.f32_linear_op(x, w) is not None) == _offered(amd_tuning)
    assert kernels.f32_linear_op(x.bfloat16(), w.bfloat16()) is None
    assert kernels.f32_linear_op(x[:, :40], torch.randn(8, 40)) is None  # 40: not whole 16s
    assert kernels.f32_linear_op(x, torch.randn(64, 8).t()) is None  # column-major
    monkeypatch.setenv("LINNET_KERNELS", "0")
    assert kernels.f32_linear_op(x, w) is None


@pytest.mark.parametrize(
    "rows,cols,batch", [(97, 576, 1), (5, 64, 3), (1536, 96, 2), (13, 1536, 4), (7, 16, 1)]
)
def test_linear_fast_matches_exact_sums(rows, cols, batch, amd_tuning, monkeypatch):
    """576 columns: nine passes of the four FMA chains (64 each); 96: one pass and two
    16-element tails; 16: a tail alone."""
    calls = []
    offered = kernels.f32_linear_op
    monkeypatch.setattr(kernels, "f32_linear_op", lambda *a: calls.append(1) or offered(*a))
    w, x, b = (torch.randn(s) for s in ((rows, cols), (batch, cols), (rows,)))
    x[0, 3] = 0.0
    for bias in (None, b):
        got = prelude.linear_fast(x, w, bias)
        exact = x.double() @ w.double().t() + (0 if bias is None else bias.double())
        assert got.dtype == torch.float32 and got.shape == exact.shape
        ok = (got.double() - exact).abs() <= _bound(x, w, bias, exact)  # NaN fails
        assert ok.all(), (got.double() - exact).abs().max()
    assert len(calls) == 2
    if not _offered(amd_tuning):  # torch's linear, bit for bit
        assert torch.equal(prelude.linear_fast(x, w, b), F.linear(x, w, b))


def test_more_rows_or_gradients_keep_torchs_linear(amd_tuning, monkeypatch):
    """Past `kernels.F32_GEMV_ROWS` rows GEMM pays, and the op has no backward: F.linear."""
    monkeypatch.setattr(kernels, "f32_linear_op", lambda *a: pytest.fail("offered"))
    w = torch.randn(24, 64)
    x = torch.randn(kernels.F32_GEMV_ROWS + 1, 64)
    assert torch.equal(prelude.linear_fast(x, w), F.linear(x, w))
    trained = w.clone().requires_grad_()
    prelude.linear_fast(x[:1], trained).sum().backward()
    assert torch.equal(trained.grad, x[:1].expand(24, 64))


def test_a_decoder_step_on_either_choice(tiny_checkpoint, amd_tuning, monkeypatch):
    """A tiny Llama's fast generated runner: the f32 GEMV where offered (its weights then
    held row-major), else torch's linears; transformers' greedy tokens either way."""
    import linnet.torch as lt
    from tests.tiny_decoders import probe_ids, reference_greedy

    ran = []
    offered = kernels.f32_linear_op
    monkeypatch.setattr(kernels, "f32_linear_op", lambda *a: ran.append(offered(*a)) or ran[-1])
    folder = tiny_checkpoint("llama", "base")
    model = lt.load(folder, dtype="f32", mode="generated", numerics="fast")
    ids = probe_ids(model.config["vocab"])[:1]
    assert model.generate(ids, 8).tolist() == reference_greedy(folder, ids, 8).tolist()
    assert ran and all((op is not None) == _offered(amd_tuning) for op in ran)


_AVX2_SCRIPT = """
for rows, cols, batch in ((97, 576, 1), (13, 1536, 4), (5, 40 * 16, 3), (7, 16, 1)):
    w, x, b = torch.randn(rows, cols), torch.randn(batch, cols), torch.randn(rows)
    got = ops.f32_linear(x, w, b).double()
    exact = x.double() @ w.double().t() + b.double()
    n, u = cols + 1, 2.0**-24
    bound = n * u / (1 - n * u) * (x.double().abs() @ w.double().abs().t() + b.double().abs())
    assert ((got - exact).abs() <= bound).all(), (rows, cols, (got - exact).abs().max())
print(ops.f32_gemv_lanes(), ops.f32_gemv_native())
"""


@pytest.mark.skipif(not avx512f(), reason="the AVX2 build is tested beside an AVX-512 one")
def test_the_avx2_build_matches_exact_sums(tmp_path):
    """An AMD CPU without AVX-512 (Zen 2, 3) runs the 8-lane chains: f32_gemv.cpp built
    alone with AVX2 code (`avx2_build`), the op's 8-lane answer and exact sums (576
    columns: 18 passes of 32; 640: 20; 16: two 8-element tails)."""
    out = run_avx2_build("f32_gemv.cpp", _AVX2_SCRIPT, tmp_path)
    assert out.split() == ["8", "True"]
    native = kernels.load()
    assert native is None or native.f32_gemv_lanes() == 16  # this CPU's own build: AVX-512
