"""SAM's op of the op table (issue 15): the transposed convolution of its mask decoder's
upscaling. Registered into `linnet.ir.ops.OPS` when that module loads (it imports this one
last); the decomposition is in `linnet/ir/library_sam.py`, the native emitters are
PyTorch's F.conv_transpose2d, XLA's dilated convolution and ONNX ConvTranspose."""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.ir.ops import op, require_float, same_dtype
from linnet.ir.types import OpTypeError, TensorType


def _int_attr(attrs, name: str, default: int, low: int):
    value = attrs.get(name, default)
    if isinstance(value, Poly) and not value.is_const:
        return value  # the checker may pass a config dim
    value = int(Poly.lift(value).value)
    if value < low:
        raise OpTypeError(f"conv_transpose needs {name} >= {low}", f">= {low}", str(value))
    return value


@op(
    "conv_transpose",
    "library",
    "2-D transposed convolution of x [B, C, H, W] by w [C, O, KH, KW] (PyTorch's layout) "
    "(+ b [O]), attrs stride and padding (cropped from both sides, at most KH - 1): "
    "[B, O, (H - 1) * stride - 2 * padding + KH, ...], as F.conv_transpose2d with groups=1",
    arity=(2, 3),
)
def _conv_transpose(ins, attrs):
    x, w = ins[0], ins[1]
    dtype = same_dtype(ins, "conv_transpose")
    require_float(x, "conv_transpose")
    stride = _int_attr(attrs, "stride", 1, 1)
    padding = _int_attr(attrs, "padding", 0, 0)
    if x.rank != 4 or w.rank != 4 or x.shape[1] != w.shape[0]:
        raise OpTypeError(
            "shape mismatch in conv_transpose: x [B, C, H, W] and w [C, O, KH, KW]",
            f"w like [{x.shape[1] if x.rank == 4 else 'C'}, O, KH, KW]",
            f"x {x} and w {w}",
        )
    if len(ins) == 3 and (ins[2].rank != 1 or ins[2].shape[0] != w.shape[1]):
        raise OpTypeError("shape mismatch in conv_transpose: bias", f"[{w.shape[1]}]", str(ins[2]))
    for k in w.shape[2:]:
        if isinstance(padding, int) and k.is_const and padding > k.value - 1:
            raise OpTypeError(
                "conv_transpose needs padding <= kernel - 1", str(k.value - 1), str(padding)
            )
    h, wd = ((x.shape[i] - 1) * stride - 2 * padding + w.shape[i] for i in (2, 3))
    return TensorType(dtype, (x.shape[0], w.shape[1], h, wd))
