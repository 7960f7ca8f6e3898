"""1-D signal ops of the op table (audio: Whisper's convolution stem). Registered into
`linnet.ir.ops.OPS` when that module loads; decompositions in linnet/ir/library.py."""

from __future__ import annotations

from linnet.ir.ops import OpTypeError, TensorType, op, require_float, same_dtype
from linnet.ir.ops_image import _spatial_out, _window_attrs


@op("conv1d", "library", "1-D conv1d: x [B, C, T] by w [O, C, K] (+ b [O]), as F.conv1d", (2, 3))
def _conv1d(ins, attrs):
    x, w = ins[0], ins[1]
    require_float(x, "conv1d")
    stride, padding = _window_attrs(attrs, "conv1d")
    if (
        x.rank != 3
        or w.rank != 3
        or x.shape[1] != w.shape[1]
        or len(ins) == 3
        and ins[2].shape != w.shape[:1]
    ):
        raise OpTypeError(
            "shape mismatch in conv1d",
            "x [B, C, T], w [O, C, K], b [O]",
            " and ".join(map(str, ins)),
        )
    t = _spatial_out(x.shape[2], w.shape[2], stride, padding)
    return TensorType(same_dtype(ins, "conv1d"), (x.shape[0], w.shape[0], t))
