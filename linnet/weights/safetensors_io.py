"""Read a local Hugging Face checkpoint folder: config.json and safetensors, headers first.

`Checkpoint(folder)` finds `model.safetensors` or a sharded set named by
`model.safetensors.index.json` (diffusers': `diffusion_pytorch_model.safetensors`).
`headers()` parses every safetensors header itself (8-byte little-endian length, then
JSON) without touching tensor data, and checks that the header is sane and that every
tensor's bytes lie inside its file, so a truncated download is caught before anything is
read. `read(name)` loads one tensor through `safetensors.safe_open` (memory-mapped), so a caller
that streams tensors holds about one tensor at a time.

Pickled weights (`pytorch_model.bin`, `*.pt`, ...) are never opened: unpickling
runs arbitrary code, so a folder that only has those is refused.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linnet.core.dtypes import DTYPES
from linnet.core.dtypes import FLOAT_DTYPES as LINNET_FLOATS
from linnet.errors import CheckpointError, PickledCheckpoint
from linnet.weights import mxfp4
from linnet.weights.jsonfile import read_json_object

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# the weights' file stem: transformers' `model`, diffusers' `diffusion_pytorch_model`
WEIGHT_STEMS = ("model", "diffusion_pytorch_model")
CONFIG_FILE = "config.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

# Upper bound on a header's JSON; the safetensors library itself refuses more than 100 MB.
MAX_HEADER_BYTES = 100 * 1024 * 1024

# Bytes per element of each safetensors dtype (sub-byte types count as fractions).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

FLOAT_DTYPES = tuple(DTYPES[n].safetensors for n in LINNET_FLOATS)  # F32, F16, BF16


# safetensors dtype -> numpy dtype (as stored; bfloat16 from ml_dtypes): Linnet's dtypes
# from the one table, then the codes only the format has.
NUMPY_DTYPES = {
    **{row.safetensors: row.numpy for row in DTYPES.values()},
    "F64": "<f8",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header describes it; no data is read.

    `offsets` is the (begin, end) byte range of the tensor's data in `file`,
    counted from the start of the file (header included).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    offsets: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.offsets[1] - self.offsets[0]


def read_header(file: Path) -> dict[str, TensorInfo]:
    """Parse and validate the header of one safetensors file (reads only the header bytes)."""
    file = Path(file)
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"{file}: not a safetensors file: {size} bytes, too short for a header",
                    file=str(file),
                )
            (length,) = struct.unpack("<Q", head)
            if length < 2 or length > MAX_HEADER_BYTES or 8 + length > size:
                raise CheckpointError(
                    f"{file}: corrupt or truncated safetensors file: the header claims {length} "
                    f"bytes but the file holds {size} bytes in all",
                    file=str(file),
                )
            raw = f.read(length)
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read: {e.strerror or e}", file=str(file)) from e
    return parse_header(file, raw, 8 + length, size)


def parse_header(file: Path, raw: bytes, data_start: int, size: int) -> dict[str, TensorInfo]:
    """The tensors a header's JSON (`raw`) declares, each checked, and their byte ranges
    checked as the format requires: unique names, and ranges that tile the data from its
    start to the end of the file, with no overlap and no gap."""
    header = _header_json(file, raw)
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            _check_metadata(file, entry)
            continue
        infos[name] = _tensor_info(file, name, entry, data_start)
    _check_layout(file, sorted(infos.values(), key=lambda t: t.offsets), data_start, size)
    return infos


def _check_metadata(file: Path, metadata: Any) -> None:
    """The format's `__metadata__` is a map of strings to strings."""
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise CheckpointError(
            f"{file}: corrupt safetensors header (__metadata__ must map strings to strings)",
            file=str(file),
        )


def _unique_keys(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"{', '.join(map(repr, twice))} listed twice")
    return dict(pairs)


def _header_json(file: Path, raw: bytes) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except RecursionError:
        raise CheckpointError(
            f"{file}: corrupt safetensors header (nested too deeply)", file=str(file)
        ) from None
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise CheckpointError(
            f"{file}: corrupt safetensors header (not valid JSON: {e})", file=str(file)
        ) from e
    if not isinstance(header, dict):
        raise CheckpointError(
            f"{file}: corrupt safetensors header (not a JSON object)", file=str(file)
        )
    return header


def _check_layout(file: Path, infos: list[TensorInfo], data_start: int, size: int) -> None:
    """`infos` in file order: each tensor's bytes present, then no overlap, gap or tail."""
    for info in infos:  # a truncated file: name the first tensor whose bytes do not all fit
        if info.offsets[1] > size:
            raise CheckpointError(
                f"{file}: truncated: tensor {info.name} needs bytes up to "
                f"{info.offsets[1]} but the file holds only {size} bytes",
                tensor=info.name,
                file=str(file),
            )
    at = data_start
    for info in infos:
        if info.offsets[0] != at:
            what = "overlaps the tensor before it" if info.offsets[0] < at else "leaves a gap"
            raise CheckpointError(
                f"{file}: corrupt safetensors header: tensor {info.name}'s data_offsets "
                f"{what} (it starts at byte {info.offsets[0] - data_start} of the data, "
                f"the tensors before it end at {at - data_start})",
                tensor=info.name,
                file=str(file),
            )
        at = info.offsets[1]
    if at != size:
        raise CheckpointError(
            f"{file}: corrupt safetensors header: the tensors' data ends at byte "
            f"{at} but the file holds {size}",
            file=str(file),
        )


def _tensor_info(file: Path, name: str, entry: Any, data_start: int) -> TensorInfo:
    def bad(why: str) -> CheckpointError:
        return CheckpointError(
            f"{file}: corrupt safetensors header for tensor {name}: {why}",
            tensor=name,
            file=str(file),
        )

    if not isinstance(entry, dict):
        raise bad("entry is not a JSON object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad(f"dtype {dtype!r} is not a string")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise bad(f"shape {shape!r} is not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise bad(f"data_offsets {offsets!r} is not a [begin, end] pair")
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise bad(f"dtype {dtype!r} is not a safetensors dtype ({', '.join(DTYPE_BITS)})")
    want = math.prod(shape) * bits
    if want % 8:
        raise bad(f"{dtype}{list(shape)} is {want} bits, not a whole number of bytes")
    if want // 8 != offsets[1] - offsets[0]:
        raise bad(
            f"{dtype}{list(shape)} needs {want // 8} bytes but data_offsets span "
            f"{offsets[1] - offsets[0]}"
        )
    return TensorInfo(
        name=name,
        dtype=dtype,
        shape=tuple(shape),
        file=file,
        offsets=(data_start + offsets[0], data_start + offsets[1]),
    )


def _pickled_files(folder: Path) -> list[Path]:
    """Names of pickled weight files in `folder` (by name only; none is opened)."""
    return sorted(p for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())


class Checkpoint:
    """A local Hugging Face checkpoint folder holding config.json and safetensors weights."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.exists():
            raise CheckpointError(
                f"{self.folder}: no such checkpoint folder", file=str(self.folder)
            )
        if not self.folder.is_dir():
            raise CheckpointError(
                f"{self.folder}: not a folder (a checkpoint is a folder holding config.json "
                "and model.safetensors)",
                file=str(self.folder),
            )
        self.config_path = self.folder / CONFIG_FILE
        self.index_path: Path | None = None
        self.files = self._find_weights()
        if not self.config_path.is_file():
            raise CheckpointError(
                f"{self.config_path}: missing: a checkpoint folder needs config.json",
                file=str(self.config_path),
            )
        self._headers: dict[str, TensorInfo] | None = None
        self.packed: dict[str, tuple[str, str]] = {}  # MXFP4: name -> (blocks, scales)
        self.raw_headers: dict[str, TensorInfo] = {}
        self._config: dict | None = None
        self._handles: dict[Path, Any] = {}

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.folder)!r})"

    # -- locating the weights ---------------------------------------------------------

    def _find_weights(self) -> list[Path]:
        # transformers' names, then diffusers'; a diffusers fp16 variant only where the plain
        # weights are absent (an f16 pull fetches the variant alone)
        for variant in ("", ".fp16"):
            for stem in WEIGHT_STEMS:
                index = self.folder / f"{stem}.safetensors.index{variant}.json"
                single = self.folder / f"{stem}{variant}.safetensors"
                if index.is_file():
                    self.index_path = index
                    return sorted(set(self._weight_map().values()))
                if single.is_file():
                    return [single]
        pickled = _pickled_files(self.folder)
        if pickled:
            names = ", ".join(p.name for p in pickled)
            raise PickledCheckpoint(
                f"{self.folder}: only pickled weights here ({names}); Linnet never unpickles "
                "checkpoints (unpickling runs arbitrary code). Convert them to safetensors, or "
                "download the repository's model.safetensors instead",
                file=str(pickled[0]),
            )
        raise CheckpointError(
            f"{self.folder}: no weights: expected {SINGLE_FILE} or {INDEX_FILE}",
            file=str(self.folder),
        )

    def _weight_map(self) -> dict[str, Path]:
        """Tensor name -> shard path, from the index file."""
        assert self.index_path is not None
        path = self.index_path
        try:
            index = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: unreadable index: {e}", file=str(path)) from e
        wmap = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise CheckpointError(
                f"{path}: corrupt index: no weight_map object of tensor -> file", file=str(path)
            )
        out: dict[str, Path] = {}
        for name, shard in wmap.items():
            shard_path = self.folder / shard
            if Path(shard).name != shard or not shard.endswith(".safetensors"):
                raise CheckpointError(
                    f"{path}: tensor {name} points at {shard!r}, not a safetensors file in the "
                    "checkpoint folder",
                    tensor=name,
                    file=str(path),
                )
            if not shard_path.is_file():
                raise CheckpointError(
                    f"{shard_path}: missing shard (the index puts tensor {name} there)",
                    tensor=name,
                    file=str(shard_path),
                )
            out[name] = shard_path
        return out

    # -- config and headers -----------------------------------------------------------

    def read_config(self) -> dict:
        """The parsed config.json."""
        if self._config is None:
            config = read_json_object(self.config_path)
            self._config = config
        return self._config

    @property
    def architecture(self) -> str:
        """The first entry of config.json's `architectures`."""
        archs = self.read_config().get("architectures")
        if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
            raise CheckpointError(
                f"{self.config_path}: no `architectures` list naming the model class",
                file=str(self.config_path),
            )
        return archs[0]

    def headers(self) -> dict[str, TensorInfo]:
        """Every tensor of the checkpoint, from the safetensors headers only (cached)."""
        if self._headers is not None:
            return self._headers
        per_file = {f: read_header(f) for f in self.files}
        if self.index_path is None:
            headers = per_file[self.files[0]]
        else:
            headers = {}
            for name, shard in self._weight_map().items():
                info = per_file[shard].get(name)
                if info is None:
                    raise CheckpointError(
                        f"{shard}: the index puts tensor {name} in this shard but it is not there",
                        tensor=name,
                        file=str(shard),
                    )
                headers[name] = info
            for shard, infos in per_file.items():
                for name in infos:
                    if name not in headers:
                        raise CheckpointError(
                            f"{shard}: tensor {name} is in this shard but not in {INDEX_FILE}",
                            tensor=name,
                            file=str(shard),
                        )
        self._headers, self.packed = mxfp4.pair_packed(headers)
        self.raw_headers = headers  # as stored (an export copies unchanged MXFP4 pairs)
        return self._headers

    def _stored(self, name: str) -> TensorInfo | None:
        """A tensor's header: a checkpoint's (an MXFP4 pair's dequantized tensor) or, for
        the pair's own `_blocks` and `_scales`, as stored."""
        return self.headers().get(name) or self.raw_headers.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self.headers()

    # -- data -------------------------------------------------------------------------

    def read(self, name: str):
        """Load tensor `name` as a torch.Tensor through a memory-mapped safetensors handle."""
        info = self._stored(name)
        if name in self.packed:
            import torch

            return torch.from_numpy(mxfp4.read_dequantized(self.read_numpy, self.packed[name]))
        if info is None:
            raise CheckpointError(f"{self.folder}: no tensor {name}", tensor=name)
        handle = self._handles.get(info.file)
        if handle is None:
            from safetensors import safe_open

            try:
                handle = safe_open(str(info.file), framework="pt")
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(
                    f"{info.file}: cannot open: {e}", tensor=name, file=str(info.file)
                ) from e
            self._handles[info.file] = handle
        try:
            return handle.get_tensor(name)
        except Exception as e:
            raise CheckpointError(
                f"{info.file}: cannot read tensor {name}: {e}", tensor=name, file=str(info.file)
            ) from e

    def read_numpy(self, name: str):
        """Load tensor `name` as a read-only numpy array over a memory map of its file,
        without torch (BF16 through `ml_dtypes`, which jax depends on)."""
        import mmap

        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
        import numpy as np

        info = self._stored(name)
        if name in self.packed:
            return mxfp4.read_dequantized(self.read_numpy, self.packed[name])
        if info is None:
            raise CheckpointError(f"{self.folder}: no tensor {name}", tensor=name)
        if info.dtype not in NUMPY_DTYPES:
            raise CheckpointError(
                f"{info.file}: tensor {name} has dtype {info.dtype}, which numpy cannot read",
                tensor=name,
                file=str(info.file),
            )
        key = ("numpy", info.file)
        buffer = self._handles.get(key)
        if buffer is None:
            with open(info.file, "rb") as f:
                buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._handles[key] = buffer
        dtype = np.dtype(NUMPY_DTYPES[info.dtype])
        count = info.nbytes // dtype.itemsize
        flat = np.frombuffer(buffer, dtype=dtype, count=count, offset=info.offsets[0])
        return flat.reshape(info.shape)

    def close(self) -> None:
        """Drop the open safetensors handles (and their memory maps)."""
        self._handles.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
