"""Byte-level writers for hostile files: safetensors with any header, GGUF with any fields.

Both formats are written here from their specs (not through the libraries under test), so a
case can say exactly which count, length, type or offset is wrong.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# GGUF value types (gguf.h)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_CODES = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?"}
_CODES.update({U64: "Q", I64: "q", F64: "d"})


def safetensors_bytes(header, data: bytes = b"", *, header_len: int | None = None) -> bytes:
    """A safetensors file: u64 header length, the header (a dict, or raw bytes), the data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    size = len(raw) if header_len is None else header_len
    return struct.pack("<Q", size) + raw + data


def gguf_string(text: str | bytes, *, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def gguf_value(vtype: int, value) -> bytes:
    if vtype == STRING:
        return gguf_string(value)
    if vtype == ARRAY:
        item, items = value
        return struct.pack("<IQ", item, len(items)) + b"".join(gguf_value(item, v) for v in items)
    return struct.pack("<" + _CODES[vtype], value)


def gguf_kv(key: str, vtype: int, value) -> bytes:
    return gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, value)


def gguf_tensor(name: str, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    """A tensor info: name, dims (ggml order), type (0: F32), offset in the data section."""
    return (
        gguf_string(name)
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<IQ", ggml_type, offset)
    )


def gguf_bytes(
    kvs: list[bytes],
    tensors: list[bytes],
    data: bytes = b"",
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    magic: bytes = b"GGUF",
    align: int = 32,
) -> bytes:
    """A GGUF file from encoded key/values and tensor infos (counts may lie)."""
    head = magic + struct.pack(
        "<IQQ",
        version,
        len(tensors) if n_tensors is None else n_tensors,
        len(kvs) if n_kv is None else n_kv,
    )
    head += b"".join(kvs) + b"".join(tensors)
    head += b"\0" * (-len(head) % align)
    return head + data


def minimal_gguf(**overrides) -> bytes:
    """A well-formed GGUF: one key, one 4x2 F32 tensor (the control case)."""
    kvs = overrides.pop("kvs", [gguf_kv("general.architecture", STRING, "llama")])
    tensors = overrides.pop("tensors", [gguf_tensor("t", [4, 2])])
    data = overrides.pop("data", bytes(32))
    return gguf_bytes(kvs, tensors, data, **overrides)


def set_gguf_u32(blob: bytes, key: str, value: int) -> bytes:
    """`blob` with the u32 value of metadata `key` replaced (found by its encoded key)."""
    at = blob.index(gguf_string(key)) + len(gguf_string(key))
    (vtype,) = struct.unpack_from("<I", blob, at)
    assert vtype == U32, f"{key} is type {vtype}, not u32"
    return blob[: at + 4] + struct.pack("<I", value) + blob[at + 8 :]


def write(path: Path, blob: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blob)
    return path
