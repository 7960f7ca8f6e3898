"""The decomposition of `resize_bilinear` (linnet/ir/ops_image.py): PyTorch's
F.interpolate(mode="bilinear", antialias=False) step by step, in f32 as its CPU kernel
computes (aten/src/ATen/native/cpu/UpSampleKernel.cpp). For each spatial axis, output
index d reads source s = scale * (d + 0.5) - 0.5 clamped at 0, scale = in / out
(align_corners: s = d * (in - 1) / (out - 1), 0 when out is 1); i0 = min(floor(s), in - 1),
i1 = min(i0 + 1, in - 1), l1 = clamp(s - i0, 0, 1), l0 = 1 - l1. The tables are built at
run time from the sizes (the image sides may be runtime dims); the width is interpolated
first, then the height, the order PyTorch's kernel takes."""

from __future__ import annotations

import numpy as np

from linnet.core.dims import Poly

F32, I64 = "f32", "i64"


def _const(b, value, dtype: str):
    return b.add("const", [], value=np.asarray(value, dtype=np.float64), dtype=dtype)


def _size(b, n: Poly):
    """A dim as an i64 tensor [1] (an iota of one element starting at it)."""
    return b.add("iota", [], length=Poly.const(1), start=Poly.lift(n), dtype=I64)


def _source(b, n_in: Poly, n_out: Poly, align_corners: bool):
    """The f32 source coordinate of every output index along one axis: [n_out]."""
    dst = b.add(
        "cast", [b.add("iota", [], length=n_out, start=Poly.const(0), dtype=I64)], dtype=F32
    )
    size_in, size_out = (b.add("cast", [_size(b, n)], dtype=F32) for n in (n_in, n_out))
    one = _const(b, 1.0, F32)
    if align_corners:  # (in - 1) / (out - 1), or 0 for a single output
        ratio = b.add("div", [b.add("sub", [size_in, one]), b.add("sub", [size_out, one])])
        single = b.add("le", [size_out, one])
        ratio = b.add("where", [single, _const(b, 0.0, F32), ratio])
        return b.add("mul", [ratio, dst])
    half = _const(b, 0.5, F32)
    ratio = b.add("div", [size_in, size_out])
    src = b.add("sub", [b.add("mul", [ratio, b.add("add", [dst, half])]), half])
    return b.add("maximum", [src, _const(b, 0.0, F32)])


def _axis_table(b, n_in: Poly, n_out: Poly, align_corners: bool):
    """(i0, i1, l0, l1) along one axis: source rows and their weights, each [n_out]."""
    src = _source(b, n_in, n_out, align_corners)
    last = b.add("sub", [_size(b, n_in), b.add("const", [], value=np.asarray(1), dtype=I64)])
    i0 = b.add("minimum", [b.add("cast", [src], dtype=I64), last])  # src >= 0: trunc = floor
    i1 = b.add(
        "minimum", [b.add("add", [i0, b.add("const", [], value=np.asarray(1), dtype=I64)]), last]
    )
    l1 = b.add("sub", [src, b.add("cast", [i0], dtype=F32)])
    l1 = b.add("minimum", [b.add("maximum", [l1, _const(b, 0.0, F32)]), _const(b, 1.0, F32)])
    l0 = b.add("sub", [_const(b, 1.0, F32), l1])
    return i0, i1, l0, l1


def _lerp_first_axis(b, x, table, dtype: str):
    """x [N, ...] -> [n_out, ...]: x[i0] * l0 + x[i1] * l1 along axis 0."""
    i0, i1, l0, l1 = table
    rank = b.type_of(x).rank
    n_out = b.type_of(i0).shape[0]
    view = (n_out,) + (Poly.const(1),) * (rank - 1)
    l0, l1 = (b.add("reshape", [b.add("cast", [w], dtype=dtype)], shape=view) for w in (l0, l1))
    a, c = b.add("take", [x, i0]), b.add("take", [x, i1])
    return b.add("add", [b.add("mul", [a, l0]), b.add("mul", [c, l1])])


def resize_bilinear(b, x, *, size, align_corners=False):
    """x [B, C, H, W] -> [B, C, OH, OW], f32 inside (cast back once)."""
    t = b.type_of(x)
    _, _, h, w = t.shape
    oh, ow = (Poly.lift(d) for d in size)
    y = b.add("cast", [x], dtype=F32) if t.dtype != F32 else x
    y = b.add("transpose", [y], perm=(3, 0, 1, 2))  # (W, B, C, H)
    y = _lerp_first_axis(b, y, _axis_table(b, w, ow, align_corners), F32)  # (OW, B, C, H)
    y = b.add("transpose", [y], perm=(3, 1, 2, 0))  # (H, B, C, OW)
    y = _lerp_first_axis(b, y, _axis_table(b, h, oh, align_corners), F32)  # (OH, B, C, OW)
    y = b.add("transpose", [y], perm=(1, 2, 0, 3))  # (B, C, OH, OW)
    return b.add("cast", [y], dtype=t.dtype) if t.dtype != F32 else y
