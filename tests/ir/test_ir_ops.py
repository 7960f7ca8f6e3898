"""Differential tests of the library ops' Core-IR decompositions.

Each test builds a one-op graph with `GraphBuilder` (the operands are graph
inputs), runs `decompose` and `verify`, interprets it with the PyTorch
`Interpreter`, and compares against an independent PyTorch / transformers
reference, asserting shape, then dtype, then values (the message names the
max |Δ|).

Tolerances
  f32:  |Δ| <= 1e-5 absolute (linear, softmax, silu, gelu, attention);
        rms_norm, layer_norm and rope: |Δ| <= 1e-5 * max(1, |ref|) (relative).
  bf16: |Δ| <= 2e-2 + 2e-2 * |ref| (a few bf16 ulps: a bf16 ulp at 1.0 is
        2^-7 ~ 7.8e-3; the decompositions round in different places than the
        fused torch kernels), and the result dtype must come back bf16.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from linnet.backends.torch.emit import EMITTERS  # noqa: E402
from linnet.backends.torch.interp import Interpreter  # noqa: E402
from linnet.core.dims import Poly  # noqa: E402
from linnet.ir.graph import Graph, GraphBuilder, TypeBuilder  # noqa: E402
from linnet.ir.library import DECOMPOSITIONS  # noqa: E402
from linnet.ir.ops import OPS  # noqa: E402
from linnet.ir.passes import decompose, verify  # noqa: E402
from linnet.ir.types import OpTypeError, TensorType  # noqa: E402
from tests import numeric  # noqa: E402

DTYPE_NAMES = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "bool",
}

F32_ATOL = 1e-5
F32_RTOL = 1e-5  # rope and norms: |Δ| <= F32_RTOL * max(1, |ref|)
BF16_ATOL = 2e-2
BF16_RTOL = 2e-2

MEASURED: dict[str, float] = {}  # test id -> max |Δ| (printed; see `-s`)


# -- harness -------------------------------------------------------------------------------
def tensor_type(t: torch.Tensor) -> TensorType:
    return TensorType(DTYPE_NAMES[t.dtype], tuple(Poly.const(s) for s in t.shape))


def run_op(
    op: str,
    inputs: list[torch.Tensor],
    *,
    types: list[TensorType] | None = None,
    dim_inputs: dict[str, str] | None = None,
    dim_values: dict[str, int] | None = None,
    **attrs,
) -> torch.Tensor:
    """One `op` node over graph inputs, decomposed, verified and interpreted."""
    graph = Graph(op, dim_inputs=dict(dim_inputs or {}))
    types = types or [tensor_type(t) for t in inputs]
    values = [graph.input(f"x{i}", ty) for i, ty in enumerate(types)]
    out = GraphBuilder(graph).add(op, values, **attrs)
    graph.outputs = [out]
    verify(graph)
    lowered = decompose(graph)
    verify(lowered)
    leftover = sorted({n.op for n in lowered.nodes if OPS[n.op].kind != "primitive"})
    assert not leftover, f"decompose left library ops: {leftover}"
    assert lowered.outputs[0].type == out.type, "decomposition changed the output type"
    result = Interpreter(lowered, {}).run(inputs, dim_values)[0]
    return result


def assert_matches(
    got: torch.Tensor, want: torch.Tensor, what: str, *, atol: float, rtol: float = 0.0
) -> float:
    """Shape, then dtype, then |got - want| <= atol + rtol * |want| elementwise (NaN fails)."""
    max_abs = numeric.assert_close(got, want, atol=atol, rtol=rtol, what=what, dtype=True)
    MEASURED[what] = max(max_abs, MEASURED.get(what, 0.0))
    print(f"{what}: max |Δ| = {max_abs:.3e}")
    return max_abs


def assert_f32(got, want, what, relative=False):
    if relative:
        return assert_matches(got, want, what, atol=F32_RTOL, rtol=F32_RTOL)
    return assert_matches(got, want, what, atol=F32_ATOL)


def assert_bf16(got, want, what):
    assert got.dtype == torch.bfloat16, f"{what}: dtype {got.dtype}, want bf16"
    return assert_matches(got, want, what, atol=BF16_ATOL, rtol=BF16_RTOL)


def rand(*shape, dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _with(value, index=1):
    t = torch.ones(2, 3)
    t.view(-1)[index] = value
    return t


@pytest.mark.parametrize(
    "got, want, match",
    [
        (_with(math.nan), torch.ones(2, 3), "NaN in 1 actual"),
        (torch.ones(2, 3), _with(math.nan), "NaN in 0 actual and 1 expected"),
        (_with(math.nan), _with(math.nan), "NaN in 1 actual and 1 expected"),
        (_with(math.inf), torch.ones(2, 3), "1 infinities do not match"),
        (_with(math.inf), _with(-math.inf), "1 infinities do not match"),
        (torch.ones(1, 3), torch.ones(2, 3), r"shape \(1, 3\), expected \(2, 3\)"),
        (torch.ones(3), torch.ones(1, 3), "shape"),  # would broadcast
        (torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(2, 3), "dtype bfloat16"),
        (_with(1.0 + 2e-5), torch.ones(2, 3), "1 of 6 elements past atol=1e-05"),
    ],
)
def test_the_comparison_fails_on_nan_infinities_shapes_dtypes_and_values(got, want, match):
    with pytest.raises(AssertionError, match=match):
        assert_matches(got, want, "harness", atol=1e-5)


def test_the_comparison_passes_equal_infinities_and_values_within_the_bound():
    assert assert_matches(_with(-math.inf), _with(-math.inf), "harness", atol=0.0) == 0.0
    assert assert_matches(_with(2.0), _with(1.9), "harness", atol=0.0, rtol=0.1) > 0.09
    MEASURED.pop("harness")


# -- the tables ----------------------------------------------------------------------------
def test_every_op_has_a_torch_emitter():
    """Primitives for the interpreter; library ops natively for generated source (their
    parity with the decompositions is tests/backends/test_torch_backend.py's business)."""
    missing = sorted(set(OPS) - set(EMITTERS))
    assert not missing, f"ops without a torch emitter: {missing}"
    stray = sorted(set(EMITTERS) - set(OPS))
    assert not stray, f"emitters for ops the table does not have: {stray}"


def test_every_library_op_has_a_decomposition():
    library = {name for name, d in OPS.items() if d.kind == "library"}
    missing = sorted(library - set(DECOMPOSITIONS))
    assert not missing, f"library ops without a decomposition: {missing}"
    stray = sorted(set(DECOMPOSITIONS) - library)
    assert not stray, f"decompositions of ops that are not library ops: {stray}"


def test_op_kinds_are_known():
    assert {d.kind for d in OPS.values()} <= {"primitive", "library"}


# -- op-rule failures ------------------------------------------------------------------------
def tt(dtype: str, *shape) -> TensorType:
    return TensorType(dtype, tuple(Poly.lift(d) for d in shape))


@pytest.mark.parametrize(
    "op, inputs, attrs, match",
    [
        ("matmul", [tt("f32", 2, 3), tt("f32", 4, 5)], {}, "inner dims"),
        ("matmul", [tt("f32", 3), tt("f32", 3, 2)], {}, "rank 2"),
        ("add", [tt("f32", 2, 3), tt("bf16", 2, 3)], {}, "dtype mismatch"),
        ("add", [tt("f32", 2, 3), tt("f32", 4, 3)], {}, "shape mismatch"),
        ("reshape", [tt("f32", 2, 3)], {"shape": (7,)}, "number of elements"),
        ("take", [tt("f32", 10, 4), tt("f32", 2, 3)], {}, "indices must be integers"),
        ("where", [tt("f32", 2), tt("f32", 2), tt("f32", 2)], {}, "bool condition"),
        ("transpose", [tt("f32", 2, 3)], {"perm": (0, 0)}, "permutation"),
        ("linear", [tt("f32", 2, 3), tt("f32", 4, 5)], {}, "input features"),
        ("rms_norm", [tt("i64", 2, 3), tt("i64", 3)], {"eps": 1e-5}, "float"),
        (
            "attention",
            [tt("f32", 1, 3, 2, 4), tt("f32", 1, 2, 2, 4), tt("f32", 1, 2, 2, 4)],
            {},
            "multiple of kv heads",
        ),
        ("rope", [tt("f32", 1, 2, 3, 5)], {}, "even head dim"),
        (
            "attention",
            [tt("f32", 2, 2, 3, 4), tt("f32", 2, 2, 5, 4), tt("f32", 2, 2, 5, 4), tt("i64", 2, 3)],
            {"masked": True},
            "mask must be \\[batch, keys\\]",
        ),
        (
            "attention",
            [tt("f32", 2, 2, 3, 4), tt("f32", 2, 2, 5, 4), tt("f32", 2, 2, 5, 4), tt("f32", 2, 5)],
            {"masked": True},
            "of integers or bool",
        ),
        (
            "attention",
            [tt("f32", 2, 2, 3, 4), tt("f32", 2, 2, 5, 4), tt("f32", 2, 2, 5, 4)],
            {"masked": True},
            "needs a mask operand",
        ),
    ],
)
def test_op_rule_failures_raise_op_type_error(op, inputs, attrs, match):
    with pytest.raises(OpTypeError, match=match):
        TypeBuilder().add(op, inputs, **attrs)


def test_symbolic_reshape_is_not_rejected():
    # B * S elements against a const count cannot be decided: the rule lets it through
    out = TypeBuilder().add("reshape", [tt("f32", Poly.atom("B"), 4)], shape=(Poly.atom("B"), 2, 2))
    assert out == tt("f32", Poly.atom("B"), 2, 2)


# -- elementwise and norms ---------------------------------------------------------------------
def llama_rms_norm(x, w, eps):
    """transformers' LlamaRMSNorm.forward, verbatim formula."""
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(x.dtype)


@pytest.mark.parametrize("shape", [(2, 5, 32), (3, 16)])
def test_rms_norm_f32(shape):
    x, w = rand(*shape, seed=1), rand(shape[-1], seed=2)
    got = run_op("rms_norm", [x, w], eps=1e-6)
    assert_f32(got, llama_rms_norm(x, w, 1e-6), f"rms_norm f32 {shape} vs LlamaRMSNorm", True)
    assert_f32(
        got, F.rms_norm(x, (shape[-1],), w, 1e-6), f"rms_norm f32 {shape} vs F.rms_norm", True
    )


def test_rms_norm_matches_transformers_module():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = rand(2, 4, 24, seed=3, scale=3.0)
    mod = LlamaRMSNorm(24, eps=1e-5)
    with torch.no_grad():
        mod.weight.copy_(rand(24, seed=4))
        want = mod(x)
    got = run_op("rms_norm", [x, mod.weight.detach()], eps=1e-5)
    assert_f32(got, want, "rms_norm f32 vs LlamaRMSNorm module", True)


def test_rms_norm_bf16():
    x, w = rand(2, 5, 64, dtype=torch.bfloat16, seed=5), rand(64, dtype=torch.bfloat16, seed=6)
    got = run_op("rms_norm", [x, w], eps=1e-5)
    assert_bf16(got, llama_rms_norm(x, w, 1e-5), "rms_norm bf16 vs LlamaRMSNorm")
    assert_bf16(got, F.rms_norm(x, (64,), w, 1e-5), "rms_norm bf16 vs F.rms_norm")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm(dtype):
    x = rand(2, 5, 32, dtype=dtype, seed=7, scale=2.0) + 0.5
    w, b = rand(32, dtype=dtype, seed=8), rand(32, dtype=dtype, seed=9)
    got = run_op("layer_norm", [x, w, b], eps=1e-5)
    want = F.layer_norm(x, (32,), w, b, 1e-5)
    if dtype == torch.float32:
        assert_f32(got, want, "layer_norm f32 vs F.layer_norm", True)
    else:
        assert_bf16(got, want, "layer_norm bf16 vs F.layer_norm")


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_f32(axis):
    x = rand(2, 6, 7, seed=10, scale=4.0)
    got = run_op("softmax", [x], axis=axis)
    assert_f32(got, torch.softmax(x, dim=axis), f"softmax f32 axis={axis}")


def test_softmax_large_logits_are_stable():
    x = rand(3, 9, seed=11, scale=200.0)  # exp overflows without the max shift
    got = run_op("softmax", [x], axis=-1)
    assert torch.isfinite(got).all()
    assert_f32(got, torch.softmax(x, dim=-1), "softmax f32 large logits")


def test_softmax_bf16():
    x = rand(2, 6, 16, dtype=torch.bfloat16, seed=12, scale=3.0)
    got = run_op("softmax", [x], axis=-1)
    assert_bf16(got, torch.softmax(x, dim=-1), "softmax bf16")


def test_silu():
    x = rand(4, 33, seed=13, scale=3.0)
    assert_f32(run_op("silu", [x]), F.silu(x), "silu f32")


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu(approx):
    x = rand(4, 33, seed=14, scale=3.0)
    got = run_op("gelu", [x], approx=approx)
    assert_f32(got, F.gelu(x, approximate=approx), f"gelu f32 approx={approx}")


def test_gelu_default_is_erf():
    x = rand(3, 10, seed=15, scale=2.0)
    assert_f32(run_op("gelu", [x]), F.gelu(x), "gelu f32 default")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("x_shape", [(5, 24), (2, 3, 24)])
def test_linear(bias, x_shape):
    x, w = rand(*x_shape, seed=16), rand(40, 24, seed=17)
    b = rand(40, seed=18) if bias else None
    got = run_op("linear", [x, w] + ([b] if bias else []))
    assert_f32(got, F.linear(x, w, b), f"linear f32 x{x_shape} bias={bias}")


# -- rope ----------------------------------------------------------------------------------------
ROPE_SPECS = {
    # name: (linnet rope attrs, transformers rope_parameters)
    "default": (
        dict(
            theta=10000.0,
            scaling="default",
            factor=1.0,
            low_freq=1.0,
            high_freq=4.0,
            original_max=8192,
        ),
        dict(rope_type="default", rope_theta=10000.0),
    ),
    "llama3": (
        dict(
            theta=500000.0,
            scaling="llama3",
            factor=8.0,
            low_freq=1.0,
            high_freq=4.0,
            original_max=8192,
        ),
        dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    ),
    # a short original context puts every band (high, medium, low) inside head_dim 16
    "llama3-short": (
        dict(
            theta=10000.0,
            scaling="llama3",
            factor=4.0,
            low_freq=1.0,
            high_freq=4.0,
            original_max=64,
        ),
        dict(
            rope_type="llama3",
            rope_theta=10000.0,
            factor=4.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
}


def hf_rope(x: torch.Tensor, offset: int, rope_parameters: dict) -> torch.Tensor:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    bsz, heads, seq, dim = x.shape
    config = LlamaConfig(
        hidden_size=heads * dim,
        num_attention_heads=heads,
        head_dim=dim,
        num_key_value_heads=heads,
        max_position_embeddings=131072,
        rope_parameters=dict(rope_parameters),
    )
    rotary = LlamaRotaryEmbedding(config)
    positions = torch.arange(offset, offset + seq)[None].expand(bsz, seq)
    cos, sin = rotary(x, positions)
    out, _ = apply_rotary_pos_emb(x, x, cos, sin)
    return out


@pytest.mark.parametrize("offset", [0, 5])
@pytest.mark.parametrize("spec", sorted(ROPE_SPECS))
def test_rope_vs_transformers(spec, offset):
    attrs, hf_params = ROPE_SPECS[spec]
    x = rand(2, 3, 6, 16, seed=19, scale=2.0)
    got = run_op("rope", [x], offset=offset, positions=32, **attrs)
    assert_f32(got, hf_rope(x, offset, hf_params), f"rope f32 {spec} offset={offset}", True)


def test_rope_specs_are_distinguishable():
    """The llama3 scaling moves the result by far more than the tolerance (not vacuous)."""
    x = rand(1, 2, 6, 16, seed=22)
    base = run_op("rope", [x], offset=5, positions=32, **ROPE_SPECS["default"][0])
    short = run_op("rope", [x], offset=5, positions=32, **ROPE_SPECS["llama3-short"][0])
    assert float((base - short).abs().max()) > 1e-3
    ref = hf_rope(x, 5, ROPE_SPECS["default"][1])
    assert float((short - ref).abs().max()) > 1e-3


def test_rope_bf16_vs_transformers():
    attrs, hf_params = ROPE_SPECS["llama3"]
    x = rand(1, 2, 5, 16, dtype=torch.bfloat16, seed=20)
    got = run_op("rope", [x], offset=3, positions=16, **attrs)
    assert_bf16(got, hf_rope(x, 3, hf_params), "rope bf16 llama3 offset=3")


def test_rope_symbolic_offset():
    """The offset as a runtime dim (what `decode` lowers to), S a runtime dim too."""
    attrs, hf_params = ROPE_SPECS["llama3-short"]
    x = rand(1, 2, 4, 16, seed=21)
    ty = TensorType("f32", (Poly.const(1), Poly.const(2), Poly.atom("S"), Poly.const(16)))
    got = run_op(
        "rope",
        [x],
        types=[ty],
        dim_inputs={"at": "P"},
        dim_values={"at": 9},
        offset=Poly.atom("P"),
        positions=32,
        **attrs,
    )
    assert_f32(got, hf_rope(x, 9, hf_params), "rope f32 symbolic offset=9", True)


# -- attention -----------------------------------------------------------------------------------
def visible(seq: int, keys: int, offset: int, causal: bool, window: int) -> torch.Tensor:
    """mask[i, j]: key j visible to query i (query i sits at position i + offset); a
    window without `causal` is symmetric: |i + offset - j| <= window // 2 (ModernBERT)."""
    mask = torch.ones(seq, keys, dtype=torch.bool)
    for i in range(seq):
        for j in range(keys):
            if window and not causal:
                mask[i, j] = abs(i + offset - j) <= window // 2
                continue
            if causal or window:
                mask[i, j] = j <= i + offset
            if window:
                mask[i, j] &= j > i + offset - window
    return mask


def sdpa_reference(q, k, v, *, causal, q_offset, window, scale=None, repeat=False):
    seq, keys = q.shape[2], k.shape[2]
    mask = None
    if causal or window:
        mask = visible(seq, keys, q_offset, causal, window)
    if repeat:
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def qkv(bsz, heads, kv_heads, seq, keys, dim, dtype=torch.float32, seed=30):
    return (
        rand(bsz, heads, seq, dim, dtype=dtype, seed=seed),
        rand(bsz, kv_heads, keys, dim, dtype=dtype, seed=seed + 1),
        rand(bsz, kv_heads, keys, dim, dtype=dtype, seed=seed + 2),
    )


ATTENTION_CASES = {
    # name: (heads, kv_heads, S, T, causal, q_offset, window, scale)
    "causal prefill": (4, 4, 7, 7, True, 0, 0, None),
    "causal decode 1 token": (4, 4, 1, 9, True, 8, 0, None),
    "causal decode chunk": (4, 4, 3, 10, True, 7, 0, None),
    "gqa 2 prefill": (4, 2, 6, 6, True, 0, 0, None),
    "gqa 2 decode": (4, 2, 2, 8, True, 6, 0, None),
    "gqa 4 prefill": (8, 2, 5, 5, True, 0, 0, None),
    "gqa 4 decode": (4, 1, 3, 9, True, 6, 0, None),
    "window prefill": (4, 2, 9, 9, True, 0, 3, None),
    "window decode": (4, 2, 3, 12, True, 9, 4, None),
    "window wider than context": (4, 4, 5, 5, True, 0, 16, None),
    "non-causal": (4, 2, 5, 7, False, 0, 0, None),
    "non-causal explicit scale": (4, 4, 4, 6, False, 0, 0, 0.3),
    "bidirectional window": (4, 2, 9, 9, False, 0, 4, None),  # |q - k| <= 2
    "bidirectional odd window": (4, 4, 7, 7, False, 0, 5, None),  # 5 // 2: also <= 2
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_f32(case):
    heads, kv_heads, seq, keys, causal, offset, window, scale = ATTENTION_CASES[case]
    q, k, v = qkv(2, heads, kv_heads, seq, keys, 8)
    got = run_op("attention", [q, k, v], causal=causal, q_offset=offset, window=window, scale=scale)
    kw = dict(causal=causal, q_offset=offset, window=window, scale=scale)
    assert_f32(got, sdpa_reference(q, k, v, **kw), f"attention f32 {case} (sdpa gqa)")
    assert_f32(
        got, sdpa_reference(q, k, v, repeat=True, **kw), f"attention f32 {case} (repeated kv)"
    )


def test_attention_causal_with_zero_offset_matches_is_causal():
    q, k, v = qkv(1, 4, 2, 6, 6, 8, seed=40)
    got = run_op("attention", [q, k, v], causal=True, q_offset=0)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert_f32(got, want, "attention f32 causal vs is_causal")


@pytest.mark.parametrize(
    "case",
    ["causal prefill", "gqa 2 decode", "gqa 4 prefill", "window decode", "non-causal",
     "bidirectional window"],
)  # fmt: skip
def test_attention_bf16(case):
    heads, kv_heads, seq, keys, causal, offset, window, scale = ATTENTION_CASES[case]
    q, k, v = qkv(1, heads, kv_heads, seq, keys, 16, dtype=torch.bfloat16, seed=50)
    got = run_op("attention", [q, k, v], causal=causal, q_offset=offset, window=window, scale=scale)
    want = sdpa_reference(q, k, v, causal=causal, q_offset=offset, window=window, scale=scale)
    assert_bf16(got, want, f"attention bf16 {case}")


def test_attention_symbolic_decode():
    """Shapes as `decode` lowers them: q [B, H, S, D], k and v [B, KV, P + S, D], q_offset P."""
    b_, s_, p_ = Poly.atom("B"), Poly.atom("S"), Poly.atom("P")
    q, k, v = qkv(2, 4, 2, 3, 8, 8, seed=60)
    types = [
        TensorType("f32", (b_, Poly.const(4), s_, Poly.const(8))),
        TensorType("f32", (b_, Poly.const(2), p_ + s_, Poly.const(8))),
        TensorType("f32", (b_, Poly.const(2), p_ + s_, Poly.const(8))),
    ]
    got = run_op(
        "attention",
        [q, k, v],
        types=types,
        dim_inputs={"at": "P"},
        dim_values={"at": 5},
        causal=True,
        q_offset=p_,
        window=0,
    )
    want = sdpa_reference(q, k, v, causal=True, q_offset=5, window=0)
    assert_f32(got, want, "attention f32 symbolic decode")


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    kv_heads=st.sampled_from([1, 2, 4]),
    seq=st.integers(1, 6),
    past=st.integers(0, 6),
    window=st.sampled_from([0, 1, 2, 5]),
    causal=st.booleans(),
    seed=st.integers(0, 99),
)
def test_attention_property(kv_heads, seq, past, window, causal, seed):
    q, k, v = qkv(1, 4, kv_heads, seq, seq + past, 4, seed=seed)
    offset = past if (causal or window) else 0
    got = run_op("attention", [q, k, v], causal=causal, q_offset=offset, window=window)
    want = sdpa_reference(q, k, v, causal=causal, q_offset=offset, window=window)
    assert_matches(got, want, "attention f32 property", atol=F32_ATOL)


# -- regressions: bugs this suite found, now fixed ------------------------------
@pytest.mark.parametrize(
    "op, inputs, attrs",
    [
        ("linear", [tt("f32", 2, 8), tt("f32", 3, 8), tt("f32", 3), tt("f32", 3)], {}),
        ("rms_norm", [tt("f32", 2, 8)], {"eps": 1e-5}),
        ("layer_norm", [tt("f32", 2, 8), tt("f32", 8)], {"eps": 1e-5}),
        ("exp", [tt("f32", 2, 8), tt("f32", 2, 8)], {}),
    ],
)
def test_op_rules_reject_a_wrong_number_of_operands(op, inputs, attrs):
    with pytest.raises(OpTypeError):
        TypeBuilder().add(op, inputs, **attrs)


@pytest.mark.parametrize("read", ["state", "slice"])
def test_update_slice_keeps_the_old_state_value(read):
    graph = Graph("step")
    x = graph.input("x", tt("f32", 2, 4))
    s = graph.state("s", tt("f32", 2, 4))
    b = GraphBuilder(graph)
    old = s if read == "state" else b.add("slice", [s], starts=(0, 0), stops=(2, 2))
    new = b.add("update_slice", [s, x], starts=(0, 0))
    graph.outputs = [old]
    graph.state_outputs = {"s": new}
    verify(graph)
    state = torch.zeros(2, 4)
    (got,) = Interpreter(graph, {}).run([torch.ones(2, 4)], {}, {"s": state})
    assert torch.equal(state, torch.ones(2, 4))  # the update itself lands (in place)
    assert torch.equal(got, torch.zeros_like(got)), f"the old state value reads {got}"


# -- vision: conv, max_pool, batch_norm, and the primitives they decompose into ------------
def assert_close(got, want, what):
    """f32 contractions over up to a few hundred terms: |Δ| <= 1e-5 * max(1, |ref|)."""
    return assert_matches(got, want, what, atol=F32_RTOL, rtol=F32_RTOL)


CONV_CASES = {
    # name: (x shape, w shape, stride, padding, bias)
    "3x3 same": ((2, 3, 9, 7), (5, 3, 3, 3), 1, 1, True),
    "3x3 stride 2": ((2, 4, 9, 8), (6, 4, 3, 3), 2, 1, False),
    "7x7 stride 2 stem": ((2, 3, 16, 15), (4, 3, 7, 7), 2, 3, False),
    "1x1": ((2, 6, 5, 5), (3, 6, 1, 1), 1, 0, False),
    "1x1 stride 2 shortcut": ((2, 6, 7, 6), (3, 6, 1, 1), 2, 0, False),
    "patches (vit)": ((2, 3, 16, 12), (8, 3, 4, 4), 4, 0, True),
    "patches, ragged edge": ((2, 3, 18, 13), (8, 3, 4, 4), 4, 0, True),
    "3x3 stride 3 pad 2": ((1, 2, 10, 10), (2, 2, 3, 3), 3, 2, True),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_f32(case):
    x_shape, w_shape, stride, padding, bias = CONV_CASES[case]
    x, w = rand(*x_shape, seed=70), rand(*w_shape, seed=71, scale=0.3)
    b = [rand(w_shape[0], seed=72)] if bias else []
    got = run_op("conv", [x, w] + b, stride=stride, padding=padding)
    want = F.conv2d(x, w, b[0] if b else None, stride, padding)
    assert_close(got, want, f"conv f32 {case} vs F.conv2d")


def test_conv_bf16():
    x, w = rand(2, 4, 8, 8, dtype=torch.bfloat16, seed=73), rand(6, 4, 3, 3, seed=74, scale=0.2)
    w = w.to(torch.bfloat16)
    got = run_op("conv", [x, w], stride=1, padding=1)
    assert_bf16(got, F.conv2d(x, w, None, 1, 1), "conv bf16 3x3 vs F.conv2d")


@pytest.mark.parametrize("kernel, stride, padding", [(3, 2, 1), (2, 2, 0), (3, 1, 1)])
def test_max_pool(kernel, stride, padding):
    x = rand(2, 3, 9, 8, seed=75) - 3.0  # all negative: zero padding would win, -inf must not
    got = run_op("max_pool", [x], kernel=kernel, stride=stride, padding=padding)
    want = F.max_pool2d(x, kernel, stride, padding)
    assert_matches(got, want, f"max_pool k{kernel} s{stride} p{padding}", atol=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm(dtype):
    from transformers.models.resnet.modeling_resnet import ResNetConvLayer

    layer = ResNetConvLayer(3, 6, kernel_size=3, activation=None).eval()
    bn = layer.normalization
    with torch.no_grad():
        for t, seed in ((bn.weight, 76), (bn.bias, 77), (bn.running_mean, 78)):
            t.copy_(rand(6, seed=seed))
        bn.running_var.copy_(rand(6, seed=79).abs() + 0.05)
    layer = layer.to(dtype)
    x = rand(2, 6, 5, 4, dtype=dtype, seed=80, scale=2.0)
    ps = [bn.weight, bn.bias, bn.running_mean, bn.running_var]
    got = run_op("batch_norm", [x] + [p.detach() for p in ps], eps=bn.eps)
    with torch.no_grad():
        want = bn(x)
    if dtype == torch.float32:
        assert_close(got, want, "batch_norm f32 vs nn.BatchNorm2d (eval)")
    else:
        assert_bf16(got, want, "batch_norm bf16 vs nn.BatchNorm2d (eval)")


def test_pad_and_strided_slice_primitives():
    x = rand(2, 3, 5, 4, seed=81)
    pads = ((0, 0), (1, 0), (2, 1), (0, 3))
    got = run_op("pad", [x], pads=pads, value=-1.5)
    assert_matches(got, F.pad(x, (0, 3, 2, 1, 1, 0), value=-1.5), "pad", atol=0.0)
    got = run_op("slice", [x], starts=(0, 1, 0, 1), stops=(2, 3, 5, 4), steps=(1, 1, 2, 2))
    assert_matches(got, x[:, 1:3, 0:5:2, 1:4:2], "strided slice", atol=0.0)
    got = run_op("broadcast", [x[:1, :, :1]], shape=(2, 3, 5, 4))
    assert_matches(got, x[:1, :, :1].expand(2, 3, 5, 4), "broadcast", atol=0.0)


def test_broadcast_symbolic_batch():
    cls = rand(1, 1, 8, seed=82)
    b_ = Poly.atom("B")
    x = rand(3, 4, 8, seed=83)
    graph = Graph("cls", dim_inputs={})
    xs = graph.input("x", TensorType("f32", (b_, Poly.const(4), Poly.const(8))))
    c = graph.param("cls", tensor_type(cls))
    bld = GraphBuilder(graph)
    out = bld.add("broadcast", [c], shape=(b_, 1, 8))
    graph.outputs = [bld.add("concat", [out, xs], axis=1)]
    verify(graph)
    (got,) = Interpreter(graph, {"cls": cls}).run([x])
    assert_matches(got, torch.cat([cls.expand(3, 1, 8), x], 1), "broadcast to B", atol=0.0)


@pytest.mark.parametrize(
    "op, inputs, attrs, match",
    [
        ("conv", [tt("f32", 1, 3, 8, 8), tt("f32", 4, 2, 3, 3)], {}, "shape mismatch in conv"),
        ("conv", [tt("f32", 1, 3, 8, 8), tt("f32", 4, 3, 3, 3), tt("f32", 3)], {}, "bias"),
        ("conv", [tt("f32", 3, 8, 8), tt("f32", 4, 3, 3, 3)], {}, "shape mismatch"),
        ("conv", [tt("f32", 1, 3, 8, 8), tt("f32", 4, 3, 3, 3)], {"stride": 0}, "stride"),
        ("max_pool", [tt("f32", 1, 3, 8, 8)], {"kernel": 2, "padding": 2}, "padding"),
        ("batch_norm", [tt("f32", 1, 3, 4, 4)] + [tt("f32", 4)] * 4, {"eps": 1e-5}, "axis 1"),
        ("pad", [tt("f32", 2, 3)], {"pads": ((0, 0),), "value": 0.0}, "per axis"),
        ("slice", [tt("f32", 4)], {"starts": (0,), "stops": (4,), "steps": (0,)}, "steps"),
        ("broadcast", [tt("f32", 2, 3)], {"shape": (4, 3)}, "size-1"),
    ],
)
def test_vision_op_rule_failures(op, inputs, attrs, match):
    with pytest.raises(OpTypeError, match=match):
        TypeBuilder().add(op, inputs, **attrs)


def test_param_only_nodes_are_folded_once_by_the_interpreter():
    """Batch norm's scale and shift read params only: the interpreter computes them at load,
    so a call runs only the nodes that touch the input."""
    graph = Graph("bn")
    x = graph.input("x", tt("f32", Poly.atom("B"), 3, 4, 4))
    ps = [graph.param(n, tt("f32", 3)) for n in ("w", "b", "mean", "var")]
    graph.outputs = [GraphBuilder(graph).add("batch_norm", [x] + ps, eps=1e-5)]
    flat = decompose(graph)
    params = {n: rand(3, seed=i).abs() + 0.1 for i, n in enumerate(("w", "b", "mean", "var"))}
    interp = Interpreter(flat, params)
    per_call = len(interp.steps)
    assert per_call < len(flat.nodes) and per_call <= 5, f"{per_call} of {len(flat.nodes)} per call"
    xin = rand(2, 3, 4, 4, seed=9)
    want = F.batch_norm(xin, params["mean"], params["var"], params["w"], params["b"], eps=1e-5)
    assert_close(interp.run([xin])[0], want, "folded batch_norm")


def test_report_measured_deltas():
    """Runs last in this file: prints the max |Δ| of every comparison above (`-s`)."""
    for name, delta in sorted(MEASURED.items()):
        print(f"  {name:60s} {delta:.3e}")
    assert all(math.isfinite(d) for d in MEASURED.values())


# -- attention with a key padding mask ---------------------------------------------------------
def padding_mask(lengths, keys, dtype=torch.int64):
    return (torch.arange(keys)[None, :] < torch.tensor(lengths)[:, None]).to(dtype)


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_key_mask_f32(mask_dtype, causal):
    q, k, v = qkv(3, 4, 2, 6, 6, 8)
    mask = padding_mask([6, 4, 1], 6, mask_dtype)
    got = run_op("attention", [q, k, v, mask], causal=causal, q_offset=0, masked=True)
    allowed = mask.bool()[:, None, None, :] & visible(6, 6, 0, causal, 0)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    assert_f32(got, want, f"attention f32 key mask {mask_dtype} causal={causal}")


def test_attention_key_mask_in_both_preludes_matches_the_decomposition():
    import jax.numpy as jnp

    from linnet.backends.jax import prelude as jax_prelude
    from linnet.backends.torch import prelude as torch_prelude

    q, k, v = qkv(3, 4, 2, 6, 6, 8)
    mask = padding_mask([6, 4, 2], 6)
    want = run_op("attention", [q, k, v, mask], causal=False, q_offset=0, masked=True)
    for fn in (torch_prelude.attention_ref, torch_prelude.attention_fast):
        got = fn(q, k, v, False, 0, 0, None, mask)
        assert_f32(got, want, f"torch {fn.__name__} key mask")
    j = [jnp.asarray(t.numpy()) for t in (q, k, v, mask)]
    for fn in (jax_prelude.attention_ref, jax_prelude.attention_fast):
        got = torch.from_numpy(np.array(fn(*j[:3], False, 0, 0, None, j[3])))
        assert_matches(got, want, f"jax {fn.__name__} key mask", atol=1e-5)


def test_bidirectional_window_with_a_key_mask_in_both_preludes():
    """ModernBERT's local layers: keys within window // 2 either side, and no padding key."""
    import jax.numpy as jnp

    from linnet.backends.jax import prelude as jax_prelude
    from linnet.backends.torch import prelude as torch_prelude

    q, k, v = qkv(3, 4, 2, 9, 9, 8, seed=70)
    mask = padding_mask([9, 8, 7], 9)  # every query keeps a key (see the test below)
    attrs = dict(causal=False, q_offset=0, window=4, masked=True)
    want = run_op("attention", [q, k, v, mask], **attrs)
    allowed = mask.bool()[:, None, None, :] & visible(9, 9, 0, False, 4)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    assert_f32(want, sdpa, "attention f32 bidirectional window + key mask")
    for fn in (torch_prelude.attention_ref, torch_prelude.attention_fast):
        assert_f32(fn(q, k, v, False, 0, 4, None, mask), want, f"torch {fn.__name__}")
    j = [jnp.asarray(t.numpy()) for t in (q, k, v, mask)]
    for fn in (jax_prelude.attention_ref, jax_prelude.attention_fast):
        got = torch.from_numpy(np.array(fn(*j[:3], False, 0, 4, None, j[3])))
        assert_matches(got, want, f"jax {fn.__name__} bidirectional window", atol=1e-5)


def test_a_query_with_every_key_masked_gets_zeros_not_nan():
    """A pad query whose local window holds only padding: zeros in the decomposition and
    every helper (NaN there would reach real rows through the next layer: 0 * NaN)."""
    import jax.numpy as jnp

    from linnet.backends.jax import prelude as jax_prelude
    from linnet.backends.torch import prelude as torch_prelude

    q, k, v = qkv(2, 2, 2, 8, 8, 4, seed=80)
    mask = padding_mask([8, 1], 8)  # row 1, query 7: window ±1 holds keys 6, 7 (padding)
    want = run_op("attention", [q, k, v, mask], causal=False, q_offset=0, window=2, masked=True)
    assert torch.isfinite(want).all() and torch.equal(want[1, :, 7], torch.zeros(2, 4))
    for fn in (torch_prelude.attention_ref, torch_prelude.attention_fast):
        assert_f32(fn(q, k, v, False, 0, 2, None, mask), want, f"torch {fn.__name__}")
    j = [jnp.asarray(t.numpy()) for t in (q, k, v, mask)]
    got = torch.from_numpy(np.array(jax_prelude.attention_ref(*j[:3], False, 0, 2, None, j[3])))
    assert_matches(got, want, "jax attention_ref fully masked row", atol=1e-5)
    fast = np.array(jax_prelude.attention_fast(*j[:3], False, 0, 2, None, j[3]))
    assert np.isfinite(fast).all()  # XLA fills with the lowest float: finite, not zero


def test_cumsum_and_mean_pool_builtins():
    from linnet.source import Source

    text = """model pool
config
  d: int = 3
dim B, S
params
  w: f32[d]
entry forward(ids: i64[B, S], x: f32[B, S, d]) -> f32[B, d]
  return mean_pool(x, cumsum(i64(ids != 0)))
"""
    src = Source.parse_text(text, "<pool>")
    graph = decompose(src.lower(src.config(), "forward"))
    verify(graph)
    ids = torch.tensor([[3, 0, 2, 5], [0, 0, 1, 0]])
    x = rand(2, 4, 3)
    got = Interpreter(graph, {}).run([ids, x])[0]
    weight = torch.cumsum((ids != 0).long(), -1)[..., None].float()  # 1 1 2 3 / 0 0 1 1
    want = (x * weight).sum(1) / weight.sum(1).clamp(min=1e-9)
    assert_f32(got, want, "mean_pool over cumsum weights")
