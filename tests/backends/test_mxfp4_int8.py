"""numerics="fast" MoE of a decode step (issue 16): `mxfp4_linear_int8` (MXFP4 rows against
x rounded to int8 per 32-block, kernels/mxfp4_int8.cpp) and `mxfp4_moe_routed` (router,
top-k, softmax and those experts in one call), checked against references built here:
x rounded in Python by the stated rule (d = amax / 127 in f32, q = round(x * (1 / d)) ties
to even) times the dequantized weights in f64, and the router and experts composed from
PyTorch ops and the checked linear. Then the tiny GPT-OSS checkpoints end to end against
transformers under `fast`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import linnet.torch as lt
from linnet.backends.torch import kernels
from linnet.backends.torch.mxfp4_experts import Mxfp4Experts, values_table
from linnet.weights import mxfp4
from tests.numeric import assert_close
from tests.tiny_decoders import probe_ids, reference_logits
from tests.tiny_gpt_oss import VARIANTS, build_gpt_oss, to_mxfp4

pytestmark = pytest.mark.skipif(
    not kernels.cpu_supported() or kernels.load() is None,
    reason="the int8 MXFP4 kernel is AVX2 code: this CPU or build has none",
)
SCALES = {"normal": (110, 140), "subnormal": (0, 64), "large": (192, 224)}


def _pair(rng, lead, rows, groups, scale_range=(110, 140)):
    blocks = rng.integers(0, 256, (*lead, rows, groups, 16), dtype=np.uint8)
    scales = rng.integers(*scale_range, (*lead, rows, groups), dtype=np.uint8)
    return torch.from_numpy(blocks), torch.from_numpy(scales)


def _rounded(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, K] f32 -> (codes, d) per 32-block by the kernels' rule, in f32 as they do it."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return torch.round(blocks * inv), d


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("tokens", [1, 2, 3])
# the VNNI kernel takes blocks 4 at a time in chunks of 16: a last quad of 1, 2 or 3 blocks,
# whole quads, and a second and third chunk (35: its last chunk a 3-block quad)
@pytest.mark.parametrize("groups", [5, 6, 7, 8, 35])
def test_int8_linear_is_the_rounded_x_times_the_weights(tokens, scales, groups):
    """Integer sums are exact, so the kernel differs from the f64 reference on the rounded x
    only by f32 scaling (one rounding) and summation (the AVX2 kernel: G lane steps and 3 of
    the lanes' final sum; the VNNI one: ceil(G / 4) steps and a 4-level fold): within
    n u / (1 - n u) * sum |d q w|, n = G + 4, which covers both. A code rounded the other way
    (off by one in a single element) costs d * |w|, far past that bound."""
    rng = np.random.default_rng(tokens * 100 + groups)
    blocks, sc = _pair(rng, (), 37, groups, SCALES[scales])
    x = torch.from_numpy(rng.standard_normal((tokens, groups * 32)).astype(np.float32))
    x[0, :32] = 0.0  # an all-zero block: d = 0
    got = kernels.load().mxfp4_linear_int8(x, blocks, sc)
    q, d = _rounded(x)
    dense = torch.from_numpy(mxfp4.dequantize(blocks.numpy(), sc.numpy())).double()  # (K, R)
    rounded = (q * d).double().reshape(tokens, -1)  # exact: d times a small integer
    want = rounded @ dense
    n, u = groups + 4, 2.0**-24
    bound = n * u / (1 - n * u) * (rounded.abs() @ dense.abs()) + n * 2.0**-149
    excess = (got.double() - want).abs() - bound
    assert not (excess > 0).any(), f"{excess.max()}"
    # and the rounding is what the fast numerics trade: near the f32-exact product
    exact = x.double() @ dense
    assert_close(got.double(), exact, rtol=0.05, atol=0.05 * exact.abs().max().item())


def _routed_reference(x, router_w, router_b, top_k, w_in, b_in, w_out, b_out, alpha, limit):
    """The routed op from PyTorch ops and the checked int8 linear."""
    ops = kernels.load()
    top, idx = torch.topk(x @ router_w.T + router_b, top_k, dim=-1)
    gates = torch.softmax(top, -1)
    y = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(top_k):
            e = int(idx[n, j])
            h = ops.mxfp4_linear_int8(x[n : n + 1], w_in.blocks[e], w_in.scales[e]) + b_in[e]
            gate, up = h[..., 0::2].clamp(max=limit), h[..., 1::2].clamp(-limit, limit)
            act = ((up + 1) * (gate * torch.sigmoid(gate * alpha))).contiguous()
            out = ops.mxfp4_linear_int8(act, w_out.blocks[e], w_out.scales[e]) + b_out[e]
            y[n] += gates[n, j] * out[0]
    return y, idx


@pytest.mark.parametrize("router", ["spread", "one_expert"])
def test_routed_moe_is_router_topk_softmax_and_the_int8_experts(router):
    rng = np.random.default_rng(7)
    experts, dim, ffn, top_k, tokens = 8, 64, 96, 2, 3
    w_in = Mxfp4Experts.build(*_pair(rng, (experts,), 2 * ffn, dim // 32))
    w_out = Mxfp4Experts.build(*_pair(rng, (experts,), dim, ffn // 32))
    b_in, b_out = torch.randn(experts, 2 * ffn), torch.randn(experts, dim)
    x = torch.randn(tokens, dim)
    router_w, router_b = torch.randn(experts, dim), torch.randn(experts)
    if router == "one_expert":  # every token to experts 5 and 2
        router_w.zero_()
        router_b = torch.zeros(experts)
        router_b[5], router_b[2] = 3.0, 1.0
    want, idx = _routed_reference(
        x, router_w, router_b, top_k, w_in, b_in, w_out, b_out, 1.702, 7.0
    )
    if router == "spread":
        assert len(set(idx.flatten().tolist())) > top_k
    got = w_in.moe_routed(x, router_w, router_b, top_k, b_in, w_out, b_out, 1.702, 7.0)
    assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_routed_moe_declines_what_it_does_not_run():
    """More work than one expert's worth per expert (the prefill path) or no router bias:
    None, and the caller's PyTorch path runs."""
    rng = np.random.default_rng(8)
    w_in = Mxfp4Experts.build(*_pair(rng, (4,), 64, 1))
    w_out = Mxfp4Experts.build(*_pair(rng, (4,), 32, 1))
    args = (torch.randn(4, 32), torch.zeros(4), 2, torch.zeros(4, 64), w_out, torch.zeros(4, 32))
    assert w_in.moe_routed(torch.randn(3, 32), *args, 1.702, 7.0) is None  # 3 x 2 > 4
    no_bias = (args[0], None, *args[2:])
    assert w_in.moe_routed(torch.randn(1, 32), *no_bias, 1.702, 7.0) is None


def test_routed_weights_kept_between_calls_follow_the_tensors():
    """moe_routed keeps its checked weight arguments from one call to the next; a new
    tensor, an in-place update and a dtype swapped under the same object are each seen
    (each result equals the reference on the weights as they are then)."""
    rng = np.random.default_rng(9)
    experts, dim, ffn, top_k = 8, 64, 64, 2
    w_in = Mxfp4Experts.build(*_pair(rng, (experts,), 2 * ffn, dim // 32))
    w_out = Mxfp4Experts.build(*_pair(rng, (experts,), dim, ffn // 32))
    b_in, b_out = torch.randn(experts, 2 * ffn), torch.randn(experts, dim)
    x, router_w, router_b = torch.randn(1, dim), torch.randn(experts, dim), torch.randn(experts)

    def check(b_in, b_out):
        got = w_in.moe_routed(x, router_w, router_b, top_k, b_in, w_out, b_out, 1.702, 7.0)
        args = (x, router_w, router_b, top_k, w_in, b_in.float(), w_out, b_out, 1.702, 7.0)
        want, _ = _routed_reference(*args)
        assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        return got

    first = check(b_in, b_out)
    assert "_routed" in w_in.__dict__  # kept
    moved = check(b_in, b_out + 1.0)  # a new tensor
    assert not torch.equal(moved, first)
    b_out.add_(1.0)  # the same object, updated in place
    assert torch.equal(check(b_in, b_out), moved)
    b_in.data = b_in.data.double()  # the same object, another dtype: converted, not refused
    check(b_in, b_out)


@pytest.fixture(scope="module")
def packed_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt-oss-fast")
    return {v: to_mxfp4(build_gpt_oss(v, root), root / f"{v}-mxfp4") for v in VARIANTS}


# docs/gpt-oss.md, "Tolerances": x rounded to int8 in the experts moves the tiny models'
# logits by up to ~1% of their largest (0.39 of 42.9 measured; f32-exact experts 2.3e-5)
FAST_SHARE = 0.02


@pytest.mark.parametrize("variant", VARIANTS)
def test_fast_decode_matches_transformers(packed_folders, variant):
    """Under `fast` a decode step's MoE is one `mxfp4_moe_routed` call (the profiler says
    so) and its logits stay within FAST_SHARE of transformers' largest. Tokens: wherever
    transformers' top logit leads the next by more than twice that, Linnet picks the same
    one (where the lead is smaller, x's rounding may flip it, as in llama.cpp)."""
    folder = packed_folders[variant]
    model = lt.load(folder, dtype="f32", mode="generated", numerics="fast")
    ids = probe_ids(256, (1, 48), seed=3)
    want = reference_logits(folder, ids)[0]
    atol = FAST_SHARE * want.abs().max().item()
    model.reset()
    got = [model.decode(ids[:, :10], 0)[0]]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got.append(model.decode(ids[:, 10:11], 10)[0])
    assert any(e.key.endswith("mxfp4_moe_routed") for e in prof.key_averages())
    got += [model.decode(ids[:, p : p + 1], p)[0] for p in range(11, ids.shape[1])]
    got = torch.stack(got)
    assert_close(got, want[9:], atol=atol, what="fast decode")
    top2 = torch.topk(want[9:], 2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * atol
    assert clear.sum() >= len(clear) // 2, "too few positions with a clear lead to compare"
    assert torch.equal(got.argmax(-1)[clear], want[9:].argmax(-1)[clear])


def test_table_is_what_the_int8_scales_assume():
    """The int8 kernel scales doubled codes by 2^(s - 128): that is the reference table's
    value of each code, exactly, wherever the table is finite (values past f32's largest
    are inf there: scale bytes 253-255)."""
    table = values_table("cpu").double()
    doubled = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]).double()
    want = doubled * torch.pow(2.0, torch.arange(256).double()[:, None] - 128)
    finite = table.isfinite()
    assert finite[:253].all() and torch.equal(table[finite], want[finite])
    assert (want[~finite].abs() > torch.finfo(torch.float32).max).all()


def test_scale_byte_255_is_infinite_as_in_the_reference():
    """e8m0's 255 makes the reference's weights infinite: the int8 kernel's row is not
    finite either, even where x's block is so small that 2^127 times it would be."""
    rng = np.random.default_rng(9)
    blocks, sc = _pair(rng, (), 6, 3)
    sc[2, 1] = 255
    x = torch.from_numpy(rng.standard_normal((1, 96)).astype(np.float32))
    x[0, 32:64] *= 1e-30
    got = kernels.load().mxfp4_linear_int8(x, blocks, sc)
    exact = kernels.load().mxfp4_linear(x, blocks, sc, values_table("cpu"))
    assert not got[0, 2].isfinite() and not exact[0, 2].isfinite()
    assert torch.equal(got.isfinite(), exact.isfinite())
