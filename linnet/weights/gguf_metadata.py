"""What a GGUF file needs beyond the weights map's names: typed metadata values and the
named rules of `[gguf.extra]` (the tokenizer is `gguf_tokenizer.py`).

Tensor names, metadata keys and the Q/K permutation live in the weights maps
(`weights_maps/*.toml`, `[gguf]` and each rule's `gguf = ...`). This module holds only
what is not per architecture:

* `metadata_values(spec, config)`: the `[gguf.metadata]` keys with their values and types;
  `config_from_metadata` reads them back.
* `EXTRA`: named rules for tensors computed from the config (`llama3_rope_freqs`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from linnet.errors import ConfigError, LinnetError
from linnet.weights.maps import MISSING, GgufSpec

# ----------------------------------------------------------------------------------------
# Metadata values


def _coerce(value: Any, type_: str, key: str) -> Any:
    if type_ in ("u32", "i32"):
        if isinstance(value, bool) or float(value) != int(value):
            raise ConfigError(f"GGUF key {key}: {value!r} is not an integer")
        return int(value)
    if type_ == "f32":
        return float(value)
    if type_ == "bool":
        return bool(value)
    return str(value)


def metadata_values(spec: GgufSpec, config: Mapping) -> list[tuple[str, Any, str]]:
    """(key, value, type) for every `[gguf.metadata]` key whose field has a value."""
    out = []
    for pattern, k in spec.metadata.items():
        value = config.get(k.field)
        if value is None or (k.omit is not MISSING and value == k.omit):
            continue
        key = spec.key(pattern)
        out.append((key, _coerce(value, k.type, key), k.type))
    return out


def config_from_metadata(spec: GgufSpec, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Source config values from a GGUF file's key/values (keys the map names)."""
    out: dict[str, Any] = {}
    for pattern, k in spec.metadata.items():
        key = spec.key(pattern)
        if key in fields:
            out[k.field] = decode(fields[key], k.type)
    return out


def decode(value: Any, type_: str) -> Any:
    """A metadata value as config.json would hold it: an f32 becomes the shortest decimal
    that rounds to it (1e-05, not 9.999999747378752e-06), so HF -> GGUF -> HF keeps it."""
    if type_ in ("u32", "i32"):
        return int(value)
    if type_ == "f32":
        return float(str(np.float32(value)))
    return value


def add_metadata(writer, items: list[tuple[str, Any, str]]) -> None:
    from gguf import GGUFValueType as T

    types = {"u32": T.UINT32, "i32": T.INT32, "f32": T.FLOAT32, "bool": T.BOOL, "str": T.STRING}
    for key, value, type_ in items:
        writer.add_key_value(key, value, types[type_])


# ----------------------------------------------------------------------------------------
# [gguf.extra]: tensors computed from the config


@dataclass(frozen=True)
class ExtraRule:
    """`export(config)` -> (tensor or None, metadata items); `read(tensor, fields)` ->
    config values (fields: the file's key/values)."""

    export: Callable[[Mapping], tuple[np.ndarray | None, list[tuple[str, Any, str]]]]
    read: Callable[[np.ndarray, Mapping], dict[str, Any]]


LLAMA3_KEYS = {
    "linnet.rope.factor": ("rope_factor", "f32"),
    "linnet.rope.low_freq_factor": ("rope_low_freq", "f32"),
    "linnet.rope.high_freq_factor": ("rope_high_freq", "f32"),
    "linnet.rope.original_context_length": ("rope_original_max", "u32"),
}


def llama3_factors(
    theta: float, head_dim: int, factor: float, low: float, high: float, original: int
) -> np.ndarray:
    """llama.cpp's rope_freqs for llama3 rope: the divisor of each frequency
    (convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _llama3_export(config: Mapping):
    if config.get("rope_scaling") != "llama3":
        return None, []
    x = llama3_factors(
        float(config["rope_theta"]),
        int(config["head_dim"]),
        float(config["rope_factor"]),
        float(config["rope_low_freq"]),
        float(config["rope_high_freq"]),
        int(config["rope_original_max"]),
    )
    items = [(k, _coerce(config[f], t, k), t) for k, (f, t) in LLAMA3_KEYS.items()]
    return x, items


def _llama3_read(x: np.ndarray, fields: Mapping) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_scaling": "llama3"}
    if all(k in fields for k in LLAMA3_KEYS):
        for k, (f, t) in LLAMA3_KEYS.items():
            out[f] = decode(fields[k], t)
        return out
    # A file from another converter: Llama 3.1's parameters, checked against the tensor.
    arch = fields.get("general.architecture", "llama")
    theta = float(fields.get(f"{arch}.rope.freq_base", 10000.0))
    head_dim = 2 * int(x.shape[0])
    guess = {"rope_factor": float(np.max(x)), "rope_low_freq": 1.0, "rope_high_freq": 4.0}
    guess["rope_original_max"] = 8192
    want = llama3_factors(theta, head_dim, *guess.values())
    if not np.allclose(want, x, rtol=1e-5):
        raise LinnetError(
            "rope_freqs.weight holds llama3-style divisors whose parameters this file does "
            "not record (no linnet.rope.* keys) and that are not Llama 3.1's"
        )
    return out | guess


EXTRA: dict[str, ExtraRule] = {
    "llama3_rope_freqs": ExtraRule(_llama3_export, _llama3_read),
}


def extra_rule(name: str, where: str) -> ExtraRule:
    if name not in EXTRA:
        raise ConfigError(
            f"{where}: unknown [gguf.extra] rule {name!r} (known: {', '.join(EXTRA)})"
        )
    return EXTRA[name]


def special_token_ids(fields: Mapping[str, Any]) -> dict[str, int]:
    """bos/eos/pad/unk token ids from a GGUF file's key/values, as config.json names them."""
    out = {}
    names = {"bos": "bos", "eos": "eos", "pad": "padding", "unk": "unknown"}
    for kind, gguf_kind in names.items():
        key = f"tokenizer.ggml.{gguf_kind}_token_id"
        if key in fields:
            out[f"{kind}_token_id"] = int(fields[key])
    return out
