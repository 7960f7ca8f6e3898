"""The op table: every Core-IR op with its shape and dtype rule.

Primitives are what backends must emit. Library ops (attention, norms, rope…)
keep their identity in the IR and carry a Core-IR decomposition
(`linnet/ir/library.py`) that is their numerical reference; a backend may emit
them natively only where a test shows parity with that decomposition.
Backends are tables `op name -> emitter` over this table (`linnet/backends/`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from linnet.core.dims import Poly
from linnet.ir.types import INT_DTYPES, OpTypeError, TensorType, is_float

Rule = Callable[[list[TensorType], dict], TensorType | None]


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str  # "primitive" or "library"
    rule: Rule  # shape and dtype rule; None result: the op has no output (guards)
    doc: str
    arity: tuple[int, int | None] = (1, 1)  # fewest and most operands (None: any)

    def infer(self, ins: list[TensorType], attrs: dict) -> TensorType | None:
        """The rule, after checking the operand count."""
        lo, hi = self.arity
        if len(ins) < lo or (hi is not None and len(ins) > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {'any' if hi is None else hi}"
            raise OpTypeError(f"{self.name} takes {want} operands", want, str(len(ins)))
        return self.rule(ins, attrs)


OPS: dict[str, OpDef] = {}


def op(name: str, kind: str = "primitive", doc: str = "", arity=(1, 1)):
    def register(rule: Rule) -> Rule:
        OPS[name] = OpDef(name, kind, rule, doc, tuple(arity))
        return rule

    return register


# -- helpers -------------------------------------------------------------------------
def same_dtype(types: list[TensorType], what: str) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise OpTypeError(
            f"dtype mismatch in {what}",
            "operands of one dtype",
            " and ".join(str(t) for t in types),
            "no implicit promotion: cast one side, e.g. f32(x)",
        )
    return types[0].dtype


def broadcast(types: list[TensorType], what: str) -> tuple[Poly, ...]:
    rank = max(t.rank for t in types)
    out: list[Poly] = []
    for axis in range(rank):
        dims = [t.shape[axis - rank + t.rank] for t in types if axis - rank + t.rank >= 0]
        wide = [d for d in dims if d != Poly.const(1)]
        if any(d != wide[0] for d in wide):
            raise OpTypeError(
                f"shape mismatch in {what}",
                "shapes that broadcast",
                " and ".join(str(t) for t in types),
            )
        out.append(wide[0] if wide else Poly.const(1))
    return tuple(out)


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise OpTypeError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def require_float(t: TensorType, what: str) -> None:
    if not is_float(t.dtype):
        raise OpTypeError(f"{what} needs a float tensor", "f32, f16 or bf16", str(t))


# -- primitives: creation and type ---------------------------------------------------
@op("const", arity=(0, 0), doc="a constant array (attrs: value, dtype)")
def _const(ins, attrs):
    return TensorType(attrs["dtype"], tuple(Poly.const(d) for d in attrs["value"].shape))


@op("iota", arity=(0, 0), doc="start, start+1, … (attrs: length, start, dtype)")
def _iota(ins, attrs):
    return TensorType(attrs["dtype"], (Poly.lift(attrs["length"]),))


@op("cast", doc="convert to attrs['dtype']")
def _cast(ins, attrs):
    return ins[0].with_dtype(attrs["dtype"])


UNARY = ("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos", "sigmoid", "abs")
BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
LOGICAL = ("logical_and", "logical_or")

for _name in UNARY:
    op(_name, doc=f"elementwise {_name}")(lambda ins, attrs: ins[0])


def _binary(ins, attrs):
    return TensorType(same_dtype(ins, "an elementwise op"), broadcast(ins, "an elementwise op"))


def _compare(ins, attrs):
    same_dtype(ins, "a comparison")
    return TensorType("bool", broadcast(ins, "a comparison"))


for _name in BINARY:
    op(_name, doc=f"elementwise {_name}, numpy broadcasting", arity=(2, 2))(_binary)
for _name in COMPARE + LOGICAL:
    op(_name, doc=f"elementwise {_name} to bool", arity=(2, 2))(_compare)


@op("where", arity=(3, 3), doc="where(cond, a, b)")
def _where(ins, attrs):
    cond, a, b = ins
    if cond.dtype != "bool":
        raise OpTypeError("where needs a bool condition", "bool", cond.dtype)
    return TensorType(same_dtype([a, b], "where"), broadcast(ins, "where"))


# -- reductions and contraction ---------------------------------------------------------
def _reduce(ins, attrs):
    x = ins[0]
    axis = norm_axis(attrs["axis"], x.rank)
    shape = list(x.shape)
    if attrs.get("keepdims", True):
        shape[axis] = Poly.const(1)
    else:
        del shape[axis]
    return x.with_shape(shape)


for _name in ("reduce_sum", "reduce_max", "reduce_mean"):
    op(_name, doc="reduce along attrs['axis'] (keepdims)")(_reduce)


@op("matmul", arity=(2, 2), doc="batched [..., M, K] @ [..., K, N] with broadcast batch dims")
def _matmul(ins, attrs):
    a, b = ins
    dtype = same_dtype(ins, "matmul")
    if a.rank < 2 or b.rank < 2:
        raise OpTypeError(
            "matmul needs operands of rank 2 or more", "[..., M, K] @ [..., K, N]", f"{a} @ {b}"
        )
    if a.shape[-1] != b.shape[-2]:
        raise OpTypeError(
            "shape mismatch in matmul: inner dims differ",
            f"[..., M, {a.shape[-1]}] @ [..., {a.shape[-1]}, N]",
            f"{a} @ {b}",
        )
    batch = broadcast([a.with_shape(a.shape[:-2]), b.with_shape(b.shape[:-2])], "matmul batch")
    return TensorType(dtype, batch + (a.shape[-2], b.shape[-1]))


# -- movement ---------------------------------------------------------------------------
@op("reshape", doc="same elements, attrs['shape']")
def _reshape(ins, attrs):
    x = ins[0]
    new = tuple(Poly.lift(d) for d in attrs["shape"])
    old_n, new_n = Poly.const(1), Poly.const(1)
    for d in x.shape:
        old_n = old_n * d
    for d in new:
        new_n = new_n * d
    if (old_n.is_const and new_n.is_const) and old_n != new_n:
        raise OpTypeError("reshape changes the number of elements", str(old_n), str(new_n))
    return x.with_shape(new)


@op("transpose", doc="permute axes by attrs['perm']")
def _transpose(ins, attrs):
    x = ins[0]
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise OpTypeError("bad permutation", f"a permutation of {x.rank} axes", str(perm))
    return x.with_shape([x.shape[p] for p in perm])


@op(
    "slice",
    doc="x[starts[i] : stops[i] : steps[i]] on every axis; bounds may be runtime dims; "
    "attrs['steps'] (optional, constants >= 1) takes every steps[i]-th element",
)
def _slice(ins, attrs):
    x = ins[0]
    starts, stops = attrs["starts"], attrs["stops"]
    steps = attrs.get("steps") or (1,) * x.rank
    if len(starts) != x.rank or len(stops) != x.rank or len(steps) != x.rank:
        raise OpTypeError("slice needs a bound per axis", str(x.rank), str(len(starts)))
    if any(not isinstance(k, int) or k < 1 for k in steps):
        raise OpTypeError("slice steps must be constants >= 1", ">= 1", str(steps))
    return x.with_shape(
        [
            (Poly.lift(e) - Poly.lift(s) + (k - 1)).floordiv(k)
            for s, e, k in zip(starts, stops, steps)
        ]
    )


@op("pad", doc="x padded with attrs['value'] by attrs['pads'] = ((lo, hi), ...) per axis")
def _pad(ins, attrs):
    x = ins[0]
    pads = attrs["pads"]
    if len(pads) != x.rank or any(lo < 0 or hi < 0 for lo, hi in pads):
        raise OpTypeError("pad needs (lo, hi) >= 0 per axis", f"{x.rank} pairs", str(pads))
    return x.with_shape([d + lo + hi for d, (lo, hi) in zip(x.shape, pads)])


@op("broadcast", doc="x repeated along its size-1 axes to attrs['shape'] (same rank)")
def _broadcast(ins, attrs):
    x = ins[0]
    shape = tuple(Poly.lift(d) for d in attrs["shape"])
    if len(shape) != x.rank or any(d != Poly.const(1) and d != s for d, s in zip(x.shape, shape)):
        raise OpTypeError("broadcast needs size-1 or equal axes", str(x), str(list(shape)))
    return x.with_shape(shape)


@op("concat", arity=(1, None), doc="join along attrs['axis']")
def _concat(ins, attrs):
    axis = norm_axis(attrs["axis"], ins[0].rank)
    dtype = same_dtype(ins, "concat")
    total = Poly.const(0)
    for t in ins:
        if t.rank != ins[0].rank or any(
            t.shape[i] != ins[0].shape[i] for i in range(t.rank) if i != axis
        ):
            raise OpTypeError("shape mismatch in concat", str(ins[0]), str(t))
        total = total + t.shape[axis]
    shape = list(ins[0].shape)
    shape[axis] = total
    return TensorType(dtype, tuple(shape))


@op("take", arity=(2, 2), doc="rows of a table: table[indices] along axis 0")
def _take(ins, attrs):
    table, idx = ins
    if idx.dtype not in INT_DTYPES:
        raise OpTypeError("indices must be integers", "i64 or i32", str(idx))
    return TensorType(table.dtype, idx.shape + table.shape[1:])


@op("update_slice", arity=(2, 2), doc="x with `update` written at attrs['starts'] (functional)")
def _update_slice(ins, attrs):
    x, upd = ins
    same_dtype(ins, "a state write")
    if upd.rank != x.rank:
        raise OpTypeError("update rank differs from the target", str(x), str(upd))
    return x


@op(
    "update_rows",
    arity=(3, 3),
    doc="x with `update` written along attrs['axis'] at `positions` (functional; other axes "
    "at attrs['starts']): i64[S] for every row, or i64[R, S] per row of attrs['row_axis']",
)
def _update_rows(ins, attrs):
    x, upd, positions = ins
    same_dtype([x, upd], "a state write")
    rank, rows_first = (2, attrs["row_axis"] < attrs["axis"]) if "row_axis" in attrs else (1, 1)
    bad = positions.rank != rank or not rows_first or positions.dtype not in INT_DTYPES
    if upd.rank != x.rank or bad:
        raise OpTypeError(
            "update_rows needs an update of the target's rank and integer positions",
            f"{x} and i64 of rank {rank}",
            f"{upd} and {positions}",
        )
    return x


@op("guard", arity=(0, 0), doc="runtime check attrs['lhs'] <= attrs['rhs']; no output")
def _guard(ins, attrs):
    return None


# -- library ops (decompositions in linnet/ir/library.py) ----------------------------------
@op("linear", "library", "x @ w^T + b, w is [out, in]", arity=(2, 3))
def _linear(ins, attrs):
    x, w = ins[0], ins[1]
    dtype = same_dtype(ins, "linear")
    if x.rank < 1:
        raise OpTypeError("linear needs an input with a feature axis", "[..., in]", str(x))
    if w.rank != 2 or x.shape[-1] != w.shape[1]:
        raise OpTypeError(
            "shape mismatch in linear: input features differ",
            f"x[..., {w.shape[1] if w.rank == 2 else 'in'}] with w[out, in]",
            f"x {x} and w {w}",
        )
    if len(ins) == 3 and (ins[2].rank != 1 or ins[2].shape[0] != w.shape[0]):
        raise OpTypeError("shape mismatch in linear: bias", f"[{w.shape[0]}]", str(ins[2]))
    return TensorType(dtype, x.shape[:-1] + (w.shape[0],))


def _norm(ins, attrs):
    x = ins[0]
    require_float(x, "a norm")
    if x.rank < 1:
        raise OpTypeError("a norm needs an input with a feature axis", "[..., features]", str(x))
    same_dtype(ins, "a norm")
    for p in ins[1:]:
        if p.rank != 1 or p.shape[0] != x.shape[-1]:
            raise OpTypeError(
                "shape mismatch in a norm: weight must match the last axis",
                f"[{x.shape[-1]}]",
                str(p),
            )
    return x


op("rms_norm", "library", "x / sqrt(mean(x^2) + eps) * w, f32 inside", (2, 2))(_norm)
op("layer_norm", "library", "(x - mean) / sqrt(var + eps) * w + b, f32 inside", (3, 3))(_norm)


def _float_unary(ins, attrs):
    require_float(ins[0], "this op")
    return ins[0]


@op("softmax", "library", "softmax along attrs['axis'], f32 inside")
def _softmax(ins, attrs):
    norm_axis(attrs.get("axis", -1), ins[0].rank)
    return _float_unary(ins, attrs)


op("silu", "library", "x * sigmoid(x)")(_float_unary)
op("gelu", "library", "gelu, attrs['approx'] = 'none' (erf) or 'tanh'")(_float_unary)


@op(
    "rope",
    "library",
    "rotary embedding of [B, H, S, D] at positions offset+0..S (f32 tables), or at a "
    "positions tensor given as a second operand: i64[S], or i64[B, S] per row",
    arity=(1, 2),
)
def _rope(ins, attrs):
    x = ins[0]
    require_float(x, "rope")
    if x.rank != 4:
        raise OpTypeError("rope needs [B, H, S, D]", "rank 4", str(x))
    d = x.shape[-1]
    if d.is_const and d.value % 2:
        raise OpTypeError("rope needs an even head dim", "even", str(d))
    return x


@op(
    "attention",
    "library",
    "softmax(q k^T * scale + mask) v with GQA, causal/window masks (a window without causal: "
    "|q - k| <= window // 2, symmetric); with attrs['masked'] "
    "the next operand is a key padding mask [B, T] (nonzero: attend); with attrs['sinks'] the "
    "next one holds a logit per head that joins each softmax's denominator (GPT-OSS); an "
    "optional last operand gives the query positions as a tensor (instead of q_offset): "
    "[S] or [B, S]",
    arity=(3, 6),
)
def _attention(ins, attrs):
    q, k, v = ins[:3]
    if attrs.get("masked"):
        _key_mask(q, k, ins[3] if len(ins) > 3 else None)
    if attrs.get("sinks"):
        ops_moe.check_sinks(q, ins[4 if attrs.get("masked") else 3])
    dtype = same_dtype(ins[:3], "attention")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank != 4:
            raise OpTypeError(f"attention needs {name} as [B, H, S, D]", "rank 4", str(t))
    if k.shape != v.shape:
        raise OpTypeError("shape mismatch in attention: k and v differ", str(k), str(v))
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise OpTypeError(
            "shape mismatch in attention: batch or head dim of q and k differ",
            f"k like [{q.shape[0]}, H_kv, T, {q.shape[3]}]",
            str(k),
        )
    hq, hk = q.shape[1], k.shape[1]
    if hq.is_const and hk.is_const and hq.value % hk.value:
        raise OpTypeError(
            "attention heads must be a multiple of kv heads",
            f"{hk} divides {hq}",
            f"{hq} heads, {hk} kv heads",
        )
    return TensorType(dtype, q.shape)


def _key_mask(q: TensorType, k: TensorType, mask: TensorType | None) -> None:
    """A key padding mask is [B, T]: one flag per key of each sequence."""
    want = f"i64, i32 or bool [{q.shape[0]}, {k.shape[2] if k.rank == 4 else 'T'}]"
    if mask is None:
        raise OpTypeError("attention with masked=True needs a mask operand", want, "none")
    if (
        mask.rank != 2
        or mask.dtype not in INT_DTYPES + ("bool",)
        or k.rank != 4
        or mask.shape != (q.shape[0], k.shape[2])
    ):
        raise OpTypeError(
            "attention mask must be [batch, keys] of integers or bool",
            want,
            str(mask),
            "a padding mask has one flag per key: 1 attends, 0 is padding",
        )


# Ops registered from their own modules: the image ops (convolution, pooling, batch and
# group norm, nearest upsampling), the moe op, the 1-D signal ops (conv1d), the
# tensor-parallel collectives (all_reduce, all_gather), the UNet's timestep embedding,
# device moves (to_device, await_copy), SAM's conv_transpose.
from linnet.ir import (  # noqa: E402, F401, I001
    ops_collective,
    ops_image,
    ops_moe,
    ops_placement,
    ops_sam,
    ops_signal,
    ops_unet,
)
