"""A decode layer's attention as one call (step_fusion.py, decode_ops.cpp's `attend_cached`;
docs/torch.md): the op against the separate ops it replaces, and the generated runner's
fused entries against the same runner without them.

- the op gives the separate ops' bits (Qwen3's per-head q/k norms, rope, the two cache
  writes, decode_attention, the heads merged) and leaves the same caches: f32 and bf16,
  GQA and MHA, the first and the last cache row, a window, sinks, no rope, an odd head
  dim, q/k/v at other columns, norms with and without rope;
- every tiny decoder in `generated`/`fast` gives the unfused runner's logits and caches
  bit for bit over a prompt and greedy steps, each step's attentions one call a layer
  (Qwen3's too, its q/k norms inside the call); a prompt and
  LINNET_KERNELS=0 run the source's ops under the call;
- the matcher refuses a group one of whose values is read elsewhere;
- the op refuses inconsistent operands with an error, and has a fake for tracing.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import linnet.torch as lt
from linnet.backends.torch import kernels, runners
from linnet.backends.torch import prelude as P
from linnet.backends.torch import step_kernels as SK
from linnet.backends.torch.step_fusion import attention_groups
from tests.checkpoints import TINY_CONFIGS, build_tiny, probe_ids

pytestmark = pytest.mark.skipif(
    not kernels.cpu_supported(), reason="the C++ kernels need an x86 CPU with AVX2"
)
N = 50  # cache rows


def _separate(y, lo, heads, tables, at, k_cache, v_cache, window, sinks, norms=None):
    """The source's ops as the unfused generated code runs them (the fast helpers)."""
    b, d, kv = y.shape[0], k_cache.shape[3], k_cache.shape[1]

    def split(start, n):
        return y[:, :, start : start + n * d].reshape(b, 1, n, d).permute(0, 2, 1, 3)

    q, k, v = split(lo[0], heads), split(lo[1], kv), split(lo[2], kv)
    if norms is not None:
        q, k = P.rms_norm_fast(q, norms[0], norms[2]), P.rms_norm_fast(k, norms[1], norms[2])
    if tables is not None:
        q, k = (P.rope_fast(x, *tables, at) for x in (q, k))
    k_cache[:, :, at : at + 1].copy_(k)
    v_cache[:, :, at : at + 1].copy_(v)
    keys, values = k_cache[:, :, : at + 1], v_cache[:, :, : at + 1]
    o = P.attention_fast(q, keys, values, True, at, window, None, None, sinks)
    return o.permute(0, 2, 1, 3).reshape(b, 1, heads * d)


CASES = [  # batch, heads, kv heads, head dim, at, window, sinks, rope, columns before q, norm
    (1, 9, 3, 64, 40, 0, False, True, 0, False),  # SmolLM2's attention
    (2, 6, 2, 16, 0, 0, False, True, 0, False),  # the first position
    (3, 6, 3, 40, N - 1, 7, True, True, 0, False),  # the cache's last row, a window, sinks
    (2, 4, 4, 17, 12, 0, False, False, 0, False),  # MHA, no rope (GPT-2), an odd head dim
    (1, 4, 2, 8, 30, 0, True, True, 5, False),  # q, k and v after five other columns
    (1, 8, 4, 32, 20, 0, False, True, 0, True),  # Qwen3: q and k normalised, then rotated
    (2, 4, 2, 17, 9, 4, True, False, 3, True),  # normalised, no rope, odd dim, a window
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("b", "heads", "kv", "d", "at", "window", "sinks", "rope", "pad", "norm"), CASES
)
def test_op_is_the_separate_ops_bit_for_bit(
    spy, dtype, b, heads, kv, d, at, window, sinks, rope, pad, norm
):
    g = torch.Generator().manual_seed(at * 7 + d)
    width = pad + (heads + 2 * kv) * d + 3
    y = (torch.randn(b, 1, width, generator=g) * 2).to(dtype)
    lo = (pad, pad + heads * d, pad + (heads + kv) * d)
    caches = (torch.randn(2, b, kv, N, d, generator=g) * 2).to(dtype)
    tables = P.rope_tables(d, N, 10000.0, "default", 1, 1, 1, 1) if rope else None
    s = torch.randn(heads, generator=g) if sinks else None
    weights = (torch.rand(2, d, generator=g) + 0.5).to(dtype)  # q's and k's norm weights
    norms = (weights[0], weights[1], 1e-6) if norm else None
    want_k, want_v = caches[0].clone(), caches[1].clone()
    want = _separate(y, lo, heads, tables, at, want_k, want_v, window, s, norms)
    separate_calls = dict(spy.calls)
    assert separate_calls.get("decode_attention") == 1  # the comparison is op against op
    assert separate_calls.get("rope", 0) == (2 if rope else 0)
    norm_op = "rms_norm" if dtype == torch.float32 else "rms_norm_bf16"
    assert separate_calls.get(norm_op, 0) == (2 if norm else 0)
    spy.calls.clear()
    k_cache, v_cache = caches[0].clone(), caches[1].clone()
    cos, sin = tables if rope else (None, None)
    got = SK.attend_cached(y, lo, heads, cos, sin, at, k_cache, v_cache, window, None, s, norms)
    assert spy.calls == {"attend_cached": 1}
    assert got.dtype == dtype and got.shape == (b, 1, heads * d)
    assert torch.equal(got, want)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def _decode(folder, dtype, steps=5):
    """A prompt, then greedy steps: every logits and the final caches."""
    model = lt.load(str(folder), mode="generated", numerics="fast", dtype=dtype)
    ids = probe_ids(model.hf_config["vocab_size"])[:1]
    model.reset()
    outs = [model.decode(ids, 0)]
    for _ in range(steps):
        outs.append(model.decode(outs[-1].argmax(-1)[:, None], model.position))
    return model, outs, {k: v.clone() for k, v in model.state.items()}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("key", sorted(TINY_CONFIGS), ids=lambda k: "-".join(k))
def test_fused_runner_gives_the_unfused_bits(spy, monkeypatch, key, dtype):
    folder = build_tiny(*key)
    steps = 5
    model, got, got_state = _decode(folder, dtype, steps)
    calls = spy.calls.get("attend_cached", 0)
    layers = len(model.runner.module.layers)
    groups = model.runner.text.split("    def decode(")[1].count("= _attend_cached(")
    assert groups == layers and calls == steps * layers  # the prompt: the source's ops
    monkeypatch.setattr(runners, "emit_fused", None)  # the runner as it was
    _, want, want_state = _decode(folder, dtype, steps)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(got_state[k], want_state[k]) for k in want_state)


def test_without_kernels_the_source_ops_run(spy, monkeypatch):
    """LINNET_KERNELS=0: the call answers None and the source's ops give the same logits
    as the unfused runner's PyTorch path."""
    folder = build_tiny("llama", "base")
    monkeypatch.setenv("LINNET_KERNELS", "0")
    _, got, _ = _decode(folder, "f32", steps=3)
    assert spy.calls == {}
    monkeypatch.setattr(runners, "emit_fused", None)
    _, want, _ = _decode(folder, "f32", steps=3)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_value_read_elsewhere_keeps_the_group_apart():
    """A graph output reading one layer's rotated q: that layer's nodes are written as
    before, the other layers still fuse."""
    model = lt.load(str(build_tiny("llama", "base")), mode="generated", numerics="fast")
    graph = model.runner.graphs["decode"]
    groups = attention_groups(graph)
    assert len(groups) == len(model.runner.module.layers) >= 2
    roped_q = groups[0].attention.inputs[0]
    leaked = dataclasses.replace(graph, outputs=[*graph.outputs, roped_q])
    kept = attention_groups(leaked)
    assert [g.attention for g in kept] == [g.attention for g in groups[1:]]


def test_op_refuses_inconsistent_operands(ops):
    """Each refused before anything is written: the caches stay as they were."""
    y = torch.randn(1, 1, 96)
    cos, sin = P.rope_tables(8, 8, 10000.0, "default", 1, 1, 1, 1)
    k, v = torch.zeros(2, 1, 2, 8, 8)
    good = (y, 0, 64, 80, 8, cos, sin, 3, k, v, 0.3, 0, None, None, None, 1e-6)
    assert ops.attend_cached(*good).shape == (1, 1, 64) and k[:, :, 3].abs().sum() > 0
    bad = {
        "at past the cache": {7: 8},
        "columns past y": {3: 90},
        "a bf16 cache": {9: torch.zeros_like(v, dtype=torch.bfloat16)},
        "heads not a multiple of the kv heads": {4: 7},
        "one table": {6: None},
        "start past at": {11: 4},
        "one norm weight": {13: torch.ones(8)},
        "norm weights not the head dim": {13: torch.ones(7), 14: torch.ones(7)},
        "bf16 norm weights for f32 y": {13: torch.ones(8).bfloat16(), 14: torch.ones(8).bfloat16()},
    }
    for what, change in bad.items():
        args = list(good)
        args[8], args[9] = torch.zeros_like(k), torch.zeros_like(v)
        for i, value in change.items():
            args[i] = value
        with pytest.raises(RuntimeError):
            ops.attend_cached(*args)
        assert not args[8].any() and not args[9].float().any(), what


def test_fake_shape_for_tracing(ops):
    k, v = torch.zeros(2, 1, 2, 8, 8)
    cos, sin = P.rope_tables(8, 8, 10000.0, "default", 1, 1, 1, 1)
    norms = (torch.rand(8) + 0.5, torch.rand(8) + 0.5, 1e-6)
    args = (torch.randn(1, 1, 96), 0, 64, 80, 8, cos, sin, 3, k, v, 0.3, 0, torch.randn(8), *norms)
    torch.library.opcheck(
        ops.attend_cached.default, args, test_utils=("test_schema", "test_faketensor")
    )
