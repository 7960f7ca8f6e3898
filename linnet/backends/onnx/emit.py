"""The ONNX backend: one emitter per Core-IR op, writing ONNX nodes.

An emitter takes (attrs, b, *inputs), where inputs are ONNX value names and `b` is
the `OnnxBuilder` of the graph being written, and returns the name of the op's
result (None for guards, which the runtime checks on the host). Runtime dims
(B, S, P…) are computed in the graph from input shapes (`b.dim`), so one model
serves every batch, length and position.

Library ops with a native ONNX op (linear, layer_norm, softmax, silu, gelu, conv,
max_pool, batch_norm, group_norm; upsample_nearest as Resize) are emitted as that op,
attention as a short sequence (MatMul, an additive 0/-inf bias, Softmax, MatMul); the
others (rms_norm, rope) are decomposed into primitives first (`linnet/ir/library.py`), so
ONNX runs the reference's math.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from linnet.backends.emit import attention_operands, node_attrs
from linnet.backends.onnx import emit_moe
from linnet.core.dims import Poly
from linnet.core.dtypes import DTYPES, numpy_dtype
from linnet.errors import UnsupportedArchitecture
from linnet.ir.pipeline import ONNX_NATIVE_OPS

OPSET = 21  # Gelu (20), LayerNormalization (17), reduce axes as inputs (18)
IR_VERSION = 10  # what opset 21 needs; onnxruntime 1.20 and newer read it

ONNX_DTYPES = {name: getattr(TensorProto, d.onnx) for name, d in DTYPES.items()}


class OnnxBuilder:
    """Nodes and constants of one graph, and the runtime dims as 1-D int64 values."""

    def __init__(self, dim_sources: dict[str, tuple]) -> None:
        # atom -> (value, axis): a dim is an axis of an input, or (value, None) a scalar input
        self.dim_sources = dim_sources
        self.nodes: list = []
        self.constants: list = []
        self._names: set[str] = set()
        self._dims: dict[Poly, str] = {}
        self._consts: dict[tuple, str] = {}
        self.renamed: dict[str, str] = {}  # values renamed to a graph output's name
        self.output_names: set[str] = set()

    def fresh(self, hint: str) -> str:
        name, i = hint, 0
        while name in self._names:
            i += 1
            name = f"{hint}_{i}"
        self._names.add(name)
        return name

    def node(self, op_type: str, inputs: list[str], hint: str = "", **attrs) -> str:
        out = self.fresh(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def const(self, value, dtype: str = "i64") -> str:
        array = np.asarray(value, dtype=numpy_dtype(dtype))
        key = (dtype, array.shape, array.tobytes())
        if key not in self._consts:
            name = self.fresh("const")
            self.constants.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def typed_const(self, value, dtype: str) -> str:
        """A constant in any Core-IR dtype; bf16 (which numpy lacks) is cast from f32."""
        if dtype != "bf16":
            return self.const(value, dtype)
        return self.node("Cast", [self.const(value, "f32")], to=ONNX_DTYPES["bf16"])

    # -- runtime dims ------------------------------------------------------------------
    def dim(self, p) -> str:
        """A dim polynomial as a 1-D int64 value of one element."""
        p = Poly.lift(p)
        if p.is_const:
            return self.const([p.value])
        if p not in self._dims:
            self._dims[p] = self._dim_value(p)
        return self._dims[p]

    def _dim_value(self, p: Poly) -> str:
        atom = p.as_atom()
        if atom is not None:
            value, axis, *scale = self.dim_sources[atom]
            if axis is None:  # a scalar input such as the decode position
                return self.node("Reshape", [value, self.const([1])], hint=f"dim_{atom}")
            size = self.node("Shape", [value], hint=f"dim_{atom}", start=axis, end=axis + 1)
            return self.node("Div", [size, self.const(scale)]) if scale else size
        total = None
        for mono, coef in p.terms:
            term = self.const([coef])
            for a in mono:
                term = self.node("Mul", [term, self.dim(Poly.atom(a))])
            total = term if total is None else self.node("Add", [total, term])
        return total

    def scalar(self, p) -> str:
        """A dim polynomial as a 0-D int64 value (what Range takes)."""
        p = Poly.lift(p)
        if p.is_const:
            return self.const(p.value)
        return self.node("Squeeze", [self.dim(p), self.const([0])])

    def dims(self, ps) -> str:
        """A shape: a 1-D int64 value with one element per dim."""
        ps = [Poly.lift(p) for p in ps]
        if all(p.is_const for p in ps):
            return self.const([p.value for p in ps])
        return self.node("Concat", [self.dim(p) for p in ps], axis=0)


# -- emitters ----------------------------------------------------------------------------
def _const(a, b, *_):
    return b.typed_const(a["value"], a["dtype"])


def _iota(a, b):
    start = Poly.lift(a["start"])
    stop = start + Poly.lift(a["length"])
    out = b.node("Range", [b.scalar(start), b.scalar(stop), b.const(1)])
    return out if a["dtype"] == "i64" else b.node("Cast", [out], to=ONNX_DTYPES[a["dtype"]])


def _reduce(op_type):
    def emit(a, b, x):
        keep = int(a.get("keepdims", True))
        return b.node(op_type, [x, b.const([a["axis"]])], keepdims=keep)

    return emit


def _slice(a, b, x, shape=None):
    shape = shape or a["in_shape"]
    steps = a.get("steps") or (1,) * len(shape)
    axes = [
        i
        for i, (lo, hi) in enumerate(zip(a["starts"], a["stops"]))
        if Poly.lift(lo) != Poly.const(0) or Poly.lift(hi) != shape[i] or steps[i] != 1
    ]
    if not axes:
        return x
    starts = b.dims([a["starts"][i] for i in axes])
    stops = b.dims([a["stops"][i] for i in axes])
    inputs = [x, starts, stops, b.const(axes)]
    if any(steps[i] != 1 for i in axes):
        inputs.append(b.const([steps[i] for i in axes]))
    return b.node("Slice", inputs)


def _pad(a, b, x):
    pads = [lo for lo, _ in a["pads"]] + [hi for _, hi in a["pads"]]
    value = b.typed_const(a["value"], a["dtype"])
    return b.node("Pad", [x, b.const(pads), value], mode="constant")


def _window(a, kernel=None) -> dict:
    """Conv / pool attributes: square kernel, stride and zero padding on both sides."""
    stride, padding = a.get("stride", 1), a.get("padding", 0)
    attrs = dict(strides=[stride, stride], pads=[padding] * 4)
    if kernel is not None:
        attrs["kernel_shape"] = [kernel, kernel]
    return attrs


def _conv_extra(a) -> dict:
    """Conv's group and dilations, where the op has them."""
    dilation, groups = a.get("dilation", 1), a.get("groups", 1)
    return (
        dict(dilations=[dilation, dilation], group=groups) if (dilation, groups) != (1, 1) else {}
    )


def _write_box(b, x, shape, starts, sizes, write):
    """x with `write(box)` replacing the box at `starts` of `sizes`: along each axis the
    box does not cover, the rows before and after it are kept and concatenated around."""
    for axis, (lo, n) in enumerate(zip(starts, sizes)):
        lo, n = Poly.lift(lo), Poly.lift(n)
        if lo == Poly.const(0) and n == shape[axis]:
            continue
        zero = [Poly.const(0)] * len(shape)
        before = _slice({"starts": zero, "stops": _with(shape, axis, lo)}, b, x, shape)
        inner_starts = _with(zero, axis, lo)
        inside = _slice({"starts": inner_starts, "stops": _with(shape, axis, lo + n)}, b, x, shape)
        after_starts = _with(zero, axis, lo + n)
        after = _slice({"starts": after_starts, "stops": shape}, b, x, shape)
        middle = _write_box(b, inside, _with(shape, axis, n), _with(starts, axis, 0), sizes, write)
        return b.node("Concat", [before, middle, after], axis=axis)
    return write(x)


def _with(seq, i, value):
    out = list(seq)
    out[i] = Poly.lift(value)
    return out


def partial_axes(shape, starts, sizes) -> list[int]:
    return [
        i
        for i, (lo, n) in enumerate(zip(starts, sizes))
        if Poly.lift(lo) != Poly.const(0) or Poly.lift(n) != shape[i]
    ]


def _update_slice(a, b, x, update):
    shape, starts, sizes = a["in_shape"], a["starts"], a["sizes"]
    partial = partial_axes(shape, starts, sizes)
    if len(partial) == 1:  # a cache write: scatter the rows (one copy of x, not two)
        axis = partial[0]
        lo = Poly.lift(starts[axis])
        rows = b.node("Range", [b.scalar(lo), b.scalar(lo + sizes[axis]), b.const(1)])
        return _scatter_rows(b, x, update, rows, axis, len(shape))
    return _write_box(b, x, shape, starts, sizes, lambda box: update)


def _scatter_rows(b, x, update, rows, axis: int, rank: int, shaped: bool = False) -> str:
    """x with `update` written at `rows` (1-D) along `axis`, every other axis whole."""
    index = rows  # `shaped`: already of rank `rank` (per-row positions)
    if not shaped:
        index_shape = b.const([-1 if i == axis else 1 for i in range(rank)])
        index = b.node("Reshape", [rows, index_shape])
    index = b.node("Expand", [index, b.node("Shape", [update])])
    return b.node("ScatterElements", [x, index, update], axis=axis)


def _update_rows(a, b, x, update, positions):
    axis = a["axis"]
    rank = len(a["sizes"])
    if "row_axis" in a:  # [R, S] -> R at row_axis, S at axis, 1 elsewhere (row_axis < axis)
        ones = [i for i in range(rank) if i not in (a["row_axis"], axis)]
        positions = b.node("Unsqueeze", [positions, b.const(ones)])

    def scatter(box):
        return _scatter_rows(b, box, update, positions, axis, rank, "row_axis" in a)

    shape = list(a["in_shape"])
    sizes = _with(a["sizes"], axis, shape[axis])  # whole rows: the positions pick them
    return _write_box(b, x, shape, a["starts"], sizes, scatter)


def _linear(a, b, x, w, bias=None):
    y = b.node("MatMul", [x, b.node("Transpose", [w], perm=[1, 0])])
    return y if bias is None else b.node("Add", [y, bias])


def _cast_between(b, x, have: str, want: str) -> str:
    return x if have == want else b.node("Cast", [x], to=ONNX_DTYPES[want])


def _layer_norm(a, b, x, w, bias):
    # LayerNormalization computes in f32 (stash_type 1) like the reference; the reference
    # rounds to the input dtype before the scale, so low precision is left to it.
    return b.node("LayerNormalization", [x, w, bias], axis=-1, epsilon=a["eps"])


def _softmax(a, b, x):
    h = _cast_between(b, x, a["dtype"], "f32")
    return _cast_between(b, b.node("Softmax", [h], axis=a["axis"]), "f32", a["dtype"])


def _attention(a, b, q, k, v, *extra):
    """softmax(q k^T * scale + bias) v in a few ONNX ops: GQA by folding each kv head's q
    heads into rows (k and v are never repeated), the causal/window band and the key
    padding mask as one small additive bias of 0 / -inf, native Softmax. A query whose keys
    are all masked gives zeros, as in the reference (Softmax gives NaN there; the output
    rows are replaced, which is cheaper than touching the scores)."""
    key_mask, sinks, q_positions = attention_operands(a, extra)
    bsz, heads, seq, dim = a["q_shape"]
    kv, keys = a["k_shape"][1], a["k_shape"][2]
    groups = heads.value // kv.value
    q5 = b.node("Reshape", [q, b.dims((bsz, kv, groups, seq, dim))])
    k5 = b.node("Reshape", [k, b.dims((bsz, kv, 1, keys, dim))])
    v5 = b.node("Reshape", [v, b.dims((bsz, kv, 1, keys, dim))])
    scores = b.node("MatMul", [q5, b.node("Transpose", [k5], perm=[0, 1, 2, 4, 3])])
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(dim.value)
    scores = b.node("Mul", [scores, b.typed_const(scale, a["dtype"])])
    scores = _cast_between(b, scores, a["dtype"], "f32")  # (B, KV, G, S, T)
    bias = _attention_bias(a, b, q_positions, key_mask, bsz, seq, keys)
    if bias is not None:
        scores = b.node("Add", [scores, bias])
    if sinks is not None:
        probs = emit_moe.sink_probs(b, scores, sinks, b.const([1, kv.value, groups, 1, 1]))
    else:
        probs = b.node("Softmax", [scores], axis=-1)
    probs = _cast_between(b, probs, "f32", a["dtype"])
    out = b.node("MatMul", [probs, v5])  # (B, KV, G, S, D)
    if key_mask is not None:  # rows with no key left: zeros, not NaN
        seen = b.node("ReduceMax", [bias, b.const([-1])], keepdims=1)  # (.., S, 1)
        finite = b.node("Greater", [seen, b.typed_const(-math.inf, "f32")])
        out = b.node("Where", [finite, out, b.typed_const(0.0, a["dtype"])])
    return b.node("Reshape", [out, b.dims((bsz, heads, seq, dim))])


def _attention_bias(a, b, q_positions, key_mask, bsz, seq, keys):
    """0 where a query may see a key, -inf elsewhere: [S, T] for the band, [B, 1, 1, 1, T]
    for the padding mask, their sum when both apply (small next to the scores)."""
    zero, never = b.typed_const(0.0, "f32"), b.typed_const(-math.inf, "f32")
    bias = None
    if a["causal"] or a["window"]:
        if q_positions is None:
            start = Poly.lift(a["q_offset"])
            q_positions = b.node("Range", [b.scalar(start), b.scalar(start + seq), b.const(1)])
        per_row = [1, 2, 4] if a.get("per_row") else [1]  # (B, 1, 1, S, 1) per row
        qpos = b.node("Unsqueeze", [q_positions, b.const(per_row)])  # (S, 1)
        kpos = b.node("Range", [b.const(0), b.scalar(keys), b.const(1)])  # (T,)
        allowed = _band(a, b, qpos, kpos)
        bias = b.node("Where", [allowed, zero, never])
    if key_mask is not None:
        keep = b.node("Not", [b.node("Equal", [key_mask, b.typed_const(0, a["mask_dtype"])])])
        keep = b.node("Reshape", [keep, b.dims((bsz, 1, 1, 1, keys))])
        pad = b.node("Where", [keep, zero, never])
        bias = pad if bias is None else b.node("Add", [bias, pad])
    return bias


def _band(a, b, qpos, kpos):
    window = a["window"] or 0
    if not a["causal"]:  # symmetric: |q - k| <= window // 2
        half = b.const(window // 2)
        lo = b.node("GreaterOrEqual", [kpos, b.node("Sub", [qpos, half])])
        return b.node("And", [lo, b.node("LessOrEqual", [kpos, b.node("Add", [qpos, half])])])
    allowed = b.node("LessOrEqual", [kpos, qpos])
    if window:
        inside = b.node("Greater", [kpos, b.node("Sub", [qpos, b.const(window)])])
        allowed = b.node("And", [allowed, inside])
    return allowed


def _group_norm(a, b, x, w, bias):
    """x as [B, groups, rest] through InstanceNormalization (one kernel in onnxruntime, in
    f32), then w and b per channel in f32. onnxruntime's CPU provider has no
    GroupNormalization kernel: it expands opset 21's function into a dozen ops that also
    break its NCHWc layout between convolutions."""
    groups, rank = a["groups"], len(a["in_shape"])
    h = _cast_between(b, x, a["in_dtype"], "f32")
    h = b.node("Reshape", [h, b.const([0, groups, -1])])
    ones, zeros = b.const([1.0] * groups, "f32"), b.const([0.0] * groups, "f32")
    h = b.node("InstanceNormalization", [h, ones, zeros], epsilon=a["eps"])
    h = b.node("Reshape", [h, b.node("Shape", [x])])
    w, bias = (_cast_between(b, p, a["dtype"], "f32") for p in (w, bias))
    channels = Poly.lift(a["in_shape"][1])
    if channels.is_const:  # h * w + b as BatchNormalization of mean 0, variance 1, epsilon 0:
        # the same floats in one pass over h where Mul then Add take two
        stats = [b.const([v] * channels.value, "f32") for v in (0.0, 1.0)]
        y = b.node("BatchNormalization", [h, w, bias, *stats], epsilon=0.0)
        return _cast_between(b, y, "f32", a["dtype"])
    channel = b.const([-1] + [1] * (rank - 2))  # (C, 1, 1): per channel over H, W
    w, bias = (b.node("Reshape", [p, channel]) for p in (w, bias))
    return _cast_between(b, b.node("Add", [b.node("Mul", [h, w]), bias]), "f32", a["dtype"])


def _upsample_nearest(a, b, x):
    # output pixel i reads input floor(i / scale): the decomposition's repeat, exactly
    scales = b.const([1.0, 1.0, float(a["scale"]), float(a["scale"])], "f32")
    return b.node("Resize", [x, "", scales], mode="nearest",
                  coordinate_transformation_mode="asymmetric", nearest_mode="floor")  # fmt: skip


def _resize_bilinear(a, b, x):
    # half_pixel (not pytorch_half_pixel, which reads pixel 0 for a size of 1) clamped at
    # the edges is PyTorch's align_corners=False; sizes for the two spatial axes only
    mode = "align_corners" if a.get("align_corners", False) else "half_pixel"
    sizes = b.dims(tuple(a["size"]))
    return b.node("Resize", [x, "", "", sizes], mode="linear", axes=[2, 3],
                  coordinate_transformation_mode=mode)  # fmt: skip


UNARY = {
    "neg": "Neg",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "tanh": "Tanh",
    "erf": "Erf",
    "sin": "Sin",
    "cos": "Cos",
    "sigmoid": "Sigmoid",
    "abs": "Abs",
}
BINARY = {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "pow": "Pow",
    "maximum": "Max",
    "minimum": "Min",
    "lt": "Less",
    "le": "LessOrEqual",
    "gt": "Greater",
    "ge": "GreaterOrEqual",
    "eq": "Equal",
    "logical_and": "And",
    "logical_or": "Or",
}

EMITTERS = {
    "const": _const,
    "iota": _iota,
    "cast": lambda a, b, x: _cast_between(b, x, a["in_dtype"], a["dtype"]),
    "rsqrt": lambda a, b, x: b.node("Reciprocal", [b.node("Sqrt", [x])]),
    "ne": lambda a, b, x, y: b.node("Not", [b.node("Equal", [x, y])]),
    "where": lambda a, b, c, x, y: b.node("Where", [c, x, y]),
    "reduce_sum": _reduce("ReduceSum"),
    "reduce_max": _reduce("ReduceMax"),
    "reduce_mean": _reduce("ReduceMean"),
    "matmul": lambda a, b, x, y: b.node("MatMul", [x, y]),
    "reshape": lambda a, b, x: b.node("Reshape", [x, b.dims(a["shape"])]),
    "transpose": lambda a, b, x: b.node("Transpose", [x], perm=list(a["perm"])),
    "slice": _slice,
    "concat": lambda a, b, *xs: b.node("Concat", list(xs), axis=a["axis"]),
    "take": lambda a, b, table, idx: b.node("Gather", [table, idx], axis=0),
    "pad": _pad,
    "broadcast": lambda a, b, x: b.node("Expand", [x, b.dims(a["shape"])]),
    "update_slice": _update_slice,
    "update_rows": _update_rows,
    "guard": lambda a, b: None,  # checked on the host before each run (see onnx_graph)
    # library ops with a native ONNX op; the rest are decomposed before emission
    "linear": _linear,
    "layer_norm": _layer_norm,
    "softmax": _softmax,
    "silu": lambda a, b, x: b.node("Mul", [x, b.node("Sigmoid", [x])]),
    "gelu": lambda a, b, x: b.node("Gelu", [x], approximate=a.get("approx") or "none"),
    "conv": lambda a, b, *xs: b.node("Conv", list(xs), **_window(a), **_conv_extra(a)),
    "conv1d": lambda a, b, *xs: b.node(
        "Conv", list(xs), strides=[a.get("stride", 1)], pads=[a.get("padding", 0)] * 2
    ),
    "max_pool": lambda a, b, x: b.node("MaxPool", [x], **_window(a, a["kernel"])),
    "batch_norm": lambda a, b, *xs: b.node("BatchNormalization", list(xs), epsilon=a["eps"]),
    "attention": _attention,
    "group_norm": _group_norm,
    "upsample_nearest": _upsample_nearest,
    "resize_bilinear": _resize_bilinear,
    "moe": emit_moe.moe,
    "conv_transpose": lambda a, b, *xs: b.node("ConvTranspose", list(xs), **_window(a)),
}
for _name, _op in UNARY.items():
    EMITTERS[_name] = lambda a, b, x, _op=_op: b.node(_op, [x])
for _name, _op in BINARY.items():
    EMITTERS[_name] = lambda a, b, x, y, _op=_op: b.node(_op, [x, y])


def _collective(a, b, x):
    raise UnsupportedArchitecture(
        "ONNX has no collectives: export the single-device model (tensor parallelism is "
        "for linnet.torch and linnet.jax; docs/parallel.md)"
    )


EMITTERS["all_reduce"] = EMITTERS["all_gather"] = _collective  # issue 19
EMITTERS["to_device"] = EMITTERS["await_copy"] = lambda a, b, x: b.node("Identity", [x])

NATIVE_LIBRARY_OPS = ONNX_NATIVE_OPS  # the `onnx` pipeline decomposes the other library ops
assert NATIVE_LIBRARY_OPS <= EMITTERS.keys()


def emit(node, b: OnnxBuilder, inputs: list[str]) -> str | None:
    """The ONNX value holding one node's result (nodes are appended to `b`)."""
    attrs = node_attrs(node)
    if node.inputs:
        attrs["in_shape"] = node.inputs[0].type.shape
        attrs["in_dtype"] = node.inputs[0].type.dtype
    if node.output is not None:
        attrs.setdefault("dtype", node.output.type.dtype)
    if node.op == "attention":
        attrs["q_shape"], attrs["k_shape"] = node.inputs[0].type.shape, node.inputs[1].type.shape
        with_positions = len(node.inputs) > 3 + bool(attrs.get("masked"))
        attrs["per_row"] = with_positions and node.inputs[-1].type.rank == 2
        if attrs.get("masked"):
            attrs["mask_dtype"] = node.inputs[3].type.dtype
    return EMITTERS[node.op](attrs, b, *inputs)
