"""Image ops of the op table beyond convolution (issue 15: diffusion decoders): group norm
and nearest upsampling. They register into `linnet.ir.ops.OPS` (ops.py imports this module
last); their decompositions are in `linnet/ir/library.py`, like every library op's."""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.ir.ops import op, require_float, same_dtype
from linnet.ir.types import OpTypeError


@op(
    "group_norm",
    "library",
    "group norm of x [B, C, ...]: channels in attrs['groups'] groups, each normalized over "
    "its channels and every later axis, f32 inside, then * w + b per channel; operands x, w, b",
    arity=(3, 3),
)
def _group_norm(ins, attrs):
    x = ins[0]
    require_float(x, "group_norm")
    same_dtype(ins, "group_norm")
    if x.rank < 2:
        raise OpTypeError("group_norm needs channels on axis 1", "[B, C, ...]", str(x))
    groups = Poly.lift(attrs["groups"])
    if groups.is_const and groups.value < 1:
        raise OpTypeError("group_norm needs groups >= 1", ">= 1", str(groups))
    if x.shape[1].exact_div(groups) is None and (x.shape[1].is_const and groups.is_const):
        raise OpTypeError(
            "group_norm: channels are not a multiple of the groups",
            f"a multiple of {groups}",
            str(x.shape[1]),
        )
    for p in ins[1:]:
        if p.rank != 1 or p.shape[0] != x.shape[1]:
            raise OpTypeError(
                "shape mismatch in group_norm: w and b must match axis 1", f"[{x.shape[1]}]", str(p)
            )
    return x


@op(
    "upsample_nearest",
    "library",
    "nearest-neighbour upsampling of x [B, C, H, W] by an integer attrs['scale'] on both "
    "spatial axes: every pixel repeated scale x scale times (F.interpolate, mode='nearest')",
)
def _upsample_nearest(ins, attrs):
    x = ins[0]
    scale = attrs["scale"]
    if not isinstance(scale, int) or scale < 1:
        raise OpTypeError("upsample_nearest needs an integer scale >= 1", ">= 1", str(scale))
    if x.rank != 4:
        raise OpTypeError("upsample_nearest needs [B, C, H, W]", "rank 4", str(x))
    b, c, h, w = x.shape
    return x.with_shape((b, c, h * scale, w * scale))
