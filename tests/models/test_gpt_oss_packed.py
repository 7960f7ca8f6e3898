"""MXFP4 experts kept packed at run time (issue 16): `linnet.torch.load` of a GPT-OSS folder
whose experts are `_blocks`/`_scales` pairs holds them as `Mxfp4Experts`, and the moe op
multiplies the chosen experts from the blocks: Linnet's C++ kernel (mxfp4_gemv.cpp) for
small batches, one expert dequantized otherwise and with LINNET_KERNELS=0. Checked against
the dequantized weights (f64 products, the f32 summation bound) and against transformers
on the tiny MXFP4 checkpoints (logits 1e-4, greedy tokens).
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch

import linnet.torch as lt
from linnet.backends.torch import kernels
from linnet.backends.torch.mxfp4_experts import Mxfp4Experts
from linnet.weights import mxfp4
from tests.numeric import assert_close
from tests.tiny_decoders import probe_ids, reference_greedy, reference_logits
from tests.tiny_gpt_oss import VARIANTS, build_gpt_oss, to_mxfp4

PATHS = ("kernel", "pytorch")
PREFILL = 10


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Each case on the C++ kernel (which must build on an x86 CPU with AVX2) and on the
    PyTorch fallback."""
    if request.param == "pytorch":
        monkeypatch.setenv("LINNET_KERNELS", "0")
    elif platform.machine() in ("x86_64", "AMD64") and kernels.cpu_supported():
        assert kernels.load() is not None, "the C++ kernels did not build"
        monkeypatch.setenv("LINNET_KERNELS", "1")
    return request.param


def _random_pair(rng, experts: int, rows: int, groups: int, scale_range=(110, 140)):
    blocks = rng.integers(0, 256, (experts, rows, groups, 16), dtype=np.uint8)
    blocks[0, : min(rows, 256), 0] = np.arange(min(rows, 256), dtype=np.uint8)[:, None]
    scales = rng.integers(*scale_range, (experts, rows, groups), dtype=np.uint8)
    return blocks, scales


def test_packed_values_are_the_dequantizers_on_every_code_and_scale():
    """Mxfp4Experts.dequantize (the fallback's weights; the kernel reads the same table)
    equals linnet.weights.mxfp4.dequantize, itself checked against transformers."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (2, 256, 3, 16), dtype=np.uint8)
    blocks[0, :, 0] = np.arange(256, dtype=np.uint8)[:, None]
    scales = np.broadcast_to(np.arange(256, dtype=np.uint8)[:, None], (2, 256, 3)).copy()
    got = Mxfp4Experts.build(torch.from_numpy(blocks), torch.from_numpy(scales)).dequantize()
    want = mxfp4.dequantize(blocks, scales)
    np.testing.assert_array_equal(got.numpy(), want)  # inf at scale 255 on both sides
    np.testing.assert_array_equal(np.signbit(got.numpy()), np.signbit(want))


SCALES = {"normal": (110, 140), "subnormal": (0, 64), "large": (192, 224)}


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("tokens", [1, 3, 4, 5, 9, 70])
def test_packed_matmul_is_the_dequantized_matmul_within_the_f32_bound(path, tokens, scales):
    """x @ w[e] from the blocks vs the exact products of the dequantized weights summed in
    f64: within the f32 summation bound n u / (1 - n u) * sum |x| |w| (n = K + 1 terms:
    the sum and the final rounding), plus n * 2^-149 for roundings among subnormals. 70
    tokens take the dequantize-then-matmul path. Scale bytes near 127 take the AVX2
    kernel's scaled-integer path; below 64 (subnormal values) and above 191 its table
    lookups."""
    rng = np.random.default_rng(tokens)
    blocks, scales = _random_pair(rng, 3, 37, 5, SCALES[scales])  # 37 rows: tiles of 4, a rest
    w = Mxfp4Experts.build(torch.from_numpy(blocks), torch.from_numpy(scales))
    dense = torch.from_numpy(mxfp4.dequantize(blocks, scales)).double()
    k = dense.shape[1]
    u = 2.0**-24
    gamma = (k + 1) * u / (1 - (k + 1) * u)
    x = torch.from_numpy(rng.standard_normal((tokens, k)).astype(np.float32))
    for e in range(3):
        got = x @ w[e]
        assert got.dtype == torch.float32 and got.shape == (tokens, 37)
        want = x.double() @ dense[e]
        bound = gamma * (x.double().abs() @ dense[e].abs()) + (k + 1) * 2.0**-149
        excess = (got.double() - want).abs() - bound
        assert not (excess > 0).any() and not got.isnan().any(), f"expert {e}: {excess.max()}"


def test_experts_stay_packed_through_indexing():
    rng = np.random.default_rng(5)
    blocks, scales = _random_pair(rng, 4, 8, 2)
    w = Mxfp4Experts.build(torch.from_numpy(blocks), torch.from_numpy(scales))
    dense = w.dequantize()
    assert w.shape == (4, 64, 8) and w.nbytes_packed * 7 < dense.numel() * 4
    picked = w.index_select(0, torch.tensor([3, 1]))
    assert isinstance(picked, Mxfp4Experts) and isinstance(w[2], Mxfp4Experts)
    assert torch.equal(picked.dequantize(), dense[[3, 1]])
    assert torch.equal(w[2].dequantize(), dense[2])
    x = torch.randn(2, 1, 64)
    torch.testing.assert_close(torch.bmm(x, picked), torch.bmm(x, dense[[3, 1]]))


@pytest.fixture(scope="module")
def packed_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt-oss-packed")
    return {v: to_mxfp4(build_gpt_oss(v, root), root / f"{v}-mxfp4") for v in VARIANTS}


@pytest.mark.parametrize("mode", ["interpret", "generated"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_experts_match_transformers(packed_folders, path, variant, mode):
    folder = packed_folders[variant]
    model = lt.load(folder, dtype="f32", mode=mode)
    experts = [t for n, t in model.params.items() if n.endswith(("experts_in", "experts_out"))]
    assert experts and all(isinstance(t, Mxfp4Experts) for t in experts)
    ids = probe_ids(256)
    want = reference_logits(folder, ids)
    assert_close(model.forward(ids), want, atol=1e-4, what=f"{path} {mode} forward")
    model.reset()
    last = model.decode(ids[:, :PREFILL], 0)
    assert_close(last, want[:, PREFILL - 1], atol=1e-4, what="prefill")
    for pos in range(PREFILL, ids.shape[1]):
        last = model.decode(ids[:, pos : pos + 1], pos)
        assert_close(last, want[:, pos], atol=1e-4, what=f"{path} {mode} decode at {pos}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_greedy_tokens_match_transformers(packed_folders, path, variant):
    folder = packed_folders[variant]
    ids = probe_ids(256, (1, 12), seed=3)
    want = reference_greedy(folder, ids, 8)
    got = lt.load(folder, dtype="f32", mode="generated").generate(ids, 8)
    assert got.tolist() == want.tolist()


def _ops_called(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def test_a_decode_step_runs_the_experts_in_one_kernel_call(packed_folders, path):
    """A one-token step's experts go through `mxfp4_moe` (one C++ call for all chosen
    experts) on the kernel path; the fallback loop would give the same logits silently, so
    the profiler is what tells the two apart. With LINNET_KERNELS=0 no kernel op runs."""
    variant = VARIANTS[0]
    model = lt.load(packed_folders[variant], dtype="f32", mode="generated")
    ids = probe_ids(256)
    model.decode(ids[:, :PREFILL], 0)
    called = _ops_called(lambda: model.decode(ids[:, PREFILL : PREFILL + 1], PREFILL))
    fused = {k for k in called if k.endswith("mxfp4_moe")}
    if path == "kernel":
        assert fused, f"no mxfp4_moe call in a decode step: {sorted(called)[:20]}"
    else:
        assert not fused and not any("linnet_kernels" in k for k in called)
