"""The k-quants, q4_K, q5_K and q6_K, in numpy: super-blocks of 256 elements.

q4_K / q5_K: 8 sub-blocks of 32, each x ~ scale * code - min with 4- / 5-bit codes; the
sub-blocks' scales and minimums are 6-bit multiples of two f16 super-block values (d,
dmin). q6_K: 16 sub-blocks of 16, x ~ scale * (code - 32) with 6-bit codes and int8
scales times one f16 d.

Rounding to max/min alone wastes levels on outliers, so each sub-block's scale (and min) is
searched as ggml does: try a range of candidate scales around the max/min one, fit the
best scale (and min) for the codes each gives by weighted least squares, keep the one
with the least weighted squared error. q4_K / q5_K weigh each element by rms(sub-block) +
|x| and keep min <= 0; q6_K weighs by x². Then the super-block's scale is fitted to the
largest sub-block scale, the 6- / 8-bit sub-block scales are rounded against the f16
value a reader will see, and every code is found again from the scales as stored.
"""

from __future__ import annotations

import numpy as np
from linnet.converters.gguf_quants import as_f16, f16_bytes, nibbles

TINY = 1e-15  # a sub-block whose values are all below this is zero


def _sums(w: np.ndarray, *terms: np.ndarray) -> list[np.ndarray]:
    return [(w * t).sum(-1, keepdims=True) for t in terms]


def _least_squares(x, w, codes, sw, sx):
    """Per row, (scale, min) minimising sum w (scale * codes + min - x)², min kept <= 0."""
    sl, sl2, sxl = _sums(w, codes, codes * codes, codes * x)
    det = sw * sl2 - sl * sl
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (sw * sxl - sx * sl) / det
        mn = (sl2 * sx - sl * sxl) / det
        positive = mn > 0  # the format has no room for a positive min: fit the scale alone
        scale = np.where(positive, sxl / sl2, scale)
    return scale, np.where(positive, np.float32(0), mn), det > 0


def _weighted_error(x, w, codes, scale, mn):
    r = scale * codes + mn - x
    return (w * r * r).sum(-1, keepdims=True)


def fit_scale_min(x: np.ndarray, nmax: int, rmin: float, rdelta: float, steps: int):
    """(scale >= 0, m >= 0) per row of sub-blocks `x` so that x ~ scale * code - m with codes
    0..nmax: the max/min mapping, then `steps` + 1 candidate inverse scales
    (nmax + rmin + rdelta * i) / (max - min), each with its least-squares scale and min;
    a better candidate moves the min the next ones are taken from."""
    x = x.astype(np.float32)
    w = np.sqrt((x * x).mean(-1, keepdims=True)) + np.abs(x)
    mn = np.minimum(x.min(-1, keepdims=True), 0)
    top = x.max(-1, keepdims=True)
    flat = top == mn
    sw, sx = _sums(w, np.ones_like(x), x)

    def codes_for(levels):  # codes for levels / (max - min), from the best min so far
        span = np.where(flat, np.float32(1), top - mn)
        return np.clip(np.rint(np.float32(levels) / span * (x - mn)), 0, nmax)

    scale = np.where(flat, np.float32(1), top - mn) / np.float32(nmax)
    best = _weighted_error(x, w, codes_for(nmax), scale, mn)
    for i in range(steps + 1):
        codes = codes_for(rmin + rdelta * i + nmax)
        s, m, ok = _least_squares(x, w, codes, sw, sx)
        err = _weighted_error(x, w, codes, s, m)
        better = ok & (err < best)
        scale, mn, best = (np.where(better, a, b) for a, b in ((s, scale), (m, mn), (err, best)))
    scale = np.where(flat, np.float32(0), scale)
    return scale[:, 0].astype(np.float32), -mn[:, 0].astype(np.float32)


def fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
    """Signed scale per row of `x` so that x ~ scale * l with l in -nmax..nmax-1: 19
    candidate inverse scales around -nmax / (value of largest magnitude), each with its
    least-squares scale weighted by x², the best kept."""
    x = x.astype(np.float32)
    i = np.abs(x).argmax(-1)[:, None]
    peak = np.take_along_axis(x, i, -1)
    zero = np.abs(peak) < TINY
    peak = np.where(zero, np.float32(1), peak)
    w = x * x

    def fit(inv):
        levels = np.clip(np.rint(inv * x), -nmax, nmax - 1)
        slx, sl2 = _sums(w, x * levels, levels * levels)
        return slx, sl2

    slx, sl2 = fit(-nmax / peak)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(sl2 > 0, slx / sl2, np.float32(0))
        best = scale * slx
        for step in (*range(-9, 0), *range(1, 10)):
            slx, sl2 = fit(-(nmax + np.float32(0.1) * step) / peak)
            better = (sl2 > 0) & (slx * slx > best * sl2)
            scale = np.where(better, slx / sl2, scale)
            best = np.where(better, scale * slx, best)
    return np.where(zero, np.float32(0), scale)[:, 0].astype(np.float32)


def _six_bit(values: np.ndarray, top: np.ndarray):
    """Sub-block values (n, 8) >= 0 as 6-bit multiples of one f16 per super-block."""
    d = (top / np.float32(63)).astype(np.float32)
    d16 = as_f16(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d16 > 0, np.rint(values / d16), 0)
    return d, d16, np.clip(q, 0, 63).astype(np.uint8)


def _pack_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins in 12 bytes: sub-blocks 0-3 in the low 6 bits of bytes 0-7,
    4-7 split into a nibble (bytes 8-11) and two high bits (the top of bytes 0-7)."""
    first = np.concatenate([ls[:, :4], lm[:, :4]], -1)
    high = np.concatenate([ls[:, 4:], lm[:, 4:]], -1) >> 4
    return np.concatenate([first | (high << 6), nibbles(ls[:, 4:], lm[:, 4:])], -1)


def _k_affine(x: np.ndarray, nmax: int, rmin: float, steps: int):
    """Shared by q4_K and q5_K: (header bytes, codes (n, 256), values (n, 256))."""
    n = len(x)
    sub = x.reshape(n * 8, 32)
    scale, mins = fit_scale_min(sub, nmax, rmin, 0.1, steps)
    scale, mins = scale.reshape(n, 8), mins.reshape(n, 8)
    d, d16, ls = _six_bit(scale, scale.max(-1, keepdims=True))
    dmin, dmin16, lm = _six_bit(mins, mins.max(-1, keepdims=True))
    step = (d16 * ls.astype(np.float32))[..., None]  # as a reader computes them
    offset = (dmin16 * lm.astype(np.float32))[..., None]
    xs = x.reshape(n, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(step > 0, np.rint((xs + offset) / step), 0)
    codes = np.clip(codes, 0, nmax).astype(np.uint8)
    values = (step * codes.astype(np.float32) - offset).reshape(n, 256)
    header = np.concatenate([f16_bytes(d), f16_bytes(dmin), _pack_scales(ls, lm)], -1)
    return header, codes.reshape(n, 256), values


def _low_nibbles(codes: np.ndarray) -> np.ndarray:
    """Per 64 codes, code j and code j + 32 share byte j."""
    q = codes.reshape(len(codes), 4, 2, 32)
    return nibbles(q[:, :, 0], q[:, :, 1]).reshape(len(codes), 128)


def encode_q4_k(x: np.ndarray):
    header, codes, values = _k_affine(x, 15, -1.0, 20)
    return np.concatenate([header, _low_nibbles(codes)], -1), values


def encode_q5_k(x: np.ndarray):
    header, codes, values = _k_affine(x, 31, -0.5, 15)
    fifth = ((codes.reshape(len(x), 8, 32) >> 4) & 1) << np.arange(8, dtype=np.uint8)[:, None]
    qh = fifth.sum(1, dtype=np.uint8)  # bit k of byte j: bit 4 of code 32 k + j
    return np.concatenate([header, qh, _low_nibbles(codes)], -1), values


def encode_q6_k(x: np.ndarray):
    n = len(x)
    scale = fit_symmetric(x.reshape(n * 16, 16), 32).reshape(n, 16)
    i = np.abs(scale).argmax(-1)[:, None]
    top = np.take_along_axis(scale, i, -1)
    empty = np.abs(top) < TINY
    d = np.where(empty, np.float32(0), top / np.float32(-128)).astype(np.float32)
    d16 = as_f16(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d16 != 0, np.rint(scale / d16), 0)
    sc = np.clip(sc, -128, 127).astype(np.int8)
    step = (d16 * sc.astype(np.float32))[..., None]
    xs = x.reshape(n, 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        levels = np.where(step != 0, np.rint(xs / step), 0)
    codes = (np.clip(levels, -32, 31) + 32).astype(np.uint8)
    values = (step * (codes.astype(np.int8) - np.int8(32)).astype(np.float32)).reshape(n, 256)
    q = codes.reshape(n, 2, 4, 32)  # halves of 128, quarters of 32
    ql = nibbles(q[:, :, :2], q[:, :, 2:]).reshape(n, 128)
    qh = ((q >> 4) << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(2, dtype=np.uint8)
    packed = np.concatenate([ql, qh.reshape(n, 64), sc.view(np.uint8), f16_bytes(d)], -1)
    return packed, values
