"""A GGUF file behind the same checkpoint interface as a safetensors folder
(`linnet.weights.safetensors_io.Checkpoint`): tensor headers, the HF config, tensor reads.

    ck = GgufCheckpoint("model.Q4_1.gguf")
    ck.headers()            # name -> GgufTensorInfo(shape in numpy order, ggml type)
    ck.read_config()        # config.json rebuilt from the metadata through the weights map
    ck.read_numpy(name)     # one tensor, dequantized to f32 (F16, BF16 bits as stored)

The weights map is chosen by `general.architecture` (the maps whose `[gguf] arch` names
it; when several share one, as Llama and Mistral share "llama", the one that understands
every metadata key the file has, and of those the one with fewest keys). The source
config comes from the metadata (`[gguf.metadata]`), from which tensors are present
(`[gguf.flags]`: tied head, biases) and from computed tensors (`[gguf.extra]`: llama3
rope); it is written out as a config.json (`config_to_hf`) and read back through the same
translation an HF folder takes, so both paths agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import CheckpointError, UnsupportedArchitecture
from linnet.weights import mxfp4
from linnet.weights.casting import HF_NAMES
from linnet.weights.gguf_file import GgufFile
from linnet.weights.gguf_metadata import config_from_metadata, extra_rule, special_token_ids
from linnet.weights.maps import WeightsMap, all_weights_maps, load_weights_map
from linnet.weights.maps.gguf import GgufFused

# Large tokenizer arrays are left out of the key/values a Weights keeps.
_BULKY = {
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
}
_FILE_TYPES = {0: "f32", 1: "f16", 32: "bf16"}


def open_reader(path: str | Path) -> GgufFile:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file", file=str(path))
    return GgufFile(path)  # checks every count and offset of the header before using it


def read_fields(reader) -> dict[str, Any]:
    out = {}
    for key, f in reader.fields.items():
        if key in _BULKY or key.startswith("GGUF."):
            continue
        out[key] = f.contents()
    return out


def choose_weights_map(arch: str, fields: dict[str, Any]) -> WeightsMap:
    candidates = []
    for path in all_weights_maps().values():
        m = load_weights_map(path)
        if m.gguf is not None and m.gguf.arch == arch:
            candidates.append(m)
    if not candidates:
        known = sorted(
            {m.gguf.arch for m in map(load_weights_map, all_weights_maps().values()) if m.gguf}
        )
        raise UnsupportedArchitecture(
            f"GGUF architecture {arch!r} has no weights map; supported: {', '.join(known)}"
        )
    declared = {m.gguf.key(k) for m in candidates for k in m.gguf.metadata}
    present = declared & set(fields)
    fits = [m for m in candidates if present <= {m.gguf.key(k) for k in m.gguf.metadata}]
    if not fits:
        raise UnsupportedArchitecture(
            f"GGUF {arch}: no weights map understands all of {sorted(present)}"
        )
    return min(fits, key=lambda m: (len(m.gguf.metadata), m.architecture))


def tensor_data(t) -> np.ndarray:
    """One GGUF tensor in numpy order: float types as they are (BF16 as uint16 bits),
    quantized types dequantized to f32 (MXFP4 by Linnet's exact decoder)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    if isinstance(t, FusedTensor):
        return t.read()
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if t.tensor_type in (Q.F32, Q.F16):
        return np.array(t.data).reshape(shape)
    if t.tensor_type == Q.BF16:
        return np.array(t.data).view(np.uint16).reshape(shape)
    if t.tensor_type == Q.MXFP4:
        blocks, scales = mxfp4.from_ggml(np.asarray(t.data), shape[-1])
        return mxfp4.dequantize_rows(blocks, scales).reshape(shape)
    return quants.dequantize(t.data, t.tensor_type).reshape(shape)


@dataclass
class FusedTensor:
    """One tensor of the source that a GGUF file holds as several (`[gguf.fused]`: GPT-OSS's
    expert gate and up), with a reader tensor's attributes (`shape` in ggml order)."""

    name: str
    parts: list  # the gguf package's ReaderTensors
    how: GgufFused

    @property
    def tensor_type(self):
        return self.parts[0].tensor_type

    @property
    def shape(self) -> np.ndarray:
        part = tuple(int(d) for d in reversed(self.parts[0].shape.tolist()))
        return np.array(list(reversed(self.how.whole_shape(part))))

    def read(self) -> np.ndarray:
        parts = [tensor_data(p) for p in self.parts]
        if len({(x.shape, x.dtype) for x in parts}) != 1:
            names = ", ".join(p.name for p in self.parts)
            raise CheckpointError(f"GGUF tensors {names} differ in shape or type", tensor=self.name)
        return self.how.join(parts)


def _dtype_of(t) -> str:
    from gguf import GGMLQuantizationType as Q

    return {Q.F16: "f16", Q.BF16: "bf16"}.get(t.tensor_type, "f32")


def tensor_dtype(t) -> str:
    """What `tensor_data` returns for `t`: f16 and bf16 as stored, else f32."""
    from gguf import GGMLQuantizationType as Q

    return {Q.F16: "f16", Q.BF16: "bf16"}.get(t.tensor_type, "f32")


def _with_fused(tensors: dict, spec) -> dict:
    """The file's tensors with each `[gguf.fused]` set of parts replaced by the whole."""
    out = dict(tensors)
    for name, parts in spec.fuse_names(tensors).items():
        how, _ = spec.fused_for(name)
        out[name] = FusedTensor(name, [out.pop(p) for p in parts], how)
    return out


@dataclass(frozen=True)
class GgufTensorInfo:
    """A GGUF tensor's header: numpy-order shape and its ggml type name."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "F32", "Q4_1", ...


class GgufCheckpoint:
    """A GGUF file: its metadata, the weights map it is read through, its tensors."""

    def __init__(self, path: str | Path):
        self.folder = self.path = Path(path)
        reader = open_reader(self.path)
        self.fields = read_fields(reader)
        arch = self.fields.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointError(f"{path}: no general.architecture key", file=str(path))
        self.weights_map = choose_weights_map(arch, self.fields)
        self.tensors = _with_fused({t.name: t for t in reader.tensors}, self.weights_map.gguf)

    @property
    def stored_dtype(self) -> str:
        """f32, f16 or bf16: the file's `general.file_type` (f32 for quantized files)."""
        return _FILE_TYPES.get(int(self.fields.get("general.file_type", -1)), "f32")

    def headers(self) -> dict[str, GgufTensorInfo]:
        return {
            name: GgufTensorInfo(
                name, tuple(int(d) for d in reversed(t.shape.tolist())), t.tensor_type.name
            )
            for name, t in self.tensors.items()
        }

    def read_numpy(self, name: str) -> np.ndarray:
        return tensor_data(self.tensors[name])

    def source_values(self) -> dict[str, Any]:
        """Source config values from the metadata, the flags and the extra tensors."""
        spec, fields = self.weights_map.gguf, self.fields
        values = config_from_metadata(spec, fields)
        for name, flag in spec.flags.items():
            values[name] = (flag.tensor in self.tensors) == flag.present
        for name, rule_name in spec.extra.items():
            if name in self.tensors:
                rule = extra_rule(rule_name, self.weights_map.path.name)
                values.update(rule.read(self.read_numpy(name), fields))
        return values

    def read_config(self) -> dict[str, Any]:
        """config.json rebuilt from the metadata; it translates back to the same values."""
        values = self.source_values()
        hf_config = self.weights_map.config_to_hf(values)
        hf_config.update(special_token_ids(self.fields))
        hf_config["dtype"] = HF_NAMES[self.stored_dtype]
        back = self.weights_map.translate_config(hf_config)
        for k, v in values.items():
            if k in back and back[k] != v:
                raise AssertionError(f"config round trip: {k} = {v!r} came back as {back[k]!r}")
        return hf_config
