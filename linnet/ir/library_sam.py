"""The decomposition of `conv_transpose` (linnet/ir/ops_sam.py): the input dilated by
`stride` (zeros between its pixels), padded by KH - 1 - padding, then an ordinary
convolution (library `conv`, im2col) by the kernel flipped and its in/out axes swapped."""

from __future__ import annotations

import numpy as np


def _flip(b, w, axis: int):
    """w reversed along one axis (a gather of that axis moved first)."""
    rank = len(b.type_of(w).shape)
    n = b.type_of(w).shape[axis].value
    perm = (axis,) + tuple(i for i in range(rank) if i != axis)
    back = tuple(int(i) for i in np.argsort(perm))
    rows = b.add("const", [], value=np.arange(n - 1, -1, -1, dtype=np.float64), dtype="i64")
    w = b.add("take", [b.add("transpose", [w], perm=perm), rows])
    return b.add("transpose", [w], perm=back)


def _dilate(b, x, stride: int):
    """[B, C, H, W] -> [B, C, (H - 1) * stride + 1, ...]: stride - 1 zeros between pixels."""
    bsz, ch, h, w = b.type_of(x).shape
    x = b.add("reshape", [x], shape=(bsz, ch, h, 1, w, 1))
    pads = ((0, 0), (0, 0), (0, 0), (0, stride - 1), (0, 0), (0, stride - 1))
    x = b.add("pad", [x], pads=pads, value=0.0)
    x = b.add("reshape", [x], shape=(bsz, ch, h * stride, w * stride))
    stops = (bsz, ch, (h - 1) * stride + 1, (w - 1) * stride + 1)
    return b.add("slice", [x], starts=(0, 0, 0, 0), stops=stops)


def conv_transpose(b, x, w, bias=None, *, stride=1, padding=0):
    from linnet.ir.library import conv  # the library imports this module first

    kh, kw = (d.value for d in b.type_of(w).shape[2:])
    if stride > 1:
        x = _dilate(b, x, stride)
    if kh - 1 - padding or kw - 1 - padding:
        edge = ((kh - 1 - padding,) * 2, (kw - 1 - padding,) * 2)
        x = b.add("pad", [x], pads=((0, 0), (0, 0)) + edge, value=0.0)
    w = _flip(b, _flip(b, w, 2), 3)
    w = b.add("transpose", [w], perm=(1, 0, 2, 3))  # [O, C, KH, KW]
    return conv(b, x, w, bias)
