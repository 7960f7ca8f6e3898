"""GGUF q8_0, q4_0, q4_K and q5_0 tensors kept packed: ggml's block bytes unpacked
(vectorised numpy, from the formats' definitions) into a layout a weight-only quantized
linear reads.

    p = packed_from_ggml(raw_bytes, "q4_k", (rows, cols))
    p.codes     # q8_0: int8 (rows, cols); 4-bit: uint8 (rows, cols // 2), element i in
                # the low nibble of byte i and element cols // 2 + i in its high nibble
                # (unpacking writes two contiguous halves of a row); q5_0: the same
                # nibbles, then each row's fifth bits (cols // 8 bytes, element i in bit
                # i % 8 of byte i // 8): uint8 (rows, cols // 2 + cols // 8)
    p.scale     # f32 (rows, cols // 32): one per 32 elements
    p.offset    # 4/5-bit only, f32 (rows, cols // 32): value = scale * code + offset
    p.dequantize()  # f32 (rows, cols): what ggml's dequantization gives, bit for bit
    p.as_q8_0()     # q5_0 in q8_0's layout (int8 code - 16): for kernels without q5_0

Every value is scale * code + offset with the scale and offset exactly as ggml computes
them (q4_0: d and -8 d; q5_0: d and -16 d; q4_K: d * sc and -(dmin * m), products exact
in f32), so the f32 result of `dequantize` equals the gguf package's. Row transforms
(llama.cpp's rope permutation, row splits) apply to each part alike (`with_parts`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

PACKED_TYPES = ("q8_0", "q4_0", "q4_k")
# ggml types a GGUF file's matrices stay packed in: the packed types, and q5_0 (the type
# llama.cpp's q4_K falls back to for rows that are not whole 256-blocks)
KEPT_PACKED = (*PACKED_TYPES, "q5_0")
GROUP = 32  # elements per scale, in every packed type
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_k": 144, "q5_0": 22}
BLOCK = {"q8_0": 32, "q4_0": 32, "q4_k": 256, "q5_0": 32}


@dataclass(frozen=True)
class PackedArrays:
    """One packed weight in numpy: its type, logical (rows, cols) shape and parts."""

    kind: str
    shape: tuple[int, int]
    codes: np.ndarray
    scale: np.ndarray
    offset: np.ndarray | None = None

    def parts(self) -> list[np.ndarray]:
        return [a for a in (self.codes, self.scale, self.offset) if a is not None]

    def with_parts(self, codes, scale, offset=None) -> PackedArrays:
        """The same type and columns over other rows (a permutation or slice of rows
        applied to every part, in `parts()` order)."""
        return replace(
            self, shape=(len(codes), self.shape[1]), codes=codes, scale=scale, offset=offset
        )

    def values(self) -> np.ndarray:
        """The codes as f32, one per element."""
        if self.kind == "q8_0":
            return self.codes.astype(np.float32)
        half = self.shape[1] // 2
        nibbles = self.codes[:, :half]
        codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], -1)
        if self.kind == "q5_0":
            fifth = np.unpackbits(self.codes[:, half:], axis=-1, bitorder="little")
            codes = codes | (fifth << 4)
        return codes.astype(np.float32)

    def as_q8_0(self) -> PackedArrays:
        """A q5_0 weight in q8_0's layout (int8 code - 16, scale d: the same f32 products)
        for kernels that do not read q5_0; other types as they are."""
        if self.kind != "q5_0":
            return self
        codes = (self.values() - 16).astype(np.int8)
        return PackedArrays("q8_0", self.shape, codes, self.scale)

    def dequantize(self) -> np.ndarray:
        rows, cols = self.shape
        q = self.values().reshape(rows, cols // GROUP, GROUP)
        x = q * self.scale[..., None]
        if self.offset is not None:
            x = x + self.offset[..., None]
        return x.reshape(rows, cols).astype(np.float32)


def _f16(b: np.ndarray) -> np.ndarray:
    """(..., 2) uint8 little-endian f16 bytes -> (...) f32."""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _q8_0(blocks: np.ndarray, rows: int, cols: int) -> PackedArrays:
    scale = _f16(blocks[:, 0:2]).reshape(rows, cols // 32)
    codes = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).reshape(rows, cols)
    return PackedArrays("q8_0", (rows, cols), codes, scale)


def _row_halves(first: np.ndarray, second: np.ndarray, rows: int) -> np.ndarray:
    """Codes of each block in order (its first half, then its second) as Linnet's bytes:
    a row's first half in the low nibbles, its second half in the high ones."""
    q = np.concatenate([first, second], -1).reshape(rows, -1)  # codes 0..15 in order
    half = q.shape[1] // 2
    return (q[:, :half] | (q[:, half:] << 4)).astype(np.uint8)


def _q4_0(blocks: np.ndarray, rows: int, cols: int) -> PackedArrays:
    d = _f16(blocks[:, 0:2])
    qs = blocks[:, 2:]  # element j low nibble of byte j, element j + 16 its high nibble
    codes = _row_halves(qs & 0x0F, qs >> 4, rows)
    scale = d.reshape(rows, cols // 32)
    return PackedArrays("q4_0", (rows, cols), codes, scale, (-8 * scale).astype(np.float32))


def k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) bytes -> the 8 six-bit scales and mins of each q4_K super-block."""
    s = packed.astype(np.uint8)
    lo = s[:, 0:4] & 63, s[:, 4:8] & 63
    sc_hi = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    m_hi = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return np.concatenate([lo[0], sc_hi], -1), np.concatenate([lo[1], m_hi], -1)


def _q4_k(blocks: np.ndarray, rows: int, cols: int) -> PackedArrays:
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, m = k_scales(blocks[:, 4:16])
    scale = (d[:, None] * sc.astype(np.float32)).astype(np.float32)
    offset = -(dmin[:, None] * m.astype(np.float32)).astype(np.float32)
    qs = blocks[:, 16:].reshape(-1, 4, 32)  # 4 chunks of 64: low nibbles then high ones
    codes = _row_halves(qs & 0x0F, qs >> 4, rows)
    return PackedArrays(
        "q4_k", (rows, cols), codes, scale.reshape(rows, -1), offset.reshape(rows, -1)
    )


def _q5_0(blocks: np.ndarray, rows: int, cols: int) -> PackedArrays:
    """q5_0 (d, the 32 codes' fifth bits as a little-endian uint32, 16 bytes of nibbles:
    element j low in byte j, element j + 16 high): value d * (code - 16), code 0..31. Kept
    as 4-bit nibbles in the 4-bit layout plus each row's fifth bits in element order, scale
    d and offset -16 d: 24 bytes a block where the file has 22 (q8_0's layout: 36)."""
    d = _f16(blocks[:, 0:2])
    qs = blocks[:, 6:]
    nibbles = _row_halves(qs & 0x0F, qs >> 4, rows)
    # a block's four bit bytes hold its elements 0..31 in order, blocks in row order
    fifth = np.ascontiguousarray(blocks[:, 2:6]).reshape(rows, cols // 8)
    scale = d.reshape(rows, cols // 32)
    codes = np.concatenate([nibbles, fifth], -1)
    return PackedArrays("q5_0", (rows, cols), codes, scale, (-16 * scale).astype(np.float32))


_UNPACK = {"q8_0": _q8_0, "q4_0": _q4_0, "q4_k": _q4_k, "q5_0": _q5_0}


def packed_from_ggml(raw: np.ndarray, kind: str, shape: tuple[int, ...]) -> PackedArrays:
    """A 2-D tensor's ggml block bytes (numpy-order `shape`: rows, cols) unpacked."""
    rows, cols = int(np.prod(shape[:-1])), int(shape[-1])
    if cols % BLOCK[kind]:
        raise ValueError(f"{kind}: {cols} columns are not whole blocks of {BLOCK[kind]}")
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, BLOCK_BYTES[kind])
    return _UNPACK[kind](blocks, rows, cols)
