"""Functions a source can call, and how each becomes Core-IR ops.

Each builtin has a signature (argument name, kind, default) and a body that
emits ops through the context's builder, so its shape rules are the op
table's rules in both checking and lowering.

Kinds: tensor, tensor? (none allowed), int, float, str, bool, axis, position (an int or
an i64[rows] vector of per-row starts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from linnet.core.dims import Poly
from linnet.ir.library import yarn_attn_factor
from linnet.ir.ops import norm_axis
from linnet.ir.types import OpTypeError


@dataclass(frozen=True)
class Builtin:
    name: str
    signature: tuple[tuple[str, str, object], ...]  # (name, kind, default or REQUIRED)
    body: Callable
    doc: str


REQUIRED = object()
BUILTINS: dict[str, Builtin] = {}


def builtin(name: str, *signature: tuple, doc: str = ""):
    def register(body: Callable) -> Callable:
        sig = tuple(s if len(s) == 3 else (s[0], s[1], REQUIRED) for s in signature)
        BUILTINS[name] = Builtin(name, sig, body, doc)
        return body

    return register


@builtin(
    "linear",
    ("x", "tensor"),
    ("w", "tensor"),
    ("b", "tensor?", None),
    doc="x @ w^T + b with w stored [out, in]",
)
def _linear(cx, x, w, b):
    return cx.add("linear", [x, w] + ([b] if b is not None else []))


@builtin("rms_norm", ("x", "tensor"), ("w", "tensor"), ("eps", "float"))
def _rms_norm(cx, x, w, eps):
    return cx.add("rms_norm", [x, w], eps=eps)


@builtin(
    "layer_norm",
    ("x", "tensor"),
    ("w", "tensor"),
    ("b", "tensor?"),
    ("eps", "float"),
    doc="(x - mean) / sqrt(var + eps) * w + b; b none: no bias (ModernBERT)",
)
def _layer_norm(cx, x, w, b, eps):
    if b is None:  # a zero bias made from w (folded at load), so the op keeps one form
        b = cx.add("mul", [w, cx.scalar(0.0, w.type.dtype)])
    return cx.add("layer_norm", [x, w, b], eps=eps)


@builtin("silu", ("x", "tensor"))
def _silu(cx, x):
    return cx.add("silu", [x])


@builtin("gelu", ("x", "tensor"), ("approx", "str", "none"))
def _gelu(cx, x, approx):
    if approx not in (None, "none", "tanh"):
        raise OpTypeError("unknown gelu approximation", '"none" or "tanh"', repr(approx))
    return cx.add("gelu", [x], approx=approx)


@builtin("softmax", ("x", "tensor"), ("axis", "int", Poly.const(-1)))
def _softmax(cx, x, axis):
    return cx.add("softmax", [x], axis=norm_axis(_const_axis(axis), x.type.rank))


@builtin("split_heads", ("x", "tensor"), ("n", "int"), doc="[B, S, n * d] -> [B, n, S, d]")
def _split_heads(cx, x, n):
    if x.type.rank != 3:
        raise OpTypeError("split_heads needs [B, S, features]", "rank 3", str(x.type))
    b, s, f = x.type.shape
    d = f.exact_div(n)
    if d is None:
        raise OpTypeError(
            "split_heads: features are not a multiple of the heads", f"a multiple of {n}", str(f)
        )
    x = cx.add("reshape", [x], shape=(b, s, n, d))
    return cx.add("transpose", [x], perm=(0, 2, 1, 3))


@builtin("merge_heads", ("x", "tensor"), doc="[B, H, S, d] -> [B, S, H * d]")
def _merge_heads(cx, x):
    if x.type.rank != 4:
        raise OpTypeError("merge_heads needs [B, H, S, d]", "rank 4", str(x.type))
    b, h, s, d = x.type.shape
    x = cx.add("transpose", [x], perm=(0, 2, 1, 3))
    return cx.add("reshape", [x], shape=(b, s, h * d))


@builtin(
    "rope",
    ("x", "tensor"),
    ("at", "position"),
    ("theta", "float"),
    ("scaling", "str", "default"),
    ("factor", "float", 1.0),
    ("low_freq", "float", 1.0),
    ("high_freq", "float", 4.0),
    ("original_max", "int", Poly.const(8192)),
    ("positions", "int"),
    ("beta_fast", "float", 32.0),
    ("beta_slow", "float", 1.0),
    ("truncate", "bool", True),
    ("attn_factor", "float", None),
    doc="rotary embedding (half rotation), tables built in f32 for `positions` rows; yarn: "
    "beta_fast, beta_slow, truncate, attn_factor (none: 0.1 ln(factor) + 1)",
)
def _rope(cx, x, at, theta, scaling, factor, low_freq, high_freq, original_max, positions, *yarn):
    if x.type.rank != 4:
        raise OpTypeError("rope needs [B, H, S, D]", "rank 4", str(x.type))
    if scaling not in (None, "default", "llama3", "yarn"):
        raise OpTypeError(
            "unsupported rope scaling", '"default", "llama3" or "yarn"', repr(scaling)
        )
    ins = [x]
    if isinstance(at, Poly):
        cx.require_le(at + x.type.shape[2], positions, "rope positions past the table")
    else:  # per-row starts: the runner checks them against the table on the host
        ins, at = [x, row_positions(cx, at, x.type.shape[0], x.type.shape[2])], Poly.const(0)
    attrs = dict(offset=at, theta=theta, scaling=scaling, factor=factor, low_freq=low_freq,
                 high_freq=high_freq, original_max=_maybe_int(original_max),
                 positions=_maybe_int(positions))  # fmt: skip
    if scaling == "yarn":  # only yarn ropes carry these (other graphs print as before)
        attrs.update(_yarn_attrs(factor, *yarn))
    return cx.add("rope", ins, **attrs)


def _yarn_attrs(factor, beta_fast, beta_slow, truncate, attn_factor) -> dict:
    if attn_factor is None and isinstance(factor, float):
        attn_factor = yarn_attn_factor(factor)
    return dict(
        beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate, attn_factor=attn_factor
    )


@builtin(
    "attention",
    ("q", "tensor"),
    ("k", "tensor"),
    ("v", "tensor"),
    ("causal", "bool", True),
    ("q_offset", "position", Poly.const(0)),
    ("window", "int", Poly.const(0)),
    ("scale", "float", None),
    ("mask", "tensor?", None),
    ("sinks", "tensor?", None),
    doc="softmax(q k^T * scale + mask) v; GQA from the head counts; window 0: none, else "
    "causal: the last `window` keys, bidirectional: keys within window // 2 either side; "
    "mask: a key padding mask [B, T] (nonzero attends); sinks: a logit per head [H] that "
    "joins each softmax's denominator (GPT-OSS)",
)
def _attention(cx, q, k, v, causal, q_offset, window, scale, mask, sinks):
    positions = []
    if not isinstance(q_offset, Poly):  # per-row starts: the query positions as a tensor
        positions = [row_positions(cx, q_offset, q.type.shape[0], q.type.shape[2])]
        q_offset = Poly.const(0)
    attrs = dict(causal=causal, q_offset=q_offset, window=_maybe_int(window), scale=scale)
    if sinks is not None:
        if mask is not None:
            raise OpTypeError("attention takes a mask or sinks, not both", "one", "both")
        return cx.add("attention", [q, k, v, sinks] + positions, sinks=True, **attrs)
    if mask is None:  # no attr at all: unmasked graphs print as they always did
        return cx.add("attention", [q, k, v] + positions, **attrs)
    return cx.add("attention", [q, k, v, mask] + positions, masked=True, **attrs)


@builtin(
    "positions",
    ("at", "tensor"),
    ("n", "int"),
    doc="per-row positions: at[b] .. at[b] + n for each start of at i64[B], as i64[B, n]",
)
def _positions(cx, at, n):
    return row_positions(cx, at, at.type.shape[0] if at.type.rank else Poly.const(0), n)


def row_positions(cx, at, rows: Poly, seq: Poly):
    """Per-row starts `at` i64[R] -> the positions at[r] + s of each row, i64[R, S]."""
    if at.type.rank != 1 or at.type.dtype != "i64" or at.type.shape[0] != rows:
        raise OpTypeError("per-row positions must be i64[rows]", f"i64[{rows}]", str(at.type))
    one = Poly.const(1)
    starts = cx.add("reshape", [at], shape=(rows, one))
    steps = cx.add("reshape", [_iota(cx, seq)], shape=(one, seq))
    return cx.add("add", [starts, steps])


@builtin(
    "moe",
    ("x", "tensor"),
    ("router_w", "tensor"),
    ("router_b", "tensor"),
    ("w_in", "tensor"),
    ("b_in", "tensor"),
    ("w_out", "tensor"),
    ("b_out", "tensor"),
    ("top_k", "int"),
    ("alpha", "float"),
    ("limit", "float"),
    doc="mixture of experts (GPT-OSS): top_k experts per token by the router, softmax over "
    "their logits; each expert a clamped SwiGLU with gate/up interleaved in w_in [E, D, 2F]",
)
def _moe(cx, x, router_w, router_b, w_in, b_in, w_out, b_out, top_k, alpha, limit):
    ins = [x, router_w, router_b, w_in, b_in, w_out, b_out]
    return cx.add("moe", ins, top_k=_maybe_int(top_k), alpha=alpha, limit=limit)


@builtin("cumsum", ("x", "tensor"), doc="running sum along the last axis")
def _cumsum(cx, x):
    """out[..., s] = sum of x[..., t] for t <= s: x masked by a lower triangle, then summed
    (S * S elements; exact for integers)."""
    *lead, seq = x.type.shape
    rows = cx.add("reshape", [_iota(cx, seq)], shape=(seq, Poly.const(1)))  # (S, 1)
    cols = cx.add("reshape", [_iota(cx, seq)], shape=(Poly.const(1), seq))  # (1, S)
    lower = cx.add("le", [cols, rows])  # (S, S): t <= s
    zero = cx.add("const", [], value=np.asarray(0), dtype=x.type.dtype)
    x = cx.add("reshape", [x], shape=(*lead, Poly.const(1), seq))  # (..., 1, S)
    return cx.add("reduce_sum", [cx.add("where", [lower, x, zero])], axis=-1, keepdims=False)


@builtin(
    "mean_pool",
    ("x", "tensor"),
    ("mask", "tensor"),
    doc="[B, S, D] averaged over the positions where mask [B, S] is nonzero -> [B, D]",
)
def _mean_pool(cx, x, mask):
    if x.type.rank != 3 or mask.type.rank != 2 or mask.type.shape != x.type.shape[:2]:
        raise OpTypeError("mean_pool needs x [B, S, D] and mask [B, S]", "[B, S, D], [B, S]",
                          f"{x.type}, {mask.type}")  # fmt: skip
    b, s, _ = x.type.shape
    weight = cx.add("cast", [mask], dtype=x.type.dtype)
    weight = cx.add("reshape", [weight], shape=(b, s, Poly.const(1)))  # (B, S, 1)
    total = cx.add("reduce_sum", [cx.add("mul", [x, weight])], axis=1, keepdims=False)
    count = cx.add("reduce_sum", [weight], axis=1, keepdims=False)  # (B, 1)
    tiny = cx.add("const", [], value=np.asarray(1e-9), dtype=x.type.dtype)
    return cx.add("div", [total, cx.add("maximum", [count, tiny])])  # as sentence-transformers


def _iota(cx, n: Poly):
    return cx.add("iota", [], length=n, start=Poly.const(0), dtype="i64")


# -- vision --------------------------------------------------------------------------
@builtin(
    "conv",
    ("x", "tensor"),
    ("w", "tensor"),
    ("b", "tensor?", None),
    ("stride", "int", Poly.const(1)),
    ("padding", "int", Poly.const(0)),
    ("dilation", "int", Poly.const(1)),
    ("groups", "int", Poly.const(1)),
    doc="2-D convolution: x [B, C, H, W], w [O, C / groups, KH, KW], zero padding on both sides",
)
def _conv(cx, x, w, b, stride, padding, dilation, groups):
    ins = [x, w] + ([b] if b is not None else [])
    # dilation and groups only where not 1, so existing graphs print as before
    extra = {k: _maybe_int(v) for k, v in (("dilation", dilation), ("groups", groups))}
    extra = {k: v for k, v in extra.items() if v != 1}
    return cx.add("conv", ins, stride=_maybe_int(stride), padding=_maybe_int(padding), **extra)


@builtin(
    "conv1d",
    ("x", "tensor"),
    ("w", "tensor"),
    ("b", "tensor?", None),
    ("stride", "int", Poly.const(1)),
    ("padding", "int", Poly.const(0)),
    doc="1-D convolution: x [B, C, T], w [O, C, K], zero padding on both sides",
)
def _conv1d(cx, x, w, b, stride, padding):
    ins = [x, w] + ([b] if b is not None else [])
    return cx.add("conv1d", ins, stride=_maybe_int(stride), padding=_maybe_int(padding))


@builtin(
    "max_pool",
    ("x", "tensor"),
    ("kernel", "int"),
    ("stride", "int", Poly.const(1)),
    ("padding", "int", Poly.const(0)),
    doc="2-D max pooling of [B, C, H, W] (padding never wins)",
)
def _max_pool(cx, x, kernel, stride, padding):
    kernel = _const_int(kernel, "kernel")
    return cx.add(
        "max_pool", [x], kernel=kernel, stride=_maybe_int(stride), padding=_maybe_int(padding)
    )


@builtin(
    "batch_norm",
    ("x", "tensor"),
    ("w", "tensor"),
    ("b", "tensor"),
    ("mean", "tensor"),
    ("var", "tensor"),
    ("eps", "float"),
    doc="inference batch norm over axis 1 (running mean and var), f32 inside",
)
def _batch_norm(cx, x, w, b, mean, var, eps):
    return cx.add("batch_norm", [x, w, b, mean, var], eps=eps)


@builtin("relu", ("x", "tensor"), doc="max(x, 0)")
def _relu(cx, x):
    return cx.add("maximum", [x, cx.scalar(0.0, x.type.dtype)])


@builtin("mean", ("x", "tensor"), ("axis", "int"), doc="mean over one axis, which is dropped")
def _mean(cx, x, axis):
    return cx.add(
        "reduce_mean", [x], axis=norm_axis(_const_axis(axis), x.type.rank), keepdims=False
    )


@builtin("to_tokens", ("x", "tensor"), doc="[B, C, H, W] -> [B, H * W, C] (row-major)")
def _to_tokens(cx, x):
    if x.type.rank != 4:
        raise OpTypeError("to_tokens needs [B, C, H, W]", "rank 4", str(x.type))
    b, c, h, w = x.type.shape
    x = cx.add("reshape", [x], shape=(b, c, h * w))
    return cx.add("transpose", [x], perm=(0, 2, 1))


@builtin("transpose", ("x", "tensor"), doc="the last two axes swapped ([B, C, T] -> [B, T, C])")
def _transpose(cx, x):
    rank = x.type.rank
    if rank < 2:
        raise OpTypeError("transpose needs two axes or more", "rank >= 2", str(x.type))
    return cx.add("transpose", [x], perm=tuple(range(rank - 2)) + (rank - 1, rank - 2))


@builtin("concat", ("a", "tensor"), ("b", "tensor"), ("axis", "int", Poly.const(1)))
def _concat(cx, a, b, axis):
    return cx.add("concat", [a, b], axis=norm_axis(_const_axis(axis), a.type.rank))


@builtin("expand", ("x", "tensor"), ("n", "int"), doc="[1, ...] -> [n, ...]: repeat the first axis")
def _expand(cx, x, n):
    if x.type.rank < 1 or x.type.shape[0] != Poly.const(1):
        raise OpTypeError("expand needs a first axis of size 1", "[1, ...]", str(x.type))
    return cx.add("broadcast", [x], shape=(n,) + x.type.shape[1:])


@builtin("cast_like", ("x", "tensor"), ("like", "tensor"), doc="x converted to like's dtype")
def _cast_like(cx, x, like):
    if x.type.dtype == like.type.dtype:
        return x
    return cx.add("cast", [x], dtype=like.type.dtype)


# -- image ops beyond convolution (issue 15) ----------------------------------------------
@builtin(
    "group_norm",
    ("x", "tensor"),
    ("w", "tensor"),
    ("b", "tensor"),
    ("groups", "int"),
    ("eps", "float"),
    doc="group norm of [B, C, ...] over `groups` groups of channels, f32 inside",
)
def _group_norm(cx, x, w, b, groups, eps):
    return cx.add("group_norm", [x, w, b], groups=_maybe_int(groups), eps=eps)


@builtin(
    "upsample_nearest",
    ("x", "tensor"),
    ("scale", "int", Poly.const(2)),
    doc="[B, C, H, W] -> [B, C, H * scale, W * scale], each pixel repeated",
)
def _upsample_nearest(cx, x, scale):
    return cx.add("upsample_nearest", [x], scale=_const_int(scale, "scale"))


@builtin(
    "from_tokens",
    ("x", "tensor"),
    ("h", "int"),
    ("w", "int"),
    doc="[B, h * w, C] -> [B, C, h, w]: the inverse of to_tokens",
)
def _from_tokens(cx, x, h, w):
    if x.type.rank != 3 or x.type.shape[1] != h * w:
        raise OpTypeError("from_tokens needs [B, h * w, C]", f"[B, {h * w}, C]", str(x.type))
    b, _, c = x.type.shape
    x = cx.add("reshape", [x], shape=(b, h, w, c))
    return cx.add("transpose", [x], perm=(0, 3, 1, 2))


@builtin("unsqueeze", ("x", "tensor"), ("axis", "int"), doc="a new axis of size 1 at `axis`")
def _unsqueeze(cx, x, axis):
    shape = list(x.type.shape)
    where = norm_axis(_const_axis(axis), len(shape) + 1)
    return cx.add("reshape", [x], shape=tuple(shape[:where] + [Poly.const(1)] + shape[where:]))


@builtin(
    "timestep_embedding",
    ("t", "tensor"),
    ("dim", "int"),
    ("flip", "bool", True),
    ("shift", "float", 0.0),
    doc="diffusers' sinusoidal timestep embedding: f32 [B] -> [B, dim], [B, N] -> [B, N * dim]",
)
def _timestep_embedding(cx, t, dim, flip, shift):
    return cx.add("timestep_embedding", [t], dim=_maybe_int(dim), flip=flip, shift=shift)


@builtin("l2_normalize", ("x", "tensor"), doc="x / ||x|| along the last axis (unit length)")
def _l2_normalize(cx, x):
    """x / sqrt(sum(x^2)) over the last axis, as `x / x.norm(p=2, dim=-1, keepdim=True)`."""
    total = cx.add("reduce_sum", [cx.add("mul", [x, x])], axis=-1, keepdims=True)
    return cx.add("div", [x, cx.add("sqrt", [total])])


def _cast(dtype: str):
    def body(cx, x):
        return cx.add("cast", [x], dtype=dtype)

    return body


for _dtype in ("f32", "f16", "bf16", "i64", "i32"):
    builtin(_dtype, ("x", "tensor"), doc=f"convert to {_dtype}")(_cast(_dtype))

for _name in ("exp", "tanh", "sqrt", "rsqrt", "sigmoid", "neg", "abs"):
    builtin(_name, ("x", "tensor"), doc=f"elementwise {_name}")(
        lambda cx, x, _op=_name: cx.add(_op, [x])
    )


def _maybe_int(p: Poly):
    return p.value if isinstance(p, Poly) and p.is_const else p


def _const_int(value: Poly, name: str) -> int:
    if not value.is_const:
        raise OpTypeError(f"{name} must be a constant", "an integer literal", str(value))
    return value.value


def _const_axis(axis: Poly) -> int:
    if not axis.is_const:
        raise OpTypeError("axis must be a constant", "an integer literal", str(axis))
    return axis.value


# the image builtins (issue 15: VAE encoder, SAM) register themselves on import
from linnet.check import builtins_image, builtins_sam  # noqa: E402, F401
