"""Column-major bf16 linears (linnet/backends/torch/kernels/bf16_columns.cpp, runners.py's
`_column_major_wins`; docs/torch.md "Session 19"): where the CPU has no bf16 dot product the
generated runner holds bf16 linears as w^T and the columns kernel streams them. The kernel
is built on every AVX2 CPU, so these run on AVX-512 machines too; the layout rule is tested
by asking for it (`kernels.bf16_columns_preferred`)."""

from __future__ import annotations

import pytest
import torch

import linnet.torch as lt
from linnet.backends.torch import kernels, prelude
from tests.backends.test_bf16_gemv import _bound
from tests.tiny_decoders import build_tiny, probe_ids

needs_kernels = pytest.mark.skipif(
    not kernels.cpu_supported(), reason="the C++ kernels need an x86 CPU with AVX2 and FMA"
)


def _columns(w: torch.Tensor) -> torch.Tensor:
    """The same values held column-major (w^T contiguous)."""
    return w.t().contiguous().t()


def _is_columns(w: torch.Tensor) -> bool:
    return w.stride() == (1, w.shape[0])


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(
    "rows,cols,batch",
    [
        (96, 576, 1),
        (576, 1536, 3),
        (16, 5, 2),
        (32, 3, 1),
        (960, 7, 15),
        (4096, 64, 1),
        (16384, 13, 2),
    ],
)
def test_columns_op_matches_exact_sums(rows, cols, batch, threads):
    """Each case within f32 summation error and one bf16 rounding of the exact (f64) sums,
    with and without bias: 16-row blocks un-permuted (96 rows); k tails of 1-3 past the
    four-k passes (5, 7, 3 columns; 3 is a single share's whole range); batches 1-15;
    up to three threads each summing their own range of k (576 x 1536, 4096 x 64; 13
    columns over three threads: ranges of 8, 5 and none)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = _columns(torch.randn(rows, cols).bfloat16())
        x, b = torch.randn(batch, cols).bfloat16(), torch.randn(rows).bfloat16()
        x[0, 0] = 0.0  # an exact zero among the products
        op = kernels.bf16_linear_op(x, w)
        assert op is not None and op == kernels.load().bf16_linear_columns
        for bias in (b, None):
            got = op(x, w, bias)
            zero = torch.zeros(rows, dtype=torch.bfloat16)
            exact = x.double() @ w.double().t() + (zero if bias is None else bias).double()
            assert got.dtype == torch.bfloat16 and got.shape == (batch, rows)
            ok = (got.double() - exact).abs() <= _bound(x, w, zero if bias is None else bias, exact)
            assert ok.all(), (got.double() - exact).abs().max()
    finally:
        torch.set_num_threads(before)


@needs_kernels
def test_columns_op_rounds_and_propagates_like_torch():
    """Sums rounded to nearest even as c10::BFloat16 (ties: 1 + 2^-8 and 1 + 3 * 2^-8 are
    each exactly halfway), a NaN kept NaN, infinities kept."""
    w = _columns(torch.ones(16, 2, dtype=torch.bfloat16))
    ops = kernels.load()
    for pair in ([1.0, 2.0**-8], [1.0, 3 * 2.0**-8], [float("nan"), 1.0], [float("inf"), 1.0]):
        x = torch.tensor([pair], dtype=torch.float32)
        want = (x.sum(1, keepdim=True) * torch.ones(1, 16)).bfloat16()  # exact f32 sum, RNE
        got = ops.bf16_linear_columns(x.bfloat16(), w, None)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(
            got[~got.isnan()], want[~want.isnan()]
        ), (pair, got, want)


def test_layouts_offered_to_their_ops():
    """Row-major w whose rows are whole 32-blocks: the rows op; w^T contiguous with whole
    16-row blocks: the columns op; anything else (8 rows, a strided slice): neither."""
    x = torch.randn(1, 64).bfloat16()
    rows_w, cols_w = torch.randn(32, 64).bfloat16(), _columns(torch.randn(32, 64).bfloat16())
    ops = kernels.load()
    if ops is None:
        assert kernels.bf16_linear_op(x, cols_w) is None
        return
    assert kernels.bf16_linear_op(x, rows_w) == ops.bf16_linear
    assert kernels.bf16_linear_op(x, cols_w) == ops.bf16_linear_columns
    assert kernels.bf16_linear_op(x, _columns(torch.randn(8, 64).bfloat16())) is None
    assert kernels.bf16_linear_op(x, _columns(torch.randn(64, 64).bfloat16())[:32]) is None


def test_kernels_off_column_major_reads_without_a_copy(monkeypatch):
    """LINNET_KERNELS=0 after a load that held w column-major: `linear_lowp` reads it with
    torch.mv (torch's bf16 linear copies such a w on every call: 7x slower without a bf16
    dot product), within the bound of the exact sums, bias added after."""
    monkeypatch.setenv("LINNET_KERNELS", "0")
    monkeypatch.setitem(prelude._LOWP_NATIVE, torch.bfloat16, False)
    w = _columns(torch.randn(48, 64).bfloat16())
    x, b = torch.randn(3, 64).bfloat16(), torch.randn(48).bfloat16()
    got = prelude.linear_lowp(x, w, b)
    exact = x.double() @ w.double().t() + b.double()
    magnitude = x.double().abs() @ w.double().abs().t() + b.double().abs()
    bound = _bound(x, w, b, exact) + 2 * 2.0**-8 * magnitude  # the mv's rounding, then +b's
    assert ((got.double() - exact).abs() <= bound).all()
    assert prelude.linear_lowp(x[:0], w, b).shape == (0, 48)  # no rows: torch's linear


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return build_tiny("llama", "tied", tmp_path_factory.mktemp("bf16-columns"))


def _load(folder, monkeypatch, preferred: bool, mode="generated"):
    monkeypatch.setattr(kernels, "bf16_columns_preferred", lambda: preferred)
    return lt.load(folder, dtype="bf16", mode=mode, numerics="fast")


@needs_kernels
def test_generated_bf16_model_held_column_major_matches_rows(tied, monkeypatch):
    """Where preferred: every 2-D linear weight whose rows are whole 16-blocks (the fused
    qkv and gate/up, o, down, the tied head with its embedding) is held column-major,
    once; the decode linears run the columns op; logits within bf16's reach of the
    row-major model's (f32 sums of the same exact products in another order) and the same
    greedy tokens."""
    rows_model = _load(tied, monkeypatch, preferred=False)
    assert not any(_is_columns(p) for p in rows_model.runner.module.parameters() if p.dim() == 2)
    cols_model = _load(tied, monkeypatch, preferred=True)
    module = cols_model.runner.module
    weights = dict(module.named_parameters())
    read = {
        n for n in weights if n.split(".")[-1] in ("embed", "wq_wk_wv", "wo", "gate_up", "down")
    }
    assert len(read) == 9 and all(_is_columns(weights[n]) for n in read)
    parts = {n: weights[n.rsplit(".", 1)[0] + ".wq_wk_wv"] for n in weights if n.endswith(".wk")}
    for name, stack in parts.items():  # the stack's parts stay its rows (held once)
        assert (
            weights[name].stride() == stack.stride() and weights[name].data_ptr() > stack.data_ptr()
        )
    assert cols_model.params["embed"].data_ptr() == module.embed.data_ptr()

    prompt = probe_ids(module.embed.shape[0], (1, 8), seed=5)
    want = rows_model.decode(prompt, 0)
    taken = []
    offered = kernels.bf16_linear_op
    monkeypatch.setattr(
        kernels, "bf16_linear_op", lambda *a: taken.append(offered(*a)) or taken[-1]
    )
    got = cols_model.decode(prompt, 0)
    step = cols_model.decode(got.argmax(-1).view(1, 1), 8)
    monkeypatch.setattr(kernels, "bf16_linear_op", offered)
    # 9 linears a pass (qkv, o, gate/up, down in both layers; the head), for the 8-token
    # prompt (below the widened GEMM's 16 rows) and the step: the columns op each time
    columns_op = kernels.load().bf16_linear_columns
    assert step.shape == got.shape and len(taken) == 18 and all(op == columns_op for op in taken)
    scale = want.float().abs().max()
    assert (got.float() - want.float()).abs().max() <= 0.03 * scale
    cols_model.reset(), rows_model.reset()
    assert cols_model.generate(prompt, 6).tolist() == rows_model.generate(prompt, 6).tolist()


def test_compile_mode_keeps_bf16_row_major(tied, monkeypatch):
    """torch.compile never calls the kernels, and torch's bf16 linear copies a column-major
    w: under mode="compile" bf16 stays row-major even where the columns are preferred
    (nothing is compiled before the first call)."""
    model = _load(tied, monkeypatch, preferred=True, mode="compile")
    assert all(p.is_contiguous() for p in model.runner.module.parameters())


@needs_kernels
@pytest.mark.parametrize("built", [False, True])
def test_amd_choices_keep_bf16_row_major(amd_tuning, built, monkeypatch):
    """Column-major bf16 is preferred only where the kernels have no bf16 dot product (the
    build's answer, both here) and the Xeon's choices hold: under AMD's the AVX2 row tiles
    read faster."""
    kernels._built_answer("bf16_columns_preferred")  # cached once per process
    monkeypatch.setitem(kernels._loaded, "bf16_columns_preferred", built)
    assert kernels.bf16_columns_preferred() == (built and not amd_tuning)
