"""Computed config fields of transformers' SamModel (zoo/sam.linnet, issue 15)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from linnet.errors import ConfigError

KEY = "vision_config.global_attn_indexes"


def _globals(n: int, n_layers: int) -> list[int]:
    return [i for i in range(n_layers) if i % n == n - 1]


def _read_global_every(config: Mapping, field_name: str) -> Any:
    """The n with global attention on layers i % n == n - 1 (SAM ViT-B/L/H: [2, 5, 8, 11],
    [5, 11, 17, 23], [7, 15, 23, 31]); a list no n gives is a ConfigError naming the key."""
    vision = config.get("vision_config") or {}
    indexes = vision.get("global_attn_indexes", [2, 5, 8, 11])
    n_layers = vision.get("num_hidden_layers", 12)
    ok = isinstance(indexes, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in indexes
    )
    if ok and isinstance(n_layers, int) and indexes:
        n = indexes[0] + 1
        if n > 0 and sorted(indexes) == _globals(n, n_layers):
            return n
    raise ConfigError(
        f"config.json: {KEY} {indexes!r} is not every n-th layer (i % n == n - 1) of "
        f"{n_layers}; the source's {field_name} expresses only that pattern"
    )


def _write_global_every(hf: dict, value: Any) -> None:
    vision = hf.setdefault("vision_config", {})
    vision["global_attn_indexes"] = _globals(int(value), int(vision["num_hidden_layers"]))


def sam_computed(computed_type) -> list:
    return [computed_type("sam_global_every", _read_global_every, _write_global_every)]
