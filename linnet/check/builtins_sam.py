"""Builtins for SAM (zoo/sam.linnet, issue 15): windowed attention over a token grid,
decomposed relative positions, random-Fourier point features and the point batch.

None is an op of its own: each emits primitives (reshape, pad, transpose, slice, take,
matmul, sin, cos) and the library `softmax`, so every backend runs them as they are.
While checking, sizes that depend on the config are symbols; where a primitive needs a
number (a pad amount, a constant table) the checker gets the result's type alone.
"""

from __future__ import annotations

import math

import numpy as np

from linnet.check.builtins import builtin
from linnet.check.values import TVal
from linnet.core.dims import Poly
from linnet.ir.types import OpTypeError, TensorType


def _side_of(tokens: Poly, side: Poly, what: str):
    if tokens != side * side:
        raise OpTypeError(f"{what} needs side * side tokens", str(side * side), str(tokens))


def _windows_per_side(side: Poly, window: Poly) -> Poly:
    return (side + window - 1).floordiv(window)


def _typed(cx, dtype: str, shape: tuple) -> TVal:
    """A value of this type while checking (no data: the checker only needs its type)."""
    t = TensorType(dtype, tuple(Poly.lift(d) for d in shape))
    return TVal(t, t)


@builtin(
    "grid_tokens",
    ("x", "tensor"),
    doc="[B, H, W, C] -> [B, H * W, C] (a channels-last grid as a sequence)",
)
def _grid_tokens(cx, x):
    if x.type.rank != 4:
        raise OpTypeError("grid_tokens needs [B, H, W, C]", "rank 4", str(x.type))
    b, h, w, c = x.type.shape
    return cx.add("reshape", [x], shape=(b, h * w, c))


@builtin(
    "window_partition",
    ("x", "tensor"),
    ("side", "int"),
    ("window", "int"),
    doc="[B, side * side, C] -> [B * n * n, window * window, C], n = ceil(side / window): "
    "the grid zero-padded at its end to n * window, cut into windows (row-major)",
)
def _window_partition(cx, x, side, window):
    if x.type.rank != 3:
        raise OpTypeError("window_partition needs [B, T, C]", "rank 3", str(x.type))
    b, t, c = x.type.shape
    _side_of(t, side, "window_partition")
    n = _windows_per_side(side, window)
    padded = n * window
    x = cx.add("reshape", [x], shape=(b, side, side, c))
    extra = padded - side
    if extra.is_const and cx.lowering:
        if extra.value:
            pads = ((0, 0), (0, extra.value), (0, extra.value), (0, 0))
            x = cx.add("pad", [x], pads=pads, value=0.0)
    else:  # checking: the pad amount is a symbol
        x = _typed(cx, x.type.dtype, (b, padded, padded, c))
    x = cx.add("reshape", [x], shape=(b, n, window, n, window, c))
    x = cx.add("transpose", [x], perm=(0, 1, 3, 2, 4, 5))
    return cx.add("reshape", [x], shape=(b * n * n, window * window, c))


@builtin(
    "window_merge",
    ("x", "tensor"),
    ("side", "int"),
    ("window", "int"),
    ("batch", "int"),
    doc="the inverse of window_partition: [batch * n * n, window * window, C] -> "
    "[batch, side * side, C], the padding dropped",
)
def _window_merge(cx, x, side, window, batch):
    n = _windows_per_side(side, window)
    if x.type.rank != 3 or x.type.shape[0] != batch * n * n or x.type.shape[1] != window * window:
        want = f"[{batch * n * n}, {window * window}, C]"
        raise OpTypeError("window_merge needs the windows of a grid", want, str(x.type))
    c = x.type.shape[2]
    padded = n * window
    x = cx.add("reshape", [x], shape=(batch, n, n, window, window, c))
    x = cx.add("transpose", [x], perm=(0, 1, 3, 2, 4, 5))
    x = cx.add("reshape", [x], shape=(batch, padded, padded, c))
    zero = Poly.const(0)
    x = cx.add("slice", [x], starts=(zero,) * 4, stops=(batch, side, side, c))
    return cx.add("reshape", [x], shape=(batch, side * side, c))


def _offsets(cx, side: Poly) -> TVal:
    """The table index of each (query, key) pair along one axis: q - k + side - 1, from
    iotas (no array constant: the generated PyTorch code has none)."""
    one = Poly.const(1)
    q = cx.add(
        "reshape", [cx.add("iota", [], length=side, start=0, dtype="i64")], shape=(side, one)
    )
    k = cx.add("iota", [], length=side, start=1, dtype="i64")  # k + 1: q - (k + 1) + side
    k = cx.add("reshape", [k], shape=(one, side))
    return cx.add("add", [cx.add("sub", [q, k]), _index(cx, side)])


def _index(cx, value: Poly) -> TVal:
    """An i64 scalar of a size (a symbol while checking)."""
    if value.is_const:
        return cx.add("const", [], value=np.array(float(value.value)), dtype="i64")
    return _typed(cx, "i64", ())


@builtin(
    "rel_pos_bias",
    ("q", "tensor"),
    ("rel_h", "tensor"),
    ("rel_w", "tensor?"),
    ("side", "int"),
    doc="SAM's decomposed relative positions (MViTv2): q [N, H, side * side, D] and tables "
    "[2 * side - 1, D] -> logits [N, H, side * side, side * side], q . rel_h[qy - ky] + "
    "q . rel_w[qx - kx]",
)
def _rel_pos_bias(cx, q, rel_h, rel_w, side):
    if q.type.rank != 4:
        raise OpTypeError("rel_pos_bias needs q [N, H, T, D]", "rank 4", str(q.type))
    n, h, t, d = q.type.shape
    _side_of(t, side, "rel_pos_bias")
    if rel_w is None:
        raise OpTypeError("rel_pos_bias needs both tables", "rel_w", "none")
    for table in (rel_h, rel_w):
        if table.type.shape != (2 * side - 1, d):
            raise OpTypeError(
                "rel_pos_bias: a table per offset", f"[{2 * side - 1}, {d}]", str(table.type)
            )
    offsets = _offsets(cx, side)
    q5 = cx.add("reshape", [q], shape=(n, h, side, side, d))  # (qy, qx)

    def along(table, perm):
        rows = cx.add("take", [table, offsets])  # [side (q), side (k), D]
        rows = cx.add("transpose", [rows], perm=(0, 2, 1))  # [side (q), D, side (k)]
        return cx.add("matmul", [cx.add("transpose", [q5], perm=perm), rows])

    by_y = along(rel_h, (0, 1, 2, 3, 4))  # [N, H, qy, qx, ky]
    by_x = cx.add("transpose", [along(rel_w, (0, 1, 3, 2, 4))], perm=(0, 1, 3, 2, 4))
    one = Poly.const(1)
    by_y = cx.add("reshape", [by_y], shape=(n, h, side, side, side, one))
    by_x = cx.add("reshape", [by_x], shape=(n, h, side, side, one, side))
    return cx.add("reshape", [cx.add("add", [by_y, by_x])], shape=(n, h, t, t))


@builtin(
    "biased_attention",
    ("q", "tensor"),
    ("k", "tensor"),
    ("v", "tensor"),
    ("bias", "tensor?", None),
    doc="softmax(q k^T / sqrt(D) + bias) v over the last axis, f32 softmax; bias none: none",
)
def _biased_attention(cx, q, k, v, bias):
    d = q.type.shape[-1]
    if not d.is_const and cx.lowering:
        raise OpTypeError("biased_attention needs a known head size", "a number", str(d))
    scale = 1.0 / math.sqrt(d.value) if d.is_const else 1.0
    rank = k.type.rank
    kt = cx.add("transpose", [k], perm=tuple(range(rank - 2)) + (rank - 1, rank - 2))
    scores = cx.add("matmul", [cx.add("mul", [q, cx.scalar(scale, q.type.dtype)]), kt])
    if bias is not None:
        scores = cx.add("add", [scores, bias])
    return cx.add("matmul", [cx.add("softmax", [scores], axis=rank - 1), v])


@builtin(
    "fourier_features",
    ("coords", "tensor"),
    ("gaussian", "tensor"),
    ("width", "int"),
    doc="SAM's random-Fourier positions: coords [..., 2] in [0, 1] and gaussian [2, F] -> "
    "[..., width], [sin, cos] of 2 pi (2 coords - 1) @ gaussian (width = 2F, checked when "
    "lowering: while checking, a config's F = width / 2 is a symbol)",
)
def _fourier_features(cx, coords, gaussian, width):
    dtype = coords.type.dtype
    x = cx.add("sub", [cx.add("mul", [coords, cx.scalar(2.0, dtype)]), cx.scalar(1.0, dtype)])
    x = cx.add("mul", [cx.add("matmul", [x, gaussian]), cx.scalar(2 * math.pi, dtype)])
    x = cx.add("concat", [cx.add("sin", [x]), cx.add("cos", [x])], axis=coords.type.rank - 1)
    features = x.type.shape[-1]
    if features.is_const and width.is_const and features != width:
        raise OpTypeError("fourier_features: 2F is not the width", str(width), str(features))
    return cx.add("reshape", [x], shape=(*x.type.shape[:-1], width))


@builtin(
    "pixel_centers",
    ("points", "tensor"),
    ("size", "int"),
    doc="(points + 0.5) / size: pixel coordinates of a size x size image to [0, 1]",
)
def _pixel_centers(cx, points, size):
    dtype = points.type.dtype
    if not size.is_const and cx.lowering:
        raise OpTypeError("pixel_centers needs a known size", "a number", str(size))
    scale = float(size.value) if size.is_const else 1.0
    return cx.add("div", [cx.add("add", [points, cx.scalar(0.5, dtype)]), cx.scalar(scale, dtype)])


@builtin(
    "grid_centers",
    ("side", "int"),
    doc="f32 [side, side, 2]: each cell's center (x, y) as a fraction of the side",
)
def _grid_centers(cx, side):
    if not side.is_const and cx.lowering:
        raise OpTypeError("grid_centers needs a known side", "a number", str(side))
    one, two = Poly.const(1), Poly.const(2)
    # (1, 2, ..., side) - 0.5, over side: transformers' cumsum of ones, in f32
    c = cx.add("iota", [], length=side, start=1, dtype="f32")
    size = float(side.value) if side.is_const else 1.0
    c = cx.add("div", [cx.add("sub", [c, cx.scalar(0.5, "f32")]), cx.scalar(size, "f32")])
    x = cx.add(
        "broadcast", [cx.add("reshape", [c], shape=(one, side, one))], shape=(side, side, one)
    )
    y = cx.add(
        "broadcast", [cx.add("reshape", [c], shape=(side, one, one))], shape=(side, side, one)
    )
    out = cx.add("concat", [x, y], axis=2)
    assert out.type.shape[2] == two
    return out


@builtin(
    "repeat_each",
    ("x", "tensor"),
    ("n", "int"),
    doc="[B, ...] -> [B * n, ...]: each row n times in turn (repeat_interleave)",
)
def _repeat_each(cx, x, n):
    b, *rest = x.type.shape
    one = Poly.const(1)
    x = cx.add("reshape", [x], shape=(b, one, *rest))
    x = cx.add("broadcast", [x], shape=(b, n, *rest))
    return cx.add("reshape", [x], shape=(b * n, *rest))


@builtin("merge_batch", ("x", "tensor"), doc="[B, Q, ...] -> [B * Q, ...]")
def _merge_batch(cx, x):
    if x.type.rank < 2:
        raise OpTypeError("merge_batch needs [B, Q, ...]", "rank >= 2", str(x.type))
    b, q, *rest = x.type.shape
    return cx.add("reshape", [x], shape=(b * q, *rest))


@builtin(
    "split_batch",
    ("x", "tensor"),
    ("b", "int"),
    ("q", "int"),
    doc="[b * q, ...] -> [b, q, ...]",
)
def _split_batch(cx, x, b, q):
    if x.type.rank < 1 or x.type.shape[0] != b * q:
        raise OpTypeError("split_batch needs [b * q, ...]", str(b * q), str(x.type))
    return cx.add("reshape", [x], shape=(b, q, *x.type.shape[1:]))


@builtin(
    "conv_transpose",
    ("x", "tensor"),
    ("w", "tensor"),
    ("b", "tensor?", None),
    ("stride", "int", Poly.const(1)),
    ("padding", "int", Poly.const(0)),
    doc="2-D transposed convolution, x [B, C, H, W], w [C, O, KH, KW] (F.conv_transpose2d)",
)
def _conv_transpose(cx, x, w, b, stride, padding):
    ins = [x, w] + ([b] if b is not None else [])
    return cx.add("conv_transpose", ins, stride=_int(stride), padding=_int(padding))


def _int(p: Poly):
    return p.value if p.is_const else p


@builtin("box_corners", ("boxes", "tensor"), doc="[..., 4] -> [..., 2, 2]: (x1, y1), (x2, y2)")
def _box_corners(cx, boxes):
    *rest, four = boxes.type.shape
    if four != Poly.const(4):
        raise OpTypeError("box_corners needs [..., 4]", "[..., 4]", str(boxes.type))
    two = Poly.const(2)
    return cx.add("reshape", [boxes], shape=(*rest, two, two))
