"""Config translation: HF config.json <-> source config values (format: docs/weights-maps.md).

    fields = {"vocab": FieldSpec("vocab", ("vocab_size",), default=32000)}
    translate(fields, {}, [], {"vocab_size": 64}, "LlamaForCausalLM")     # {"vocab": 64}
    to_hf(fields, {}, [], {"vocab": 64}, "llama.toml")                    # {"vocab_size": 64}

A `FieldSpec` reads one source field (paths tried in order, a default, a `null` value, a
value map, or a `Computed` rule); a `Requirement` is an HF field the source can express
with one value only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from linnet.errors import ConfigError
from linnet.weights.maps.computed import Computed

MISSING = object()  # "no value": the source's own default applies


def lookup(config: Mapping, path: str) -> Any:
    """Value at a dotted path, `MISSING` if any step is absent (or not a dict)."""
    node: Any = config
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return MISSING
        node = node[key]
    return node


def set_path(config: dict, path: str, value: Any) -> None:
    keys = path.split(".")
    node = config
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def same(value: Any, want: Any) -> bool:
    """JSON equality that keeps booleans apart from numbers (true != 1)."""
    if isinstance(value, bool) or isinstance(want, bool):
        return value is want
    return value == want


def _map_key(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@dataclass
class FieldSpec:
    """How one source config field is read from config.json (and written back)."""

    name: str
    paths: tuple[str, ...] = ()
    default: Any = MISSING
    null: Any = MISSING
    map: dict[str, Any] | None = None
    computed: Computed | None = None

    def _found(self, config: Mapping) -> tuple[Any, str | None]:
        for path in self.paths:
            found = lookup(config, path)
            if found is not MISSING:
                return (self.null if found is None else found), path
        return self.default, None

    def resolve(self, config: Mapping, arch: str) -> Any:
        """The source value, or `MISSING` to leave the source default."""
        if self.computed is not None:
            try:
                return self.computed.read(config, self.name)
            except (TypeError, ValueError, OverflowError) as err:  # a value of the wrong kind
                raise ConfigError(f"config.json: cannot compute `{self.name}`: {err}") from None
        value, where = self._found(config)
        if value is MISSING or self.map is None:
            return value
        key = _map_key(value)
        if key not in self.map:
            allowed = ", ".join(repr(k) for k in self.map)
            raise ConfigError(
                f"config.json: {where or 'default of ' + self.name} = {value!r} is not "
                f"supported for {arch} (supported: {allowed})"
            )
        return self.map[key]

    def hf_value(self, value: Any, where: str) -> Any:
        """The config.json value that `resolve` reads back as `value`."""
        if self.null is not MISSING and same(value, self.null):
            return None
        if self.map is None:
            return value
        keys = [k for k, v in self.map.items() if same(v, value)]
        if not keys:
            raise ConfigError(f"{self.name} = {value!r} has no config.json value in {where}")
        return keys[0]


@dataclass
class Requirement:
    """An HF config field the source can only express with one value (or a few)."""

    name: str
    paths: tuple[str, ...]
    allowed: tuple[Any, ...]
    why: str = ""

    def check(self, config: Mapping, arch: str) -> None:
        for path in self.paths:
            value = lookup(config, path)
            if value is MISSING:
                continue
            if not any(same(value, a) for a in self.allowed):
                want = " or ".join(repr(a) for a in self.allowed)
                why = f": {self.why}" if self.why else ""
                raise ConfigError(
                    f"config.json: {path} = {value!r} is not supported for {arch} "
                    f"(needs {want}){why}"
                )
            return


def translate(
    fields: Mapping[str, FieldSpec],
    const: Mapping[str, Any],
    require: list[Requirement],
    hf_config: Mapping,
    arch: str,
) -> dict[str, Any]:
    """Source config values from an HF config.json dict (only the fields named; a field with
    no value and no default is left out, so the source default applies)."""
    if not isinstance(hf_config, Mapping):
        raise ConfigError("config.json: not a JSON object")
    for req in require:
        req.check(hf_config, arch)
    out: dict[str, Any] = {}
    for name, spec in fields.items():
        value = spec.resolve(hf_config, arch)
        if value is not MISSING:
            out[name] = value
    out.update(const)
    return out


def origins(fields: Mapping[str, FieldSpec], hf_config: Mapping, file: str) -> dict[str, str]:
    """Where each source field's value was read: {"dim": "config.json: hidden_size"}, for
    errors that name the field a user can fix (computed fields have no one path)."""
    out = {}
    for name, spec in fields.items():
        found = next((p for p in spec.paths if lookup(hf_config, p) is not MISSING), None)
        if found is not None:
            out[name] = f"{file}: {found}"
    return out


def to_hf(
    fields: Mapping[str, FieldSpec],
    const: Mapping[str, Any],
    require: list[Requirement],
    values: Mapping[str, Any],
    where: str,
) -> dict[str, Any]:
    """The inverse of `translate`: config.json keys that read back as `values`. Computed
    fields are written last: their inverses may use the plain fields (DINOv2's ratio)."""
    out: dict[str, Any] = {}
    for req in require:
        set_path(out, req.paths[0], req.allowed[0])
    computed = []
    for name, spec in fields.items():
        if name in const:
            continue
        if name not in values:
            if spec.map is not None and spec.default is not MISSING and spec.paths:
                set_path(out, spec.paths[0], spec.default)  # e.g. rope_type "default"
        elif spec.computed is not None:
            computed.append((spec.computed, values[name]))
        elif values[name] is not None and spec.paths:
            set_path(out, spec.paths[0], spec.hf_value(values[name], where))
    for rule, value in computed:
        rule.write(out, value)
    return out
