"""GGUF block quantization in numpy: q4_0, q4_1, q5_0, q5_1 (blocks of 32) here, q4_K,
q5_K and q6_K (super-blocks of 256) in `gguf_kquants`.

    packed, values = encode(x, "q4_k")      # x: (rows, n) f32, n a multiple of the block
    packed = quantize_rows(x, "q5_0")       # (rows, n // block * block_bytes) uint8

Each encoder works on many blocks at once and returns the packed blocks (ggml's byte
layout, which the gguf package's `quants.dequantize` and llama.cpp read) together with
Linnet's own reconstruction of them (what a reader gets back), computed from the codes
before packing: the tests hold the two equal, which checks the packing bit by bit.

The 32-blocks follow the formats' definitions (ggml's reference quantizers): q4_0/q5_0
scale a block by its value of largest magnitude (d = that value / -8 or / -16, codes
rounded half up and clipped); q4_1/q5_1 map [min, max] onto 0..15 / 0..31. Scales and
minimums are stored as f16; codes are found with the unrounded f32 scale.
"""

from __future__ import annotations

import numpy as np

QK = 32  # elements per block of the legacy types
BLOCK = {"q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q4_k": 256, "q5_k": 256, "q6_k": 256}
BLOCK_BYTES = {
    "q4_0": 18,
    "q4_1": 20,
    "q5_0": 22,
    "q5_1": 24,
    "q4_k": 144,
    "q5_k": 176,
    "q6_k": 210,
}


def f16_bytes(x: np.ndarray) -> np.ndarray:
    """(n, 1) f32 -> (n, 2) uint8: the f16 (round to nearest even) bytes, little-endian."""
    return x.astype("<f2").view(np.uint8).reshape(len(x), 2)


def as_f16(x: np.ndarray) -> np.ndarray:
    """The f32 value a reader gets back from `x` stored as f16."""
    return x.astype(np.float16).astype(np.float32)


def nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Two arrays of 4-bit codes in one of bytes: `lo` in the low nibble."""
    return (lo & 0x0F) | ((hi & 0x0F) << 4)


def fifth_bits(q: np.ndarray) -> np.ndarray:
    """(n, 32) 5-bit codes -> (n, 4) bytes: bit j of the little-endian uint32 is bit 4 of
    code j."""
    return np.packbits((q >> 4) & 1, axis=-1, bitorder="little")


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """Per row, the value of largest magnitude with its sign (the first one on ties)."""
    i = np.abs(x).argmax(-1)[:, None]
    return np.take_along_axis(x, i, -1)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _symmetric(x: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    """(d, codes 0..2*half-1) of q4_0 (half 8) / q5_0 (half 16): x ~ d * (code - half)."""
    d = (_signed_absmax(x) / np.float32(-half)).astype(np.float32)
    t = x * _inverse(d) + np.float32(half + 0.5)
    q = np.minimum(np.trunc(t), 2 * half - 1).astype(np.uint8)
    return d, q


def _affine(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d, m, codes 0..levels) of q4_1 (15) / q5_1 (31): x ~ d * code + m."""
    lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
    d = ((hi - lo) / np.float32(levels)).astype(np.float32)
    t = (x - lo) * _inverse(d) + np.float32(0.5)
    q = np.minimum(np.trunc(t), levels).astype(np.uint8)
    return d, lo, q


def _halves(q: np.ndarray) -> np.ndarray:
    """Codes j and j + 16 of each block share byte j."""
    return nibbles(q[:, :16], q[:, 16:])


def encode_q4_0(x: np.ndarray):
    d, q = _symmetric(x, 8)
    values = as_f16(d) * (q.astype(np.int8) - np.int8(8)).astype(np.float32)
    return np.concatenate([f16_bytes(d), _halves(q)], -1), values


def encode_q5_0(x: np.ndarray):
    d, q = _symmetric(x, 16)
    values = as_f16(d) * (q.astype(np.int8) - np.int8(16)).astype(np.float32)
    return np.concatenate([f16_bytes(d), fifth_bits(q), _halves(q)], -1), values


def encode_q4_1(x: np.ndarray):
    d, m, q = _affine(x, 15)
    values = as_f16(d) * q.astype(np.float32) + as_f16(m)
    return np.concatenate([f16_bytes(d), f16_bytes(m), _halves(q)], -1), values


def encode_q5_1(x: np.ndarray):
    d, m, q = _affine(x, 31)
    values = as_f16(d) * q.astype(np.float32) + as_f16(m)
    packed = np.concatenate([f16_bytes(d), f16_bytes(m), fifth_bits(q), _halves(q)], -1)
    return packed, values


def _encoders():
    from linnet.converters import gguf_kquants as k

    return {
        "q4_0": encode_q4_0,
        "q4_1": encode_q4_1,
        "q5_0": encode_q5_0,
        "q5_1": encode_q5_1,
        "q4_k": k.encode_q4_k,
        "q5_k": k.encode_q5_k,
        "q6_k": k.encode_q6_k,
    }


def encode(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(packed, values) for `x` (rows, n) as GGUF type `kind`: packed (rows, n // block *
    block bytes) uint8, values (rows, n) f32, Linnet's own dequantization of `packed`."""
    rows, n = x.shape
    block = BLOCK[kind]
    if n % block:
        raise ValueError(f"{kind}: rows of {n} are not whole blocks of {block}")
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, block)
    packed, values = _encoders()[kind](flat)
    return packed.reshape(rows, -1), values.reshape(rows, n)


def quantize_rows(x: np.ndarray, kind: str) -> np.ndarray:
    """`x` (rows, n) as the packed blocks of GGUF type `kind`."""
    return encode(x, kind)[0]
