"""Image builtins beyond convolution (issue 15): bilinear resize and constant padding of
the spatial axes. Registered into `linnet.check.builtins.BUILTINS` (builtins.py imports
this module last)."""

from __future__ import annotations

from linnet.check.builtins import _const_int, _maybe_int, builtin
from linnet.core.dims import Poly
from linnet.ir.types import OpTypeError


@builtin(
    "resize_bilinear",
    ("x", "tensor"),
    ("h", "int"),
    ("w", "int"),
    ("align_corners", "bool", False),
    doc="[B, C, H, W] -> [B, C, h, w], bilinear (F.interpolate, antialias=False)",
)
def _resize_bilinear(cx, x, h, w, align_corners):
    size = (_maybe_int(h), _maybe_int(w))
    return cx.add("resize_bilinear", [x], size=size, align_corners=bool(align_corners))


@builtin(
    "pad2d",
    ("x", "tensor"),
    ("left", "int"),
    ("right", "int"),
    ("top", "int"),
    ("bottom", "int"),
    doc="[B, C, H, W] zero padded: F.pad(x, (left, right, top, bottom))",
)
def _pad2d(cx, x, left, right, top, bottom):
    if x.type.rank != 4:
        raise OpTypeError("pad2d needs [B, C, H, W]", "rank 4", str(x.type))
    sides = [_const_int(Poly.lift(v), name) for v, name in ((left, "left"), (right, "right"))]
    sides += [_const_int(Poly.lift(v), name) for v, name in ((top, "top"), (bottom, "bottom"))]
    if min(sides) < 0:
        raise OpTypeError("pad2d needs sizes >= 0", ">= 0", str(tuple(sides)))
    lft, rgt, tp, btm = sides
    pads = ((0, 0), (0, 0), (tp, btm), (lft, rgt))
    return cx.add("pad", [x], pads=pads, value=0.0)


@builtin(
    "clamp",
    ("x", "tensor"),
    ("low", "float"),
    ("high", "float"),
    doc="x limited to [low, high] (torch.clamp)",
)
def _clamp(cx, x, low, high):
    if not low <= high:
        raise OpTypeError("clamp needs low <= high", f"<= {high}", str(low))
    dtype = x.type.dtype
    return cx.add(
        "minimum", [cx.add("maximum", [x, cx.scalar(low, dtype)]), cx.scalar(high, dtype)]
    )
