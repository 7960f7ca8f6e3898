"""GPT-OSS's ops against transformers' own modules (issue 16): YaRN rope tables, attention
with sinks, and the `moe` op, whose dense decomposition (every expert on every token) and
native emitters (PyTorch and JAX: only the chosen experts) must all equal `GptOssMLP`.

Tolerance: f32 |Δ| <= 1e-5 absolute for attention, 1e-5 * max(1, |ref|) for rope (as
tests/ir/test_ir_ops.py); the MoE: `assert_moe`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from linnet.backends.jax import prelude as jax_prelude
from linnet.backends.torch import prelude as torch_prelude
from tests.ir.test_ir_ops import assert_f32, assert_matches, rand, run_op

YARN = dict(factor=32.0, original_max=32, beta_fast=32.0, beta_slow=1.0)
ROPE_BASE = dict(theta=10000.0, scaling="yarn", low_freq=1.0, high_freq=4.0)


def _gpt_oss_config(**kw):
    from transformers import GptOssConfig

    base = dict(vocab_size=64, hidden_size=16, intermediate_size=8, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                num_experts_per_tok=2, max_position_embeddings=1024)  # fmt: skip
    return GptOssConfig(**{**base, **kw})


def hf_yarn_rope(x, offset, truncate):
    from transformers.models.gpt_oss.modeling_gpt_oss import (
        GptOssRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    rope = dict(rope_type="yarn", rope_theta=10000.0, factor=32.0, beta_fast=32.0,
                beta_slow=1.0, original_max_position_embeddings=32, truncate=truncate)  # fmt: skip
    rotary = GptOssRotaryEmbedding(_gpt_oss_config(rope_parameters=rope))
    seq = x.shape[2]
    cos, sin = rotary(x, torch.arange(offset, offset + seq)[None])
    return apply_rotary_pos_emb(x, x, cos, sin)[0]


def _yarn_attrs(truncate):
    return dict(ROPE_BASE, **YARN, truncate=truncate, attn_factor=0.1 * math.log(32.0) + 1)


@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("offset", [0, 7])
def test_yarn_rope_vs_transformers(truncate, offset):
    x = rand(2, 3, 6, 16, seed=31, scale=2.0)
    got = run_op("rope", [x], offset=offset, positions=64, **_yarn_attrs(truncate))
    want = hf_yarn_rope(x, offset, truncate)
    assert_f32(got, want, f"yarn rope truncate={truncate} offset={offset}", True)


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_tables_of_the_backends(truncate):
    """The generated code's own tables (PyTorch, JAX preludes) equal the IR's."""
    from linnet.ir.library import rope_tables

    spec = dict(ROPE_BASE, **YARN)
    yarn = (32.0, 1.0, truncate, 0.1 * math.log(32.0) + 1)
    cos, sin = rope_tables(16, 40, **spec, truncate=truncate, attn_factor=yarn[3])
    args = (16, 40, 10000.0, "yarn", 32.0, 1.0, 4.0, 32, *yarn)
    t_cos, t_sin = torch_prelude.rope_tables(*args)
    j_cos, j_sin = jax_prelude.rope_tables(*args)
    for got, want, what in ((t_cos[:, :8], cos, "torch cos"), (t_sin[:, 8:], sin, "torch sin"),
                            (j_cos, cos, "jax cos"), (j_sin, sin, "jax sin")):  # fmt: skip
        assert_f32(torch.as_tensor(np.asarray(got)), torch.as_tensor(want), what, True)


def hf_sink_attention(q, k, v, sinks, window):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups, module.training = sinks, 2, False
    s, t = q.shape[2], k.shape[2]
    qpos = torch.arange(t - s, t)[:, None]
    kpos = torch.arange(t)[None]
    allowed = (kpos <= qpos) & ((kpos > qpos - window) if window else True)
    mask = torch.zeros(s, t).masked_fill(~allowed, -math.inf)
    out, _ = eager_attention_forward(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5)
    return out.transpose(1, 2)  # eager returns [B, S, H, D]


@pytest.mark.parametrize(("seq", "past", "window"), [(6, 0, 0), (6, 0, 3), (1, 7, 4), (3, 5, 0)])
def test_attention_sinks_vs_transformers(seq, past, window):
    q = rand(2, 4, seq, 16, seed=41)
    k, v = rand(2, 2, past + seq, 16, seed=42), rand(2, 2, past + seq, 16, seed=43)
    sinks = rand(4, seed=44, scale=2.0)
    attrs = dict(causal=True, q_offset=past, window=window, scale=None, sinks=True)
    got = run_op("attention", [q, k, v, sinks], **attrs)
    want = hf_sink_attention(q, k, v, sinks, window)
    assert_f32(got, want, f"sink attention S={seq} P={past} window={window}")
    without = run_op("attention", [q, k, v], **dict(attrs, sinks=False))
    assert float((without - want).abs().max()) > 1e-3, "the sinks made no difference"
    native = torch_prelude.attention_ref(q, k, v, True, past, window, None, sinks=sinks)
    assert_f32(native, want, "torch prelude sinks")
    q, k, v, sinks = (t.numpy() for t in (q, k, v, sinks))
    native = jax_prelude.attention_ref(q, k, v, True, past, window, None, sinks=sinks)
    assert_f32(torch.as_tensor(np.asarray(native)), want, "jax prelude sinks")


# -- the mixture of experts ----------------------------------------------------------------
EXPERTS, TOP_K, DIM, FFN = 4, 2, 16, 8


def assert_moe(got, want, what):
    """|Δ| <= max(3e-5, 2e-6 max|ref|) + 1e-5 |ref|. Outputs reach ~60 and each is a sum of
    terms that large, so an f32 evaluation's error scales with the largest output, not with
    its own element: transformers' own f32 result is 4.6e-5 (12 ulps of its largest output,
    47.8) from the f64 value for 9 spread tokens on an AVX-512 Xeon, where JAX's dense
    path, adding the experts in another order, is 7.2e-6 from it. 2e-6 max|ref| is ~25 ulps
    of the largest output; a wrong expert, weight or clamp is off by ~1."""
    atol = max(3e-5, 2e-6 * float(want.abs().max()))
    return assert_matches(got, want, what, atol=atol, rtol=1e-5)


def moe_weights(router: str, seed: int = 50) -> dict[str, torch.Tensor]:
    """Router "spread": random (tokens go to different experts); "one": every token picks
    experts 0 and 1 (zero weight, biased). Expert inputs large enough that the clamp at 7
    acts on many gate and up values."""
    w = dict(
        router_w=rand(EXPERTS, DIM, seed=seed),
        router_b=rand(EXPERTS, seed=seed + 1),
        w_in=rand(EXPERTS, DIM, 2 * FFN, seed=seed + 2),
        b_in=rand(EXPERTS, 2 * FFN, seed=seed + 3),
        w_out=rand(EXPERTS, FFN, DIM, seed=seed + 4, scale=0.3),
        b_out=rand(EXPERTS, DIM, seed=seed + 5),
    )
    if router == "one":
        w["router_w"] = torch.zeros(EXPERTS, DIM)
        w["router_b"] = torch.tensor([3.0, 2.0, -3.0, -4.0])
    return w


@torch.no_grad()
def hf_moe(x, w):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = _gpt_oss_config(hidden_size=DIM, intermediate_size=FFN)
    config._experts_implementation = "eager"  # transformers' own loop over the hit experts
    mlp = GptOssMLP(config)
    mlp.router.weight.copy_(w["router_w"])
    mlp.router.bias.copy_(w["router_b"])
    for name, hf in (("w_in", "gate_up_proj"), ("b_in", "gate_up_proj_bias"),
                     ("w_out", "down_proj"), ("b_out", "down_proj_bias")):  # fmt: skip
        getattr(mlp.experts, hf).copy_(w[name])
    return mlp(x)[0]


def _operands(x, w):
    return [x] + [w[k] for k in ("router_w", "router_b", "w_in", "b_in", "w_out", "b_out")]


def _chosen(x, w) -> set[int]:
    logits = x.reshape(-1, DIM) @ w["router_w"].T + w["router_b"]
    return set(torch.topk(logits, TOP_K, dim=-1).indices.flatten().tolist())


@pytest.mark.parametrize("router", ["spread", "one"])
@pytest.mark.parametrize("tokens", [1, 2, 9])  # 1 and 2: the gather path (N * k <= E)
def test_moe_vs_transformers(router, tokens):
    x = rand(1, tokens, DIM, seed=60 + tokens, scale=3.0)
    w = moe_weights(router)
    want = hf_moe(x, w)
    chosen = _chosen(x, w)
    if router == "one":
        assert chosen == {0, 1}
    elif tokens > 1:  # the tokens disagree: more than one pair of experts runs
        assert len(chosen) >= 3, chosen
    dense = run_op("moe", _operands(x, w), top_k=TOP_K, alpha=1.702, limit=7.0)
    assert_moe(dense, want, f"moe decomposition {router} N={tokens}")
    native = torch_prelude.moe_ref(*_operands(x, w), TOP_K, 1.702, 7.0)
    assert_moe(native, want, f"moe torch {router} N={tokens}")
    jax_out = jax_prelude.moe_ref(*(t.numpy() for t in _operands(x, w)), TOP_K, 1.702, 7.0)
    assert_moe(torch.as_tensor(np.asarray(jax_out)), want, f"moe jax {router} N={tokens}")


def test_moe_clamp_acts():
    """Without the clamp the outputs differ: the limit is exercised, not vacuous."""
    x = rand(1, 9, DIM, seed=69, scale=3.0)
    w = moe_weights("spread")
    clamped = run_op("moe", _operands(x, w), top_k=TOP_K, alpha=1.702, limit=7.0)
    free = run_op("moe", _operands(x, w), top_k=TOP_K, alpha=1.702, limit=1e6)
    assert float((clamped - free).abs().max()) > 1e-2


@pytest.mark.parametrize("tokens", [1, 2, 9])
def test_moe_native_reads_only_chosen_experts(tokens):
    """NaN in every expert no token chose leaves the native outputs finite and unchanged
    (the dense reference would turn NaN, 0 * NaN being NaN): a decode step reads k experts.
    JAX runs more tokens densely (static shapes), so only its gather path is held to it."""
    x = rand(1, tokens, DIM, seed=70 + tokens, scale=3.0)
    w = moe_weights("one")
    poisoned = dict(w)
    for name in ("w_in", "b_in", "w_out", "b_out"):
        poisoned[name] = w[name].clone()
        poisoned[name][2:] = float("nan")  # experts 2 and 3: never chosen by this router
    want = torch_prelude.moe_ref(*_operands(x, w), TOP_K, 1.702, 7.0)
    got = torch_prelude.moe_ref(*_operands(x, poisoned), TOP_K, 1.702, 7.0)
    assert_moe(got, want, f"torch moe, unchosen experts NaN, N={tokens}")
    if tokens * TOP_K <= EXPERTS:
        args = (t.numpy() for t in _operands(x, poisoned))
        got = torch.as_tensor(np.asarray(jax_prelude.moe_ref(*args, TOP_K, 1.702, 7.0)))
        assert_moe(got, want, f"jax moe, unchosen experts NaN, N={tokens}")
