"""MXFP4 (OCP microscaling, e2m1 elements): how GPT-OSS checkpoints ship their expert weights.

A tensor `X` is stored as `X_blocks` (uint8 [..., R, G, 16]: 32 four-bit codes per block,
the low nibble first) and `X_scales` (uint8 [..., R, G]: one e8m0 exponent per block,
biased by 127). Code c holds E2M1[c & 7], negated when c & 8; a block's values are those
times 2^(scale - 127). Dequantized, the [..., R, G * 32] rows are transposed to
[..., G * 32, R], the layout transformers' GPT-OSS experts use (x @ w).

    w = dequantize(blocks, scales)          # float32 [..., G * 32, R], exact
    blocks, scales = quantize(w)            # nearest code, the block's amax at 4 or 6

Every e2m1 value times a power of two in range is exact in f32 and bf16, so dequantizing
loses nothing; quantizing is lossy and not unique (a block may be stored at a larger scale
than `quantize` picks), which is why exports copy original blocks that were not changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
CODES = np.concatenate([E2M1, -E2M1])  # code -> value (code 8 is -0.0)
BLOCK = 32
SCALE_BIAS = 127
ELEMENT_EMAX = 2  # 6.0 = 1.5 * 2^2: the largest e2m1 exponent


def dequantize(blocks: np.ndarray, scales: np.ndarray, dtype=np.float32) -> np.ndarray:
    """blocks uint8 [..., R, G, 16], scales uint8 [..., R, G] -> [..., G * 32, R]."""
    # contiguous: a strided view left as the param made each decode step's expert gather
    # (index_select) and bmm about 30x slower on the scaled benchmark checkpoint
    return np.ascontiguousarray(np.swapaxes(dequantize_rows(blocks, scales), -1, -2), dtype)


def dequantize_rows(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks uint8 [..., R, G, 16], scales uint8 [..., R, G] -> f32 [..., R, G * 32]."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not pair")
    values = CODES[_codes(blocks)]  # (..., R, G, 32)
    exponents = scales.astype(np.int32) - SCALE_BIAS
    values = np.ldexp(values, exponents[..., None]).astype(np.float32)
    return values.reshape(*scales.shape[:-1], scales.shape[-1] * BLOCK)


def _codes(blocks: np.ndarray) -> np.ndarray:
    """HF blocks [..., 16] -> the 32 codes of each block in order (low nibble first)."""
    return np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], BLOCK)


# -- ggml's MXFP4 (GGUF type 39): per block one scale byte, then 16 bytes whose byte j holds
# code j in its low nibble and code j + 16 in its high nibble (HF's byte j: codes 2j, 2j+1)
GGML_BLOCK_BYTES = 1 + BLOCK // 2


@dataclass(frozen=True)
class Mxfp4Pair:
    """A GGUF MXFP4 tensor kept packed, in HF's layout (blocks uint8 [..., R, G, 16],
    scales uint8 [..., R, G]): what a PyTorch load hands to `Mxfp4Experts.build`."""

    blocks: np.ndarray
    scales: np.ndarray


def to_ggml(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF blocks [..., R, G, 16] and scales [..., R, G] -> ggml bytes uint8 [..., R, G * 17]."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    codes = _codes(blocks)
    half = BLOCK // 2
    out = np.empty((*scales.shape, GGML_BLOCK_BYTES), np.uint8)
    out[..., 0] = scales
    out[..., 1:] = codes[..., :half] | (codes[..., half:] << 4)
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * GGML_BLOCK_BYTES)


def from_ggml(raw: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml bytes of rows of `cols` values (uint8, any shape whose size is whole rows) ->
    HF (blocks [rows..., G, 16], scales [rows..., G]); the inverse of `to_ggml`."""
    if cols % BLOCK:
        raise ValueError(f"MXFP4 rows of {cols} values are not whole blocks of {BLOCK}")
    g = cols // BLOCK
    raw = np.asarray(raw, np.uint8).reshape(-1, g, GGML_BLOCK_BYTES)
    q = raw[..., 1:]
    codes = np.concatenate([q & 0x0F, q >> 4], axis=-1)  # (rows, G, 32) in order
    pairs = codes.reshape(*codes.shape[:-1], BLOCK // 2, 2)
    blocks = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
    return blocks, np.ascontiguousarray(raw[..., 0])


def _nearest_codes(magnitude: np.ndarray) -> np.ndarray:
    """Indices into E2M1 of the nearest value; a tie goes to the even code (round half to
    even, as the element's mantissa bit is the code's last bit)."""
    upper = np.clip(np.searchsorted(E2M1, magnitude), 1, len(E2M1) - 1)
    lower = upper - 1
    below, above = magnitude - E2M1[lower], E2M1[upper] - magnitude
    pick_upper = (above < below) | ((above == below) & (upper % 2 == 0))
    return np.where(pick_upper, upper, lower)


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float [..., D, R] (D a multiple of 32) -> (blocks, scales): each block's scale puts
    its largest magnitude in [4, 8) (OCP's floor(log2(amax)) - 2), codes to the nearest
    value (ties to even), clamped at 6; an all-zero block gets scale 0 (2^-127)."""
    w = np.swapaxes(np.asarray(w, np.float32), -1, -2)  # (..., R, D)
    if w.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 needs rows of a multiple of {BLOCK}, got {w.shape[-1]}")
    groups = w.reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)  # (..., R, G, 32)
    amax = np.abs(groups).max(axis=-1)
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(amax)) - ELEMENT_EMAX
    exponent = np.where(amax > 0, exponent, -SCALE_BIAS)
    exponent = np.clip(exponent, -SCALE_BIAS, 254 - SCALE_BIAS).astype(np.int32)
    scaled = np.ldexp(np.abs(groups), -exponent[..., None])
    codes = _nearest_codes(np.minimum(scaled, E2M1[-1])).astype(np.uint8)
    codes |= np.signbit(groups).astype(np.uint8) << 3
    pairs = codes.reshape(*codes.shape[:-1], BLOCK // 2, 2)
    blocks = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
    return blocks, (exponent + SCALE_BIAS).astype(np.uint8)


# -- checkpoints: a `_blocks`/`_scales` pair reads as the one dequantized tensor ------------
BLOCKS, SCALES = "_blocks", "_scales"


def pair_packed(headers: dict) -> tuple[dict, dict]:
    """Headers with each MXFP4 pair (`X_blocks` U8 [..., R, G, 16] beside `X_scales` U8
    [..., R, G]) replaced by `X` (F32 [..., G * 32, R]), and {X: (blocks name, scales name)}.
    Only the headers are read; a pair that does not fit stays as it is (the plan names it)."""
    out, packed = dict(headers), {}
    for name, info in headers.items():
        if not name.endswith(BLOCKS):
            continue
        base = name[: -len(BLOCKS)]
        scales = headers.get(base + SCALES)
        shape = tuple(info.shape)
        if (
            scales is None
            or base in headers
            or info.dtype != "U8"
            or scales.dtype != "U8"
            or len(shape) < 3
            or shape[-1] != BLOCK // 2
            or tuple(scales.shape) != shape[:-1]
        ):
            continue
        virtual = (*shape[:-3], shape[-2] * BLOCK, shape[-3])
        out[base] = _replace(info, name=base, dtype="F32", shape=virtual)
        del out[name], out[base + SCALES]
        packed[base] = (name, base + SCALES)
    return out, packed


def _replace(info, **changes):
    from dataclasses import replace

    return replace(info, **changes)


def read_dequantized(read_numpy, pair: tuple[str, str]) -> np.ndarray:
    """The dequantized f32 tensor of a pair, through a checkpoint's `read_numpy`."""
    return dequantize(read_numpy(pair[0]), read_numpy(pair[1]))
