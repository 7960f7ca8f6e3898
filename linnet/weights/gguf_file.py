"""A GGUF file read through Linnet's own checked header walk (`gguf_header`).

    f = GgufFile("model.Q4_1.gguf")
    f.fields["general.architecture"].contents()   # "llama"
    f.tensors[0].name, f.tensors[0].tensor_type, f.tensors[0].data

It offers what Linnet used of the gguf package's `GGUFReader` (fields with `types` and
`contents()`, tensors with `name`, `shape` in ggml order, `tensor_type` and `data` as a
view of the mapped file, typed as the gguf package types it), and is tested equal to it.
The gguf package's reader builds a numpy view for every part of every key/value, so
opening a file with a 49k-token vocabulary took about 4 s on a quiet core; here an array
stays a reference into the file until a caller asks for its contents (Linnet asks only
for the tokenizer's arrays when it rebuilds or copies a tokenizer).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np

from linnet.errors import CheckpointError
from linnet.weights.gguf_header import (
    SCALARS,
    STRING,
    ArrayRef,
    GgufHeader,
    HeaderFault,
    parse_gguf_header,
)

# ggml types whose data the gguf package types as numbers; every other type is raw bytes
_NUMBER_TYPES = {0: "f4", 1: "f2", 24: "i1", 25: "i2", 26: "i4", 27: "i8", 28: "f8"}
_NUMPY_CODES = {"B": "u1", "b": "i1", "H": "u2", "h": "i2", "I": "u4", "i": "i4", "f": "f4",
                "?": "?", "Q": "u8", "q": "i8", "d": "f8"}  # fmt: skip


class GgufField:
    """One key/value: `types` (GGUFValueType list, arrays as [ARRAY, item]) and its value."""

    def __init__(self, name: str, types: list[int], value, buf, order: str):
        from gguf import GGUFValueType

        self.name, self.types = name, [GGUFValueType(t) for t in types]
        self._value, self._buf, self._order = value, buf, order

    def contents(self):
        return _materialize(self._value, self._buf, self._order, self.name)


def _materialize(value, buf, order: str, what: str):
    if isinstance(value, list):
        return [_materialize(v, buf, order, what) for v in value]
    if not isinstance(value, ArrayRef):
        return value
    if value.item in SCALARS:
        dtype = np.dtype(order + _NUMPY_CODES[SCALARS[value.item]])
        return np.frombuffer(buf, dtype, value.count, value.offset).tolist()
    assert value.item == STRING  # the header walk admits nothing else as an ArrayRef
    return _strings(buf, value, order, what)


def _strings(buf, ref: ArrayRef, order: str, what: str) -> list[str]:
    out, pos, length = [], ref.offset, struct.Struct(order + "Q")
    for i in range(ref.count):
        (n,) = length.unpack_from(buf, pos)
        try:
            out.append(buf[pos + 8 : pos + 8 + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise CheckpointError(f"GGUF value {what}[{i}] is not UTF-8") from None
        pos += 8 + n
    return out


class GgufTensor:
    """One tensor: name, ggml type, dims (ggml order) and its bytes as a typed view."""

    def __init__(self, span, data_start: int, buf, order: str):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.name = span.name
        self.tensor_type = GGMLQuantizationType(span.ggml_type)
        self.shape = np.array(span.dims, dtype=np.uint64)
        self.n_elements = int(np.prod(span.dims))
        self.n_bytes = span.nbytes
        self.data_offset = data_start + span.offset
        numpy_dims = list(reversed(span.dims))
        code = _NUMBER_TYPES.get(span.ggml_type)
        if code is None:  # blocks of a quantized (or bf16) type: bytes per row
            block, size = GGML_QUANT_SIZES[self.tensor_type]
            numpy_dims[-1] = numpy_dims[-1] // block * size
            code = "u1"
        dtype = np.dtype(order + code)
        count = span.nbytes // dtype.itemsize
        self.data = np.frombuffer(buf, dtype, count, self.data_offset).reshape(numpy_dims)


class GgufFile:
    """A checked GGUF file: `fields` (key -> GgufField) and `tensors` (in file order)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # mmap of an empty file
                raise CheckpointError(f"{path}: empty file, not GGUF", file=str(path)) from None
        try:
            header = parse_gguf_header(self._map)
        except HeaderFault as fault:
            raise CheckpointError(
                f"{path}: not a readable GGUF file: {fault}", file=str(path)
            ) from None
        self.version = header.version
        self.fields = self._fields(header)
        self.tensors = [
            GgufTensor(t, header.data_start, self._map, header.order) for t in header.tensors
        ]

    def _fields(self, header: GgufHeader) -> dict[str, GgufField]:
        return {
            key: GgufField(key, types, value, self._map, header.order)
            for key, (types, value) in header.values.items()
        }
