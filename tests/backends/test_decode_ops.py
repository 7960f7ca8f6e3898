"""The C++ ops of a decode step (kernels/decode_ops.cpp; docs/torch.md) against the
reference decompositions of prelude.py, on odd sizes:

- `rms_norm` within 2e-6 relative of `rms_norm_ref` (f32 sums in another order);
- `rope` equal to `rope_ref` bit for bit (the same products, rounded, then summed);
- `decode_attention` within 2e-6 of `attention_ref` (GQA, a window, sinks; a polynomial
  e^x: within 2 ulp in f32);
- the fast helpers call them for f32 CPU decode, for bf16 norm and rope widened to f32 and
  for a bf16 decode step's attention over the bf16 cache as it lies (every CPU), and keep
  the PyTorch path for a rope at per-row positions, a padding mask and with
  LINNET_KERNELS=0 (attention at per-row positions takes `decode_attention_rows`:
  test_row_attention.py); a tiny Llama's greedy decode in `generated`/`fast` runs them and
  gives transformers' tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import linnet.torch as lt
from linnet.backends.torch import kernels
from linnet.backends.torch import prelude as P
from tests.checkpoints import build_tiny, load_reference, probe_ids

pytestmark = pytest.mark.skipif(
    not kernels.cpu_supported(), reason="the C++ kernels need an x86 CPU with AVX2"
)


@pytest.mark.parametrize("n", [1, 7, 577, 1000])
def test_rms_norm_within_f32_bound(spy, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, 5, n, generator=g) * 3
    w = torch.randn(n, generator=g)
    got = P.rms_norm_fast(x, w, 1e-5)
    want = P.rms_norm_ref(x, w, 1e-5)
    assert spy.calls == {"rms_norm": 1}
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-30)
    # a strided x (a slice) and a zero row: eps alone under the root
    x[1, 2] = 0
    got = P.rms_norm_fast(x[:, 1:4], w, 1e-5)
    torch.testing.assert_close(got, P.rms_norm_ref(x[:, 1:4], w, 1e-5), rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize(
    ("heads", "seq", "dim", "offset"), [(3, 1, 6, 0), (9, 1, 64, 41), (5, 7, 34, 3)]
)
def test_rope_equals_rope_ref_bit_for_bit(spy, heads, seq, dim, offset):
    """x as the generated code hands it over: a permuted slice of the fused qkv output."""
    cos, sin = P.rope_tables(dim, 64, 10000.0, "default", 1, 1, 1, 1)
    g = torch.Generator().manual_seed(dim)
    qkv = torch.randn(2, seq, heads * dim + 5, generator=g)
    x = qkv[..., : heads * dim].reshape(2, seq, heads, dim).permute(0, 2, 1, 3)
    got = P.rope_fast(x, cos, sin, offset)
    assert spy.calls == {"rope": 1} and got.shape == x.shape
    assert torch.equal(got, P.rope_ref(x, cos, sin, offset))
    xt = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # D not contiguous: copied first
    assert torch.equal(P.rope_fast(xt, cos, sin, offset), P.rope_ref(xt, cos, sin, offset))


def _cache(b, kv, t, d, g):
    """k, v: the first t rows of a [B, KV, 50, D] cache, as a decode step reads them."""
    k, v = torch.randn(2, b, kv, 50, d, generator=g)
    return k[:, :, :t], v[:, :, :t]


@pytest.mark.parametrize("window", [0, 7, 40])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize(("heads", "kv", "t", "d"), [(6, 2, 1, 17), (6, 3, 33, 40), (9, 3, 41, 64)])
def test_decode_attention_within_f32_bound(spy, window, sinks, heads, kv, t, d):
    g = torch.Generator().manual_seed(t * 100 + d)
    q = torch.randn(2, heads, 1, d, generator=g) * 2
    k, v = _cache(2, kv, t, d, g)
    s = torch.randn(heads, generator=g) if sinks else None
    got = P.attention_fast(q, k, v, True, t - 1, window, None, None, s)
    want = P.attention_ref(q, k, v, True, t - 1, window, None, None, s)
    assert spy.calls == {"decode_attention": 1}
    assert (got - want).abs().max().item() <= 2e-6


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize(("window", "sinks", "d"), [(0, False, 64), (7, True, 17)])
def test_bf16_cache_read_as_it_lies(spy, monkeypatch, native, window, sinks, d):
    """A bf16 decode step's attention, with or without a bf16 dot product: the f32 op on
    the widened query over the bf16 cache's rows where they lie (a slice, not copied),
    rounded once: within one bf16 rounding of attention_ref in f32 on the same values.
    D = 17 takes the bf16 dot product's scalar tail."""
    monkeypatch.setitem(P._LOWP_NATIVE, torch.bfloat16, native)
    g = torch.Generator().manual_seed(d + window)
    heads, kv, t = 6, 3, 33
    q = (torch.randn(2, heads, 1, d, generator=g) * 2).bfloat16()
    cache = torch.randn(2, 2, kv, 50, d, generator=g).bfloat16()
    k, v = cache[0][:, :, :t], cache[1][:, :, :t]
    s = torch.randn(heads, generator=g) if sinks else None
    got = P.attention_fast(q, k, v, True, t - 1, window, None, None, s)
    want = P.attention_ref(q.float(), k.float(), v.float(), True, t - 1, window, None, None, s)
    assert spy.calls == {"decode_attention": 1} and got.dtype == torch.bfloat16
    assert ((got.float() - want).abs() <= 2**-8 * want.abs() + 2e-6).all()


def test_exp_polynomial_within_two_ulp(ops):
    """Scores spread over e^0..e^-87 (the polynomial's range) and one below it: softmax
    weights read out through v = identity rows, against torch's f32 exp."""
    t = 64
    scores = torch.cat([torch.linspace(0, -87, t - 1), torch.tensor([-200.0])])
    q = torch.zeros(1, 1, 1, t)
    q[..., 0] = 1
    k = torch.zeros(1, 1, t, t)
    k[..., 0] = scores  # q k^T = scores (scale 1)
    v = torch.eye(t).reshape(1, 1, t, t)  # out = the softmax weights
    got = ops.decode_attention(q, k, v, 1.0, 0, None).reshape(t)
    e = torch.exp(scores.double())
    want = (e / e.sum()).float()
    tiny = want < 2**-126  # below f32's normal range: e^x clamped at x = -87, so at most
    assert (got[tiny] <= math.exp(-87)).all()  # e^-87 / sum, an absolute error < 1.7e-38
    ulp = torch.finfo(torch.float32).eps * want[~tiny]
    assert ((got[~tiny] - want[~tiny]).abs() <= 2 * ulp).all()


def test_pytorch_path_where_the_ops_do_not_apply(spy, monkeypatch):
    """bf16 where the CPU has a bf16 dot product, per-row positions, a padding mask, a
    prefill, LINNET_KERNELS=0: no op runs, and the helpers give what they gave before the
    ops (the PyTorch path, bit for bit)."""
    monkeypatch.setitem(P._LOWP_NATIVE, torch.bfloat16, True)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 64, generator=g), torch.randn(64, generator=g)
    cos, sin = P.rope_tables(64, 16, 10000.0, "default", 1, 1, 1, 1)
    q = torch.randn(2, 4, 1, 64, generator=g)
    k, v = _cache(2, 2, 5, 64, g)
    P.rope_fast(q, cos, sin, torch.tensor([[4], [2]]))
    P.attention_fast(q, k, v, True, 4, 0, None, torch.ones(2, 5))
    P.attention_fast(q.expand(2, 4, 5, 64), k, v, True, 0, 0, None)
    assert spy.calls == {}
    monkeypatch.setenv("LINNET_KERNELS", "0")
    assert torch.equal(P.rms_norm_fast(x, w, 1e-5), F.rms_norm(x, (64,), w, 1e-5))
    assert torch.equal(
        P.attention_fast(q, k, v, True, 4, 0, None),
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    )
    assert spy.calls == {}


@pytest.mark.parametrize("native", [False, True])
def test_bf16_rope_runs_widened(spy, monkeypatch, native):
    """With or without a bf16 dot product, a bf16 rope runs the f32 op on widened inputs,
    rounded once: within one bf16 rounding of the f32 result (rope_ref in bf16 rounds the
    tables and each product too, so it is no closer)."""
    monkeypatch.setitem(P._LOWP_NATIVE, torch.bfloat16, native)
    g = torch.Generator().manual_seed(0)
    cos, sin = P.rope_tables(64, 16, 10000.0, "default", 1, 1, 1, 1)
    q = torch.randn(2, 4, 1, 64, generator=g).bfloat16()
    roped = P.rope_fast(q, cos, sin, 7)
    assert spy.calls == {"rope": 1} and roped.dtype == torch.bfloat16  # bf16 in, bf16 out
    want = P.rope_ref(q.float(), cos, sin, 7)
    ulp = 2.0**-8 * want.abs() + 1e-30
    assert ((roped.float() - want).abs() <= ulp * 1.01 + 2e-6 * want.abs().max()).all()


@pytest.mark.parametrize("native", [False, True])
def test_bf16_norm_rounds_as_the_reference(spy, monkeypatch, native):
    """A bf16 norm, with or without a bf16 dot product, is one call of the op that widens x
    as it reads it, normalises in f32, then rounds as rms_norm_ref (and transformers) do:
    the normalised x to bf16, then times w in bf16. So it is rms_norm_ref's result up to
    the f32 mean's summation order: at most one bf16 step from it, and equal almost
    everywhere (here: everywhere); rounding once after w instead, or F.rms_norm in bf16,
    differs from it in 26% of these elements."""
    monkeypatch.setitem(P._LOWP_NATIVE, torch.bfloat16, native)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 37, 576, generator=g) * 3).bfloat16()
    w = torch.randn(576, generator=g).bfloat16()
    got = P.rms_norm_fast(x, w, 1e-5)
    assert spy.calls == {"rms_norm_bf16": 1} and got.dtype == torch.bfloat16
    want = P.rms_norm_ref(x, w, 1e-5)
    step = 2.0**-7 * want.float().abs() + 1e-30
    assert ((got.float() - want.float()).abs() <= step).all()
    assert (got != want).float().mean().item() <= 0.01


def test_bf16_ops_are_the_widened_f32_ops_bit_for_bit(ops):
    """The bf16 norm and rope read bf16 and write it: the same bits as the f32 op on the
    widened tensor, then torch's casts (and, for the norm, torch's bf16 multiply by w), on
    odd sizes, a strided x (a permuted view), values spread over many binades."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 5, 577, generator=g) * torch.logspace(-3, 3, 577)).bfloat16()
    w = torch.randn(577, generator=g).bfloat16()
    unit = torch.ones(577)
    widened = w * ops.rms_norm(x.float(), unit, 1e-6).bfloat16()
    assert torch.equal(ops.rms_norm_bf16(x, w, 1e-6), widened)
    cos, sin = P.rope_tables(40, 64, 10000.0, "default", 1, 1, 1, 1)
    q = (torch.randn(2, 7, 3, 40, generator=g) * 5).bfloat16().transpose(1, 2)  # (2, 3, 7, 40)
    roped = ops.rope(q, cos, sin, 11)
    assert roped.dtype == torch.bfloat16
    assert torch.equal(roped, ops.rope(q.float(), cos, sin, 11).bfloat16())


def test_fake_shapes_for_compile(ops):
    """register_fake: the ops trace under torch.compile (opcheck's fake-tensor checks)."""
    g = torch.Generator().manual_seed(0)
    cos, sin = P.rope_tables(8, 16, 10000.0, "default", 1, 1, 1, 1)
    k, v = _cache(1, 2, 5, 8, g)
    cases = [
        (ops.rms_norm, (torch.randn(2, 3, 9), torch.randn(9), 1e-5)),
        (ops.rope, (torch.randn(1, 3, 2, 8), cos, sin, 4)),
        (ops.decode_attention, (torch.randn(1, 4, 1, 8), k, v, 0.3, 1, torch.randn(4))),
    ]
    for op, args in cases:
        torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))


def test_tiny_llama_decode_runs_the_ops_and_gives_transformers_tokens(spy, tmp_path):
    """Greedy decode, `generated`/`fast`: every step's norms and attentions are the ops
    (2 norms a layer and the final norm; each layer's ropes, cache writes and attention
    one `attend_cached`: test_step_fusion.py), and where the CPU takes AMD's choices its
    linears the f32 GEMV (kernels/cpu_tuning.h)."""
    folder = build_tiny("llama", "base")
    reference = load_reference(folder)
    ids = probe_ids(reference.config.vocab_size)[:1]
    with torch.no_grad():
        want = reference.generate(ids, max_new_tokens=6, do_sample=False)[:, ids.shape[1] :]
    model = lt.load(str(folder), mode="generated", numerics="fast")
    layers = reference.config.num_hidden_layers
    model.reset()
    logits, got = model.decode(ids, 0), []
    spy.calls.clear()
    for _ in range(6):
        got.append(int(logits.argmax()))
        logits = model.decode(torch.tensor([[got[-1]]]), model.position)
    assert got == want[0].tolist()
    steps = 6
    linears = {"f32_linear": steps * (4 * layers + 1)} if kernels.f32_gemv_preferred() else {}
    assert spy.calls == {  # f32 GEMV (AMD's choices): fused qkv, o, fused gate/up, down; head
        "rms_norm": steps * (2 * layers + 1),
        "attend_cached": steps * layers,
        **linears,
    }
    assert math.isfinite(float(logits.abs().max()))


def test_tiny_gpt_oss_decode_with_sinks_and_window_matches_transformers(spy, tmp_path):
    """GPT-OSS (sinks on every layer, a window of 4 on alternate ones), `generated`/`fast`:
    decode steps past the window within 1e-4 of transformers' logits, each step's
    attentions the op (`attend_cached`; the windowed layers start past key 0)."""
    from tests.tiny_decoders import reference_logits
    from tests.tiny_gpt_oss import build_gpt_oss

    folder = build_gpt_oss("spread", tmp_path)
    ids = probe_ids(256)[:1]
    want = reference_logits(folder, ids)
    model = lt.load(folder, dtype="f32", mode="generated", numerics="fast")
    model.reset()
    model.decode(ids[:, :10], 0)
    spy.calls.clear()
    for pos in range(10, ids.shape[1]):
        got = model.decode(ids[:, pos : pos + 1], pos)
        assert (got - want[:, pos]).abs().max().item() <= 1e-4
    layers = model.hf_config["num_hidden_layers"]
    assert spy.calls["attend_cached"] == (ids.shape[1] - 10) * layers


def _tiny_q8_decode(folder, ids, hop=False, steps=4, mode="generated"):
    """Greedy decode of a q8_0 tiny model, numerics="fast": tokens and last logits;
    `hop`: the generated module's `_Packed` None, so `linear_fast` takes F.linear."""
    model = lt.load(str(folder), dtype="q8_0", mode=mode, numerics="fast")
    if hop:
        type(model.runner.module).decode.__globals__["_Packed"] = None
    model.reset()
    logits, got = model.decode(ids, 0), []
    for _ in range(steps):
        got.append(int(logits.argmax()))
        logits = model.decode(torch.tensor([[got[-1]]]), model.position)
    return got, logits


def test_packed_linears_called_straight(monkeypatch):
    """`linear_fast` calls a packed weight's kernel itself (`decode_linear`): no
    `__torch_function__` hop for any linear of the decode, and the logits equal those of
    the hop bit for bit (the same kernel either way)."""
    from linnet.backends.torch import quantized

    folder = build_tiny("llama", "base")
    ids = probe_ids(load_reference(folder).config.vocab_size)[:1]
    hops, straight, direct = [], [], []
    real, first = quantized._kernel_linear, quantized.decode_linear
    monkeypatch.setattr(quantized, "_kernel_linear", lambda *a: straight.append(1) or real(*a))
    monkeypatch.setattr(quantized, "decode_linear", lambda *a: direct.append(1) or first(*a))
    for fn in {F.linear, torch._C._nn.linear}:  # one function, as torch is built now
        handler = quantized.PackedWeight.handlers[fn]
        monkeypatch.setitem(
            quantized.PackedWeight.handlers, fn, lambda *a, _h=handler: hops.append(1) or _h(*a)
        )
    got, logits = _tiny_q8_decode(folder, ids)
    assert straight and not hops  # every linear straight (the embedding's gather aside)
    assert len(direct) == len(straight)  # each through decode_linear
    straight.clear()
    want, want_logits = _tiny_q8_decode(folder, ids, hop=True)
    assert hops and len(hops) == len(straight)  # each linear through the hop
    assert got == want and torch.equal(logits, want_logits)


def test_packed_decode_compiles():
    """mode="compile" over q8_0 weights: dynamo traces `linear_fast` and
    `kernels.int8x_linear_op` (its cache is skipped while tracing: tracing the cached
    tuple failed); the tokens of `generated`, the logits within f32 reordering."""
    folder = build_tiny("llama", "base")
    ids = probe_ids(load_reference(folder).config.vocab_size)[:1]
    want, want_logits = _tiny_q8_decode(folder, ids)
    got, logits = _tiny_q8_decode(folder, ids, mode="compile")
    assert got == want
    assert float((logits - want_logits).abs().max()) <= 1e-4
