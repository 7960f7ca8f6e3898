"""The GGUF reader: a llama.cpp file as a `Weights` stream (source, config, params).

    w = weights_from_gguf("model.gguf")        # headers checked, nothing dequantized yet
    for group, arrays in w: ...                # one tensor at a time, dequantized
    print(plan_text("model.gguf"))             # `linnet plan` for a GGUF file

The front doors load a GGUF file through `linnet.weights.checkpoint.open_checkpoint`,
as they load a safetensors folder.

The architecture's weights map is chosen by `general.architecture` (the weights maps whose
`[gguf] arch` names it; when several share one, as Llama and Mistral share "llama", the
one that understands every metadata key the file has, and of those the one with fewest
keys). The source config comes from the metadata (`[gguf.metadata]`), from which tensors
are present (`[gguf.flags]`: tied head, biases) and from computed tensors
(`[gguf.extra]`: llama3 rope). It is written out as a config.json (`config_to_hf`) and
read back through the same translation an HF folder takes, so both paths agree.

Each GGUF tensor is checked against the source's params (name, shape) before any data is
read; then tensors are dequantized one at a time with the gguf package (F32, F16, BF16,
Q8_0, Q4_0, Q4_1, and every other type it knows), un-permuted
(`WeightsMap.params_from_gguf`) and split into params.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import CheckpointError, UnsupportedArchitecture
from linnet.weights.casting import HF_NAMES, normalize_dtype
from linnet.weights.gguf_metadata import config_from_metadata, extra_rule, special_token_ids
from linnet.weights.maps import WeightsMap, all_weights_maps, load_weights_map
from linnet.weights.stream import Weights, full_config, ordered
from linnet.weights.tensor_group import TensorGroup

# Large tokenizer arrays are left out of the key/values a Weights keeps.
_BULKY = {
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
}
_FILE_TYPES = {0: "f32", 1: "f16", 32: "bf16"}


def open_reader(path: str | Path):
    import gguf

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file", file=str(path))
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError, struct errors, ...
        raise CheckpointError(f"{path}: not a readable GGUF file: {e}", file=str(path)) from e


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
    quantized types dequantized to f32."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if t.tensor_type in (Q.F32, Q.F16):
        return np.array(t.data).reshape(shape)
    if t.tensor_type == Q.BF16:
        return np.array(t.data).view(np.uint16).reshape(shape)
    return quants.dequantize(t.data, t.tensor_type).reshape(shape)


def _dtype_of(t) -> str:
    from gguf import GGMLQuantizationType as Q

    return {Q.F16: "f16", Q.BF16: "bf16"}.get(t.tensor_type, "f32")


def weights_from_gguf(path: str | Path, *, act: str | None = None) -> Weights:
    """A GGUF file as a `Weights` stream (source config from its metadata)."""
    from linnet.loading import source_for

    path = Path(path)
    reader = open_reader(path)
    fields = read_fields(reader)
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise CheckpointError(f"{path}: no general.architecture key", file=str(path))
    weights_map = choose_weights_map(arch, fields)
    spec = weights_map.gguf
    tensors = {t.name: t for t in reader.tensors}

    values = config_from_metadata(spec, fields)
    for name, flag in spec.flags.items():
        values[name] = (flag.tensor in tensors) == flag.present
    for name, rule_name in spec.extra.items():
        if name in tensors:
            rule = extra_rule(rule_name, weights_map.path.name)
            values.update(rule.read(tensor_data(tensors[name]), fields))
    stored = _FILE_TYPES.get(int(fields.get("general.file_type", -1)), "f32")
    act = normalize_dtype(act) if act is not None else "f32"

    hf_config = weights_map.config_to_hf(values)
    hf_config.update(special_token_ids(fields))
    hf_config["dtype"] = HF_NAMES[stored]
    back = weights_map.translate_config(hf_config)
    for k, v in values.items():
        if k in back and back[k] != v:
            raise AssertionError(f"config round trip: {k} = {v!r} came back as {back[k]!r}")

    source = source_for(weights_map)
    config = full_config(source, weights_map, hf_config, act)
    layout = source.params(config)
    shapes = {n: tuple(d.value for d in t.shape) for n, t in layout.shapes.items()}
    groups = _groups(path, weights_map, tensors, shapes, layout.tied, config["act"])

    def read(g: TensorGroup) -> list[np.ndarray]:
        x = tensor_data(g.key)
        return weights_map.params_from_gguf(g.rule, g.bindings, x, config, g.sizes)

    return Weights(
        weights_map=weights_map,
        source=source,
        config=config,
        hf_config=hf_config,
        dtype=stored,
        groups=ordered(weights_map, groups),
        reader=read,
        gguf_metadata=fields,
        origin=str(path),
    )


@dataclass(frozen=True)
class GgufTensorInfo:
    """A GGUF tensor's header: numpy-order shape and its ggml type name."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "F32", "Q4_1", ...


class GgufCheckpoint:
    """A GGUF file's tensor headers, as a load plan reads a safetensors folder's."""

    def __init__(self, path: Path, tensors: dict):
        self.folder = path
        self.tensors = tensors

    def headers(self) -> dict[str, GgufTensorInfo]:
        return {
            name: GgufTensorInfo(
                name, tuple(int(d) for d in reversed(t.shape.tolist())), t.tensor_type.name
            )
            for name, t in self.tensors.items()
        }


def _groups(path: Path, weights_map: WeightsMap, tensors: dict, shapes: dict, tied: dict, act):
    """The file's tensors planned against the source's params (every problem raised
    first), as the groups of a stream."""
    from linnet.weights.plan import make_plan
    from linnet.weights.plan_checks import GGUF_NAMES

    plan = make_plan(
        GgufCheckpoint(path, tensors), weights_map, shapes, tied, act, config={}, names=GGUF_NAMES
    )
    plan.check()
    groups = [row for row in plan.rows if row.loads]
    for g in groups:
        g.key, g.read_dtype = tensors[g.hf], _dtype_of(tensors[g.hf])
        g.hf = g.rule.hf_name(g.bindings)  # writers name groups by their HF tensor
    return groups


def plan_text(path: str | Path) -> str:
    """`linnet plan` for a GGUF file: metadata, config, and each tensor's params."""
    w = weights_from_gguf(path)
    lines = [
        f"gguf          {w.gguf_metadata.get('general.architecture')} -> "
        f"{w.weights_map.architecture}  (weights map {w.weights_map.path.name})",
        f"source        {w.weights_map.source}",
        "config        " + " ".join(f"{k}={v}" for k, v in w.config.items()),
        "",
    ]
    rows = [("GGUF tensor", "shape", "type", "transform", "params")]
    for g in w.groups:
        t = g.key
        ts = w.weights_map.gguf.transforms_for(t.name)
        steps = [f"rope_unpermute({x.field})" for x in ts]
        if g.rule.split_axis is not None:
            steps.append(f"split[{g.rule.split_axis}]")
        shape = "[" + ", ".join(str(int(d)) for d in reversed(t.shape.tolist())) + "]"
        rows.append(
            (t.name, shape, t.tensor_type.name, " → ".join(steps) or "-", ", ".join(g.params))
        )
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    for r in rows:
        lines.append("  ".join(c.ljust(wd) for c, wd in zip(r[:4], widths)) + "  " + r[4])
    lines.append("")
    lines.append(f"{len(w.groups)} tensors -> {sum(len(g.params) for g in w.groups)} params")
    return "\n".join(lines)
