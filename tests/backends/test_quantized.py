"""Weight-only quantized linears (q8_0, q4_0, q4_K; docs/torch.md "Quantized weights").

- the packed layout dequantizes to exactly what the gguf package reads from the same
  ggml block bytes (the formats' outside reference);
- `F.linear` on a PackedWeight (the kernel, one block of rows at a time) equals the
  reference decomposition, dequantize-then-matmul, to f32 summation order;
- a GGUF export imported packed runs the model the dequantized import runs, in every
  mode, and an HF folder quantized on load runs the weights its GGUF export holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

import linnet.backends.torch.quantized as quantized
import linnet.gguf
import linnet.torch as lt
from linnet.backends.torch import kernels
from linnet.backends.torch.quantized import GROUP, PackedWeight
from linnet.quantize import ggml_bytes, to_packed_weight
from linnet.weights.gguf_packed import packed_from_ggml

KINDS = ("q8_0", "q4_0", "q4_k")
GGML = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K", "q5_0": "Q5_0"}
# q5_0 (q4_K's fallback type in llama.cpp): 5-bit where the AVX2 integer kernel runs, else
# in q8_0's layout (test_q5_0_layouts covers both); 96: an odd 3 groups
CASES = [(k, 512) for k in (*KINDS, "q5_0")] + [("q8_0", 96), ("q4_0", 96), ("q5_0", 96)]
IDS = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 4]])


def _packed(kind: str, rows=96, cols=512, seed=0) -> tuple[PackedWeight, np.ndarray]:
    """A random weight quantized as `kind`, and the ggml bytes it came from."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 1, (rows, 1))).astype(np.float32)
    raw = ggml_bytes(x, kind)
    return to_packed_weight(packed_from_ggml(raw, kind, x.shape), torch.float32), raw


def _gguf_dequantized(raw: np.ndarray, kind: str, shape) -> torch.Tensor:
    x = quants.dequantize(raw, GGMLQuantizationType[GGML[kind]]).reshape(tuple(shape))
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


@pytest.mark.parametrize("path", ["kernels", "pytorch"])
@pytest.mark.parametrize("kind,cols", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_packed_layout_dequantizes_as_gguf_does(kind, cols, path, monkeypatch):
    """Both ways of widening the codes: the kernels' one pass (4- and 5-bit rows, where they
    build) and the PyTorch ops."""
    if path == "pytorch":
        monkeypatch.setattr(PackedWeight, "_row_ops", lambda self, out: None)
    w, raw = _packed(kind, cols=cols)
    torch.testing.assert_close(
        w.dequantize(), _gguf_dequantized(raw, kind, w.shape), rtol=0, atol=0
    )


@pytest.mark.parametrize("cols", [512, 96])
def test_q5_0_layouts(cols):
    """q5_0 as 5 bits (nibbles, then each row's fifth bits) and in q8_0's layout: both
    dequantize to the gguf package's values, every path of both computes the same linear
    (kernel, f32 kernel, blocked PyTorch path), and the 5-bit one is what a load keeps where
    the integer kernel reads it."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, cols)).astype(np.float32)
    raw = ggml_bytes(x, "q5_0")
    five = packed_from_ggml(raw, "q5_0", x.shape)
    want = _gguf_dequantized(raw, "q5_0", x.shape)
    assert five.kind == "q5_0" and five.codes.shape == (37, cols // 2 + cols // 8)
    for p in (five, five.as_q8_0()):
        torch.testing.assert_close(torch.from_numpy(p.dequantize()), want, rtol=0, atol=0)
    kept = to_packed_weight(five, torch.float32)
    assert kept.kind == ("q5_0" if kernels.int8x_reads_q5_0() else "q8_0")
    w = PackedWeight.build("q5_0", *(torch.from_numpy(a) for a in five.parts()))
    torch.testing.assert_close(w.dequantize(), want, rtol=0, atol=0)
    xs = torch.randn(3, cols, generator=torch.Generator().manual_seed(cols))
    _assert_within_bound(F.linear(xs, w), xs, want)  # the f32 kernel where it runs
    _assert_within_bound(quantized._blocked_linear(xs, w), xs, want)


def _bound(x: torch.Tensor, dense: torch.Tensor, bias=None) -> torch.Tensor:
    """The f32 error bound of x @ dense^T (+ bias) summed in any order: gamma_(K+1) times
    sum |x| |w| (+ |bias|), gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and
    Stability, 3.1); products are exact or rounded once, so K + 1 roundings at most."""
    n, u = x.shape[-1] + 1, 2.0**-24
    magnitude = x.double().abs() @ dense.double().abs().t()
    if bias is not None:
        magnitude = magnitude + bias.double().abs()
    return n * u / (1 - n * u) * magnitude


def _assert_within_bound(got, x, dense, bias=None):
    want = x.double() @ dense.double().t()  # exact products and sums of the f32 operands
    if bias is not None:
        want = want + bias.double()
    assert got.shape == want.shape and got.dtype == torch.float32
    delta = (got.double() - want).abs()
    ok = delta <= _bound(x, dense, bias)  # NaN fails
    assert ok.all(), f"{int((~ok).sum())} outside the bound, max |delta| {delta.max()}"


@pytest.fixture(params=["kernel", "pytorch"])
def linear_path(request, monkeypatch):
    """Which implementation `F.linear` on a PackedWeight must take for small batches:
    Linnet's C++ kernel (the PyTorch path made to fail, so the kernel is what ran) or the
    PyTorch path (forced with LINNET_KERNELS=0)."""
    if request.param == "pytorch":
        monkeypatch.setenv("LINNET_KERNELS", "0")
    else:
        _require_kernels()
        monkeypatch.setattr(quantized, "_blocked_linear", _refuse)
    return request.param


def _require_kernels():
    if not kernels.cpu_supported():
        pytest.skip("the C++ kernels need an x86 CPU with AVX2")
    assert kernels.load() is not None, "the C++ kernels did not build (see the warning)"


def _refuse(*args):
    raise AssertionError("the PyTorch path ran where the kernel should have")


@pytest.mark.parametrize("kind,cols", CASES, ids=[f"{k}-{c}" for k, c in CASES])
@pytest.mark.parametrize("batch", [(1,), (2, 7), (1, 5)], ids=["decode", "batch", "b5"])
@pytest.mark.parametrize("rows", [97, 4, 1])
def test_packed_linear_matches_dequantize_then_matmul(kind, cols, batch, rows, linear_path):
    """97 rows: tiles of 4 and a ragged end of 1; batch 14 is 3 tiles of 4 and one of 2."""
    w, raw = _packed(kind, rows=rows, cols=cols)
    dense = _gguf_dequantized(raw, kind, w.shape)  # the reference outside Linnet's code
    x, b = torch.randn((*batch, cols)), torch.randn(rows)
    for bias in (None, b):
        _assert_within_bound(F.linear(x, w, bias), x, dense, bias)


def _int8_cpu() -> bool:
    """This CPU has the integer kernel's instructions: AVX512-VNNI, or AVX2 with FMA
    (packed_int8_avx2.cpp)."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()
    return "avx512_vnni" in flags or {"avx2", "fma"} <= flags


def _int8_terms(x: torch.Tensor, dense: torch.Tensor):
    """(x_hat, rounding, f32) for x rounded per 32-block as ggml's q8_0 activations
    (d = amax / 127 and x * (1 / d) in f32, x_hat = d round(x / d), |x - x_hat| <= d / 2
    up to f32 rounding of x / d, covered by the f32 term). The kernel sums
    w . x_hat exactly in int32 per block, then the block terms in f32 (4-bit: the scaled
    codes and the offsets apart, each at most |w| + 2 |offset| <= 3 max|w| of the block):
    rounding = sum |w| d / 2, the activations' term; f32 = gamma_(groups + 3) times
    4 sum |w| (|x| + d / 2), the f32 sums' term (generous for the offsets)."""
    blocks = x.float().reshape(*x.shape[:-1], -1, GROUP)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(d > 0, 1 / d, 0 * d)  # ggml's id = 1 / d, x * id in f32
    q = torch.round(blocks * inverse)  # ties to even, as vcvtps2dq
    x_hat = (q.double() * d.double()).reshape(x.shape)
    d = d.double()
    half_d = (d / 2).expand_as(blocks).reshape(x.shape)
    n, u = x.shape[-1] // GROUP + 3, 2.0**-24
    w_abs = dense.double().abs().t()
    f32 = n * u / (1 - n * u) * 4 * ((x.double().abs() + half_d) @ w_abs)
    return x_hat, half_d @ w_abs, f32


INT8_CASES = [("q8_0", 512), ("q8_0", 96), ("q8_0", 576), ("q4_0", 512), ("q4_0", 576),
              ("q4_k", 512), ("q4_k", 1536), ("q5_0", 512), ("q5_0", 576)]  # fmt: skip


INT8_BATCHES = [(1,), (3,), (8,), (2, 7), (1, 5)]


@pytest.mark.parametrize("kind,cols", INT8_CASES, ids=[f"{k}-{c}" for k, c in INT8_CASES])
@pytest.mark.parametrize("batch", INT8_BATCHES, ids=["decode", "b3", "b8", "batch", "b5"])
@pytest.mark.parametrize("rows", [97, 7, 4, 1])
def test_int8_activations_within_their_rounding(kind, cols, batch, rows, amd_tuning, monkeypatch):
    """numerics="fast" on a VNNI or AVX2 CPU: x rounded to int8 per 32-block, integer dot products
    (with AMD's choices on, a VNNI CPU runs the AVX2 kernel: both kernels, one bound).
    Against the exact f64 sum of w . x within the activations' rounding plus f32 summation
    error; and against w . x_hat (x_hat rounded as ggml rounds, in f64) within the f32
    term alone, so the kernel's rounding of x is ggml's (576 columns: 18 blocks, a tail of
    two; q8_0 96: an odd block; q4_0 576: rows of 9 blocks per half). Rows 97 and 7: tiles
    of 4 and a ragged end of 1 and 3; batches 3, 5, 7 and 8: x rows in pairs and a last one."""
    _require_kernels()
    if not _int8_cpu():  # elsewhere the f32 kernel runs (the tests above cover it)
        assert kernels.int8x_linear_op() is None
        return
    monkeypatch.setattr(quantized, "_blocked_linear", _refuse)
    w, raw = _packed(kind, rows=rows, cols=cols)
    quantized.allow_int8_activations({"w": w}, "fast")
    dense = _gguf_dequantized(raw, kind, w.shape)
    x = torch.randn((*batch, cols), generator=torch.Generator().manual_seed(rows + cols))
    x[..., 5] = 0.0
    x[..., 64:96] = 0.0  # a block of zeros: d = 0
    got = F.linear(x, w).double()
    assert got.shape == (*batch, rows)
    x_hat, rounding, f32 = _int8_terms(x, dense)
    delta = (got - x.double() @ dense.double().t()).abs()
    ok = delta <= rounding + f32  # NaN fails
    assert ok.all(), f"{int((~ok).sum())} outside the bound, max |delta| {delta.max()}"
    delta_hat = (got - x_hat @ dense.double().t()).abs()  # x rounded as ggml rounds it
    ok = delta_hat <= f32
    assert ok.all(), f"vs x_hat: {int((~ok).sum())} outside, max |delta| {delta_hat.max()}"


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
def test_int8_activations_only_under_fast_numerics(numerics, monkeypatch):
    """`equivalent` keeps f32 x (the f32 kernel's bound against exact sums holds); only
    `fast` takes the integer kernel, and LINNET_INT8X=0 turns it off."""
    _require_kernels()
    w, raw = _packed("q8_0", rows=33, cols=512)
    quantized.allow_int8_activations({"w": w}, numerics)
    fused = torch.cat([w[:20], w[20:]])  # fuse_linears' stacking keeps the choice
    int8 = []
    offered = kernels.int8x_linear_op
    monkeypatch.setattr(kernels, "int8x_linear_op", lambda: int8.append(1) or offered())
    x = torch.randn(1, 512)
    got = F.linear(x, fused)
    if numerics == "equivalent":
        assert not int8
        _assert_within_bound(got, x, _gguf_dequantized(raw, "q8_0", w.shape))
    else:
        assert int8
        monkeypatch.setenv("LINNET_INT8X", "0")
        assert offered() is None
        _assert_within_bound(F.linear(x, fused), x, _gguf_dequantized(raw, "q8_0", w.shape))


@pytest.mark.parametrize("kind", ["q4_0", "q5_0"])
def test_offsets_follow_from_the_scales(kind, monkeypatch):
    """On the AVX2 integer kernel a q4_0 or q5_0 weight is passed without its offsets (-8
    and -16 times the scale, power-of-two multiples, so deriving them changes no bit) and
    the result equals the op's with the stored offsets where it takes them (q4_0); the VNNI
    kernel keeps reading them (and sees q5_0 in q8_0's layout)."""
    _require_kernels()
    op = kernels.int8x_linear_op()
    if not _int8_cpu():  # no integer kernel here: no offsets to derive, q5_0 as q8_0
        assert op is None and not kernels.int8x_derived_offsets()
        return
    assert op is not None
    w, raw = _packed(kind, rows=37, cols=576)
    if w.kind != kind:  # q5_0 where the integer kernel does not read it
        assert not kernels.int8x_reads_q5_0() and w.kind == "q8_0"
        return
    assert torch.equal(w.offset, {"q4_0": -8, "q5_0": -16}[kind] * w.scale)
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(1))
    passed = []
    monkeypatch.setattr(
        kernels, "int8x_linear_op", lambda: lambda *a: passed.append(a[3]) or op(*a)
    )
    quantized.allow_int8_activations({"w": w}, "fast")
    got = F.linear(x, w)
    if not kernels.int8x_derived_offsets():
        assert passed[0] is w.offset
        return
    assert passed == [None]
    if kind == "q4_0":
        assert torch.equal(got, op(x, w.codes, w.scale, w.offset))
    dense = _gguf_dequantized(raw, kind, w.shape)
    x_hat, _, f32 = _int8_terms(x, dense)
    assert ((got.double() - x_hat @ dense.double().t()).abs() <= f32).all()


@pytest.mark.parametrize("kind,cols", CASES, ids=[f"{k}-{c}" for k, c in CASES])
@pytest.mark.parametrize("chunk", [1 << 18, 3 * 512], ids=["whole", "3-rows"])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_pytorch_path_in_blocks_of_rows(kind, cols, chunk, layout, monkeypatch):
    """Batches over KERNEL_MAX_ROWS take the PyTorch path even where the kernel runs;
    3 rows a block: blocks of rows and a ragged end. x column-major too: a prefill's down
    projection gets one (the blocked path's own result is one), and the 4-bit offsets sum
    x's groups along whichever layout it has."""
    monkeypatch.setattr(quantized, "_CHUNK", chunk)
    w, raw = _packed(kind, rows=97, cols=cols)
    dense = _gguf_dequantized(raw, kind, w.shape)
    x = torch.randn(quantized.KERNEL_MAX_ROWS + 3, cols)
    x = x.t().contiguous().t() if layout == "columns" else x
    calls = []
    blocked = quantized._blocked_linear
    monkeypatch.setattr(quantized, "_blocked_linear", lambda *a: calls.append(1) or blocked(*a))
    _assert_within_bound(F.linear(x, w), x, dense)
    assert calls == [1]


BF16_CASES = [("q8_0", 512), ("q4_0", 512), ("q4_k", 512), ("q5_0", 96)]


@pytest.mark.parametrize("kind,cols", BF16_CASES, ids=[f"{k}-{c}" for k, c in BF16_CASES])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_prefill_blocks_in_bf16_within_its_rounding(kind, cols, layout, monkeypatch):
    """numerics="fast" (`int8_x`) on a CPU with bf16 dot products (forced here: torch's bf16
    GEMM runs on any CPU): a prefill's blocks multiply in bf16. x and scale * code round to
    bf16 (u = 2^-8 each), the sums are f32, the block's result rounds to bf16 once: within
    (3u + 3u^2 + gamma_(K+1)) (1 + u)^2 sum |x| |scale * code| of the exact product, plus
    the f32 bound over the whole weight (the offsets' terms stay f32). It is not the f32
    path's result; "equivalent" and batches under BF16_MIN_ROWS are, bit for bit."""
    monkeypatch.setattr(quantized, "_BF16_DOT", True)
    w, raw = _packed(kind, rows=97, cols=cols)
    dense = _gguf_dequantized(raw, kind, w.shape)
    scaled = w.dequantize_rows(offset=False)
    x = torch.randn(quantized.KERNEL_MAX_ROWS + 16, cols)
    x = x.t().contiguous().t() if layout == "columns" else x
    f32 = quantized._blocked_linear(x, w)
    w.int8_x = True
    got = quantized._blocked_linear(x, w)
    u, n = 2.0**-8, cols + 1
    gamma = n * 2.0**-24 / (1 - n * 2.0**-24)
    bf16_part = (
        (3 * u + 3 * u * u + gamma) * (1 + u) ** 2 * (x.double().abs() @ scaled.double().abs().t())
    )
    delta = (got.double() - x.double() @ dense.double().t()).abs()
    ok = delta <= bf16_part + _bound(x, dense)
    assert ok.all(), f"{int((~ok).sum())} outside the bound, max |delta| {delta.max()}"
    assert not torch.equal(got, f32)  # the bf16 GEMM ran
    # and it is that GEMM: the bf16 operands' f32 product rounded to bf16 once, the offsets'
    # f32 terms added; the two sum in other orders, so a few results round to the next bf16
    xb, wb = x.bfloat16().double(), scaled.bfloat16().double()
    part = (xb.float() @ wb.float().t()).bfloat16().float()
    like = part if w.offset is None else quantized._offset_terms(x, w).t() + part
    # one bf16 step at |part|, both f32 sums' own errors, the f32 add of the offsets' terms
    sums = (xb.abs() @ wb.abs().t()).float()
    ulp = part.abs() * 2.0**-7 + 2 * gamma * sums + like.abs() * 2.0**-23
    assert ((got - like).abs() <= ulp).all() and (got == like).float().mean() > 0.9
    few = x[: quantized.BF16_MIN_ROWS - 1]
    fast_few = quantized._blocked_linear(few, w)
    w.int8_x = False
    assert torch.equal(quantized._blocked_linear(x, w), f32)
    assert torch.equal(fast_few, quantized._blocked_linear(few, w))


def test_kernels_off_uses_the_pytorch_path(monkeypatch):
    """LINNET_KERNELS=0: no kernel, and a one-row linear runs the PyTorch path."""
    monkeypatch.setenv("LINNET_KERNELS", "0")
    assert kernels.load() is None
    calls = []
    blocked = quantized._blocked_linear
    monkeypatch.setattr(quantized, "_blocked_linear", lambda *a: calls.append(1) or blocked(*a))
    w, _ = _packed("q8_0")
    x = torch.randn(1, 512)
    _assert_within_bound(F.linear(x, w), x, w.dequantize())
    assert calls == [1]


def test_failed_build_warns_once_and_falls_back(monkeypatch, tmp_path):
    """A compiler that fails: one warning, no exception, the PyTorch path, no library."""
    if not kernels.cpu_supported():
        pytest.skip("the C++ kernels need an x86 CPU with AVX2")
    monkeypatch.setattr(kernels, "_loaded", {})  # this process's library is left alone
    monkeypatch.setenv("LINNET_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # exits 1, as a failing compile does
    x = torch.randn(2, 256)
    with pytest.warns(UserWarning, match="C.. kernels not built") as caught:
        w, _ = _packed("q4_k", rows=8, cols=256)  # packing loads the kernels
        got = F.linear(x, w)
        F.linear(x, w)
    assert len(caught) == 1 and kernels.load() is None
    assert not list(tmp_path.rglob("*.so"))
    _assert_within_bound(got, x, w.dequantize())


# A C++ compiler that records each call (start, end, arguments): `-c` writes an empty object
# after a second; the link copies the library this process built (FAKE_LIBRARY).
_FAKE_CXX = """#!/bin/sh
start=$(date +%s.%N); out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
case " $* " in *" -c "*) sleep 1; : > "$out" ;; *) cp "$FAKE_LIBRARY" "$out" ;; esac
echo "$start $(date +%s.%N) $*" >> "$FAKE_LOG"
"""


def test_two_processes_build_the_kernels_once_in_parallel(tmp_path):
    """Two processes wanting the same missing library (pytest's two workers): one compiles
    each source in a compiler call of its own, several at once, and links once; the other
    waits on the build lock and loads that library."""
    _require_kernels()
    fake, log = tmp_path / "cxx", tmp_path / "calls"
    fake.write_text(_FAKE_CXX)
    fake.chmod(0o755)
    env = dict(os.environ, LINNET_CACHE=str(tmp_path / "cache"), CXX=str(fake))
    env.update(FAKE_LOG=str(log), FAKE_LIBRARY=str(kernels.build_dir() / "linnet_kernels.so"))
    code = "from linnet.backends.torch import kernels; assert kernels.load() is not None"
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(2)]
    assert [run.wait(timeout=600) for run in runs] == [0, 0]
    calls = [line.split(maxsplit=2) for line in log.read_text().splitlines()]
    compiles = sorted((c for c in calls if " -c " in c[2]), key=lambda c: float(c[0]))
    compiled = sorted(Path(c[2].split(" -c ")[1].split()[0]).name for c in compiles)
    assert compiled == sorted(kernels.SOURCES) and len(calls) == len(compiles) + 1
    if (os.cpu_count() or 1) > 1:  # the second compile starts before the first ends
        assert float(compiles[1][0]) < float(compiles[0][1])


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_activations_round_once(kind):
    """bf16 x: the f32 result of the reference, rounded once to bf16."""
    w, _ = _packed(kind)
    x = torch.randn(3, 512).bfloat16()
    got = F.linear(x, w.to(torch.bfloat16))
    want = F.linear(x.float(), w.dequantize())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2**-8, atol=1e-5)


def test_interpreter_shapes_of_a_weight():
    """What a weight meets in the interpreter and the runners stays packed or dequantizes
    correctly: a transpose then matmul, row slices and `cat` (fuse_linears), row gathers
    (embeddings), and any other op on the dequantized values."""
    w, _ = _packed("q4_0", rows=8, cols=64)
    dense, x, rows = w.dequantize(), torch.randn(2, 64), torch.tensor([[4, 1]])
    torch.testing.assert_close(torch.matmul(x, w.permute(1, 0)), x @ dense.t())
    stacked = torch.cat([w[:3], w[3:]])
    assert isinstance(stacked, PackedWeight) and isinstance(w[2:5], PackedWeight)
    torch.testing.assert_close(stacked.dequantize(), dense, rtol=0, atol=0)
    torch.testing.assert_close(w[rows], dense[rows], rtol=0, atol=0)
    torch.testing.assert_close(w * 2 + 1, dense * 2 + 1, rtol=0, atol=0)


@pytest.fixture(scope="module")
def tiny_llama_ggufs(tiny_checkpoint, tmp_path_factory):
    """(folder, GGUF export) of a tiny Llama variant in a packed type, made once."""
    root, made = tmp_path_factory.mktemp("quantized"), {}

    def get(variant: str, kind: str):
        src = tiny_checkpoint("llama", variant)
        if (variant, kind) not in made:
            path = root / f"{variant}.{kind}.gguf"
            made[variant, kind] = linnet.gguf.export(src, path, dtype=kind, progress=False)
        return src, made[variant, kind]

    return get


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    delta = (got - want).abs().max().item()
    assert delta <= 1e-5 * want.abs().max().item(), delta


def _all_matrices_packed(model) -> None:
    matrices = [n for n, p in model.params.items() if p.dim() == 2]
    assert matrices and all(isinstance(model.params[n], PackedWeight) for n in matrices)


# tied: SmolLM2-like, the packed embedding is also the head; hidden 96 is 3 groups (odd)
# q4_k: 96-wide rows are not whole 256-blocks, so every matrix is q5_0 (llama.cpp's
# fallback), kept 5-bit where the integer kernel reads it, else as q8_0
@pytest.mark.parametrize("variant", ["base", "tied"])
@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_k"])
@pytest.mark.parametrize("mode", ["interpret", "generated"])
def test_gguf_imported_packed_equals_dequantized_import(tiny_llama_ggufs, kind, mode, variant):
    _, gguf = tiny_llama_ggufs(variant, kind)
    want_model = lt.load(gguf)  # dequantized to f32 on load
    model = lt.load(gguf, dtype=kind, mode=mode)
    _all_matrices_packed(model)
    _close(model.forward(IDS), want_model.forward(IDS))
    assert model.generate(IDS, 6).tolist() == want_model.generate(IDS, 6).tolist()


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_k"])
def test_hf_folder_quantized_on_load_runs_its_gguf_export(tiny_llama_ggufs, kind):
    src, gguf = tiny_llama_ggufs("base", kind)
    model = lt.load(src, dtype=kind.upper(), mode="generated")
    _all_matrices_packed(model)
    _close(model.forward(IDS), lt.load(gguf).forward(IDS))


@pytest.mark.slow  # two torch.compile warm-ups of a tiny Llama (a minute each under load)
@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
def test_compile_mode_calls_the_packed_kernels(tiny_llama_ggufs, numerics):
    """mode="compile" with packed q8_0 weights gives `generated`'s greedy tokens, and a
    compiled one-token step calls Linnet's kernel op (seen by the profiler): the f32 one
    under `equivalent`, the integer one under `fast` where the CPU has VNNI."""
    _require_kernels()
    _, gguf = tiny_llama_ggufs("base", "q8_0")
    want = lt.load(gguf, dtype="q8_0", mode="generated", numerics=numerics).generate(IDS, 6)
    model = lt.load(gguf, dtype="q8_0", mode="compile", numerics=numerics)
    assert model.generate(IDS, 6).tolist() == want.tolist()
    model.reset()
    logits = model.decode(IDS, 0)
    with torch.profiler.profile() as prof:
        model.decode(logits.argmax(-1, keepdim=True), model.position)
    called = {e.name for e in prof.events() if e.name.startswith("linnet_kernels::")}
    int8 = numerics == "fast" and kernels.int8x_linear_op() is not None
    # the eager entry's final norm under `fast`: decode_ops.cpp's rms_norm (the compiled
    # layers call no step op: their norms, rope and attention are Inductor's)
    eager = {"linnet_kernels::rms_norm"} if numerics == "fast" else set()
    assert called == {f"linnet_kernels::packed_linear{'_int8x' if int8 else ''}"} | eager, called
