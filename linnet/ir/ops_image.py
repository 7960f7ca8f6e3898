"""Image ops of the op table: convolution, max pooling, batch norm, group norm and nearest
upsampling. They register into `linnet.ir.ops.OPS` (ops.py imports this module last);
their decompositions are in `linnet/ir/library.py`, like every library op's."""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.ir.ops import op, require_float, same_dtype
from linnet.ir.types import OpTypeError, TensorType


# -- vision: convolution, pooling, batch norm (decompositions in linnet/ir/library.py) -----
def _spatial_out(size: Poly, kernel: Poly, stride: int, padding: int) -> Poly:
    """(size + 2 * padding - kernel) // stride + 1, as PyTorch sizes a conv or pool."""
    return (size + 2 * padding - kernel).floordiv(stride) + 1


def _window_attrs(attrs, what: str) -> tuple:
    """stride and padding: ints when lowering; the checker may pass config dims."""
    stride, padding = attrs.get("stride", 1), attrs.get("padding", 0)
    for value, low in ((stride, 1), (padding, 0)):
        if isinstance(value, Poly) and not value.is_const:
            continue
        if int(Poly.lift(value).value) < low:
            raise OpTypeError(
                f"{what} needs stride >= 1 and padding >= 0", "integers", f"{stride}, {padding}"
            )
    return stride, padding


def _conv_attr(attrs, name: str):
    """groups or dilation (default 1): an int >= 1, or a config dim when checking."""
    value = attrs.get(name, 1)
    if isinstance(value, bool) or not isinstance(value, (int, Poly)):
        raise OpTypeError(f"conv needs an integer {name}", ">= 1", repr(value))
    if isinstance(value, int) or value.is_const:
        if int(Poly.lift(value).value) < 1:
            raise OpTypeError(f"conv needs {name} >= 1", ">= 1", str(value))
    return Poly.lift(value)


def _check_conv_groups(x, w, groups: Poly) -> None:
    """x's channels are w's input channels times groups; w's outputs split into groups."""
    if x.shape[1] != w.shape[1] * groups:
        raise OpTypeError(
            "shape mismatch in conv: x's channels must be w's input channels x groups",
            f"x [B, {w.shape[1] * groups}, H, W] (w {w}, groups {groups})",
            f"x {x}",
        )
    if groups.is_const and w.shape[0].is_const and w.shape[0].value % groups.value:
        raise OpTypeError(
            "conv: output channels are not a multiple of the groups",
            f"a multiple of {groups}",
            str(w.shape[0]),
        )


@op(
    "conv",
    "library",
    "2-D convolution of x [B, C, H, W] by w [O, C / groups, KH, KW] (+ b [O]), attrs "
    "stride, padding (zeros, both sides), dilation and groups (default 1), as F.conv2d",
    arity=(2, 3),
)
def _conv(ins, attrs):
    x, w = ins[0], ins[1]
    dtype = same_dtype(ins, "conv")
    require_float(x, "conv")
    stride, padding = _window_attrs(attrs, "conv")
    groups, dilation = _conv_attr(attrs, "groups"), _conv_attr(attrs, "dilation")
    if x.rank != 4 or w.rank != 4:
        raise OpTypeError(
            "shape mismatch in conv: x [B, C, H, W] and w [O, C / groups, KH, KW]",
            "rank 4 and rank 4",
            f"x {x} and w {w}",
        )
    _check_conv_groups(x, w, groups)
    if len(ins) == 3 and (ins[2].rank != 1 or ins[2].shape[0] != w.shape[0]):
        raise OpTypeError("shape mismatch in conv: bias", f"[{w.shape[0]}]", str(ins[2]))
    # a dilated kernel spans dilation * (k - 1) + 1 pixels
    h, wd = (
        _spatial_out(x.shape[i], dilation * (w.shape[i] - 1) + 1, stride, padding) for i in (2, 3)
    )
    return TensorType(dtype, (x.shape[0], w.shape[0], h, wd))


@op(
    "max_pool",
    "library",
    "2-D max pooling of x [B, C, H, W]: attrs kernel, stride, padding (-inf), as F.max_pool2d",
)
def _max_pool(ins, attrs):
    x = ins[0]
    require_float(x, "max_pool")
    stride, padding = _window_attrs(attrs, "max_pool")
    kernel = attrs["kernel"]
    if x.rank != 4 or (isinstance(padding, int) and 2 * padding > kernel):
        raise OpTypeError("max_pool needs [B, C, H, W] and padding <= kernel / 2", "", str(x))
    h, w = (_spatial_out(x.shape[i], Poly.const(kernel), stride, padding) for i in (2, 3))
    return x.with_shape((x.shape[0], x.shape[1], h, w))


@op(
    "batch_norm",
    "library",
    "inference batch norm over axis 1: (x - mean) * rsqrt(var + eps) * w + b, f32 inside; "
    "operands x, w, b, mean, var",
    arity=(5, 5),
)
def _batch_norm(ins, attrs):
    x = ins[0]
    require_float(x, "batch_norm")
    same_dtype(ins, "batch_norm")
    if x.rank < 2:
        raise OpTypeError("batch_norm needs channels on axis 1", "[B, C, ...]", str(x))
    for p in ins[1:]:
        if p.rank != 1 or p.shape[0] != x.shape[1]:
            raise OpTypeError(
                "shape mismatch in batch_norm: params must match axis 1", f"[{x.shape[1]}]", str(p)
            )
    return x


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


@op(
    "resize_bilinear",
    "library",
    "bilinear resize of x [B, C, H, W] to attrs['size'] = (OH, OW), as F.interpolate("
    "mode='bilinear', antialias=False) with attrs['align_corners'] (default false)",
)
def _resize_bilinear(ins, attrs):
    x = ins[0]
    require_float(x, "resize_bilinear")
    if x.rank != 4:
        raise OpTypeError("resize_bilinear needs [B, C, H, W]", "rank 4", str(x))
    size = attrs.get("size")
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        raise OpTypeError("resize_bilinear needs size = (height, width)", "two sizes", repr(size))
    out = tuple(Poly.lift(d) for d in size)
    if any(d.is_const and d.value < 1 for d in out):
        raise OpTypeError("resize_bilinear needs sizes >= 1", ">= 1", str(size))
    if not isinstance(attrs.get("align_corners", False), bool):
        raise OpTypeError("resize_bilinear: align_corners is a bool", "true or false", "")
    return x.with_shape(x.shape[:2] + out)
