"""A GGUF file's header checked as the format requires, before any other reader trusts it.

    check_gguf_header(Path("model.gguf"))   # raises CheckpointError naming the file and the fault

The layout (llama.cpp's `gguf.h`): magic `GGUF`, version (2 or 3), tensor count, key/value
count, the key/values (a string key, a value type, the value; arrays nest), the tensor
infos (name, dims, ggml type, offset), then the data section at the next multiple of
`general.alignment` (32 by default). Every count, length and offset here comes from the file,
so each is checked against the bytes that remain before it is used: a header that claims
2**60 tensors or a 10 GB string is refused at once instead of being looped over or
allocated. Tensor data must lie inside the file, aligned, without overlaps.

The same walk records what it read (`parse_gguf_header`): scalar values, and for arrays
only where they start (`ArrayRef`), so a 150k-entry vocabulary costs a skip, not 150k
objects; `linnet.weights.gguf_file` reads values and tensors from that record.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from linnet.errors import CheckpointError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 8  # arrays of arrays; real files use one level
DEFAULT_ALIGNMENT = 32

# value type -> struct code of a scalar (8: string, 9: array)
SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
STRING, ARRAY = 8, 9
MIN_VALUE_BYTES = {**{t: struct.calcsize(c) for t, c in SCALARS.items()}, STRING: 8, ARRAY: 12}


class HeaderFault(Exception):
    """Internal: what is wrong and at which byte; becomes a CheckpointError."""


@dataclass
class TensorSpan:
    name: str
    offset: int  # from the start of the data section
    nbytes: int
    dims: tuple[int, ...] = ()  # ggml order (innermost first)
    ggml_type: int = 0


@dataclass(frozen=True)
class ArrayRef:
    """An array value left in the file: `count` items of value type `item` from byte
    `offset` (strings: each a u64 length then its bytes)."""

    item: int
    count: int
    offset: int


@dataclass
class GgufHeader:
    """What the checked header holds: byte order, key -> (value types, value), tensors."""

    order: str  # "<" or ">"
    version: int
    values: dict
    tensors: list[TensorSpan]
    data_start: int


class Cursor:
    """Reads little- or big-endian values from a buffer, never past its end."""

    def __init__(self, buf, order: str):
        self.buf, self.order, self.pos = buf, order, 0

    def left(self) -> int:
        return len(self.buf) - self.pos

    def skip(self, n: int, what: str) -> None:
        if n > self.left():
            raise HeaderFault(f"{what} needs {n} bytes at byte {self.pos}; {self.left()} remain")
        self.pos += n

    def take(self, n: int, what: str) -> bytes:
        self.skip(n, what)
        return self.buf[self.pos - n : self.pos]

    def scalar(self, code: str, what: str):
        return struct.unpack(self.order + code, self.take(struct.calcsize(code), what))[0]

    def count(self, what: str, item_bytes: int) -> int:
        """A u64 count whose items (at least `item_bytes` each) must fit in what remains."""
        n = self.scalar("Q", what)
        if n * item_bytes > self.left():
            raise HeaderFault(f"{what} = {n} cannot fit in the {self.left()} bytes that remain")
        return n

    def string(self, what: str) -> str:
        raw = self.take(self.count(f"length of {what}", 1), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderFault(f"{what} is not UTF-8") from None


def _value(cur: Cursor, vtype: int, what: str, depth: int = 0) -> tuple[list[int], object]:
    """(value types as the gguf package lists them, the value or an ArrayRef)."""
    if vtype in SCALARS:
        return [vtype], cur.scalar(SCALARS[vtype], what)
    if vtype == STRING:
        return [vtype], cur.string(what)
    if vtype != ARRAY:
        raise HeaderFault(f"{what}: unknown value type {vtype}")
    if depth >= MAX_NESTING:
        raise HeaderFault(f"{what}: arrays nested deeper than {MAX_NESTING}")
    item = cur.scalar("I", f"{what} item type")
    if item not in MIN_VALUE_BYTES:
        raise HeaderFault(f"{what}: unknown array item type {item}")
    n = cur.count(f"{what} length", MIN_VALUE_BYTES[item])
    ref = ArrayRef(item, n, cur.pos)
    if item in SCALARS:  # skipped in one step: vocabularies hold 100k+ scores
        cur.skip(n * struct.calcsize(SCALARS[item]), what)
        return [ARRAY, item], ref
    if item == STRING:  # skipped too (tokens, merges): only their lengths are checked
        for i in range(n):
            cur.skip(cur.count(f"length of {what}[{i}]", 1), what)
        return [ARRAY, item], ref
    items = [_value(cur, item, f"{what}[{i}]", depth + 1) for i in range(n)]
    return [ARRAY, *(items[0][0] if items else [item])], [v for _, v in items]


def _key_values(cur: Cursor, n: int) -> dict:
    out: dict = {}
    for i in range(n):
        key = cur.string(f"key {i}")
        if key in out:
            raise HeaderFault(f"key {key!r} appears twice")
        out[key] = _value(cur, cur.scalar("I", f"type of {key!r}"), key)
    return out


def _tensor_bytes(name: str, dims: list[int], ggml_type: int) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise HeaderFault(f"tensor {name}: unknown ggml type {ggml_type}") from None
    if any(d <= 0 for d in dims):
        raise HeaderFault(f"tensor {name}: dims {dims} must be positive")
    if dims[0] % block:
        raise HeaderFault(f"tensor {name}: first dim {dims[0]} is not a multiple of {block}")
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * size


def _tensor_infos(cur: Cursor, n: int) -> list[TensorSpan]:
    spans, seen = [], set()
    for i in range(n):
        name = cur.string(f"name of tensor {i}")
        if name in seen:
            raise HeaderFault(f"tensor {name!r} appears twice")
        seen.add(name)
        n_dims = cur.scalar("I", f"dims of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise HeaderFault(f"tensor {name}: {n_dims} dims (1 to {MAX_DIMS} allowed)")
        dims = [cur.scalar("Q", f"dim of {name}") for _ in range(n_dims)]
        ggml_type = cur.scalar("I", f"type of {name}")
        nbytes = _tensor_bytes(name, dims, ggml_type)
        offset = cur.scalar("Q", f"offset of {name}")
        spans.append(TensorSpan(name, offset, nbytes, tuple(dims), ggml_type))
    return spans


def _alignment(kv: dict) -> int:
    align = kv.get("general.alignment", ([], DEFAULT_ALIGNMENT))[1]
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise HeaderFault(f"general.alignment = {align!r} is not a power of two")
    return align


def _check_data(spans: list[TensorSpan], data_start: int, size: int, align: int) -> None:
    end = 0
    for t in sorted(spans, key=lambda t: t.offset):
        if t.offset % align:
            raise HeaderFault(f"tensor {t.name}: offset {t.offset} is not aligned to {align}")
        if t.offset < end:
            raise HeaderFault(f"tensor {t.name}: data overlaps the tensor before it")
        end = t.offset + t.nbytes
        if data_start + end > size:
            raise HeaderFault(
                f"tensor {t.name}: data ends at byte {data_start + end}, past the file's {size}"
            )


def parse_gguf_header(buf) -> GgufHeader:
    """Walk and check the header in `buf` (raises HeaderFault)."""
    cur = Cursor(buf, "<")
    if cur.take(4, "magic") != MAGIC:
        raise HeaderFault("no GGUF magic (the file does not start with b'GGUF')")
    version = cur.scalar("I", "version")
    if version not in VERSIONS and version & 0xFFFF == 0:  # written on a big-endian machine
        cur.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in VERSIONS:
        raise HeaderFault(f"version {version} (this reader knows {VERSIONS})")
    n_tensors = cur.scalar("Q", "tensor count")
    kv = _key_values(cur, cur.count("key/value count", 13))
    if n_tensors * 24 > cur.left():
        raise HeaderFault(f"tensor count {n_tensors} cannot fit in the bytes that remain")
    spans = _tensor_infos(cur, n_tensors)
    align = _alignment(kv)
    data_start = -(-cur.pos // align) * align
    _check_data(spans, data_start, len(buf), align)
    return GgufHeader(cur.order, version, kv, spans, data_start)


def check_gguf_header(path: Path) -> None:
    """Raise CheckpointError (naming `path`) unless its GGUF header is well formed."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            parse_gguf_header(buf)  # slices of an mmap are bytes: nothing holds the map open
    except HeaderFault as fault:
        raise CheckpointError(
            f"{path}: not a readable GGUF file: {fault}", file=str(path)
        ) from None
    except ValueError:  # mmap of an empty file
        raise CheckpointError(f"{path}: empty file, not GGUF", file=str(path)) from None
