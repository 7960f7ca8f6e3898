"""A weights map's `[gguf]` table: llama.cpp's architecture, metadata keys and layout changes.

    spec = parse_gguf(path, {"arch": "llama", "metadata": {"{arch}.block_count": "n_layers"}}, None)
    spec.key("{arch}.block_count")          # "llama.block_count"
    spec.metadata["{arch}.block_count"]     # GgufKey(field="n_layers", type="u32")

Format and inheritance rules: docs/weights-maps.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linnet.errors import ConfigError
from linnet.weights.maps.config import MISSING
from linnet.weights.maps.rules import compile_pattern
from linnet.weights.maps.transforms import rope_permute, rope_unpermute

GGUF_TYPES = ("u32", "i32", "f32", "bool", "str")


@dataclass(frozen=True)
class GgufTransform:
    """A source -> GGUF tensor transform: `rope_permute` with the head count taken from a
    source config field."""

    kind: str
    field: str

    def apply(self, x, config: Mapping):
        return rope_permute(x, int(config[self.field]))

    def invert(self, x, config: Mapping):
        return rope_unpermute(x, int(config[self.field]))


@dataclass(frozen=True)
class GgufKey:
    """One metadata key: the source config field it holds, its GGUF type, and a value
    (`omit`) that is not written (None never is)."""

    field: str
    type: str = "u32"
    omit: Any = MISSING


@dataclass(frozen=True)
class GgufFlag:
    """A bool config field that GGUF import reads from whether `tensor` is present."""

    tensor: str
    present: bool  # the field is true when the tensor is present (else: when it is absent)


@dataclass
class GgufSpec:
    arch: str
    transforms: dict[str, tuple[GgufTransform, ...]] = field(default_factory=dict)
    metadata: dict[str, GgufKey] = field(default_factory=dict)
    flags: dict[str, GgufFlag] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)
    _transform_regexes: list = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._transform_regexes = [(compile_pattern(k)[0], v) for k, v in self.transforms.items()]

    def key(self, pattern: str) -> str:
        return pattern.replace("{arch}", self.arch)

    def transforms_for(self, name: str) -> tuple[GgufTransform, ...]:
        for regex, ts in self._transform_regexes:
            if regex.fullmatch(name):
                return ts
        return ()


def _fail(path: Path, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {msg}")


def _parse_transforms(path: Path, table: Mapping) -> dict[str, tuple[GgufTransform, ...]]:
    out = {}
    for name, ts in table.items():
        parsed = []
        for t in ts if isinstance(ts, list) else [ts]:
            if not (isinstance(t, dict) and set(t) == {"rope_permute"}):
                raise _fail(path, f"gguf.transforms.{name}: expected {{ rope_permute = F }}")
            parsed.append(GgufTransform("rope_permute", str(t["rope_permute"])))
        out[name] = tuple(parsed)
    return out


def _key_parser(path: Path) -> Callable[[str, Any], GgufKey]:
    def parse(k: str, v: Any) -> GgufKey:
        if isinstance(v, str):
            return GgufKey(v)
        if isinstance(v, dict) and isinstance(v.get("field"), str):
            if set(v) - {"field", "type", "omit"} or v.get("type", "u32") not in GGUF_TYPES:
                raise _fail(path, f"gguf.metadata.{k}: {{ field, type ({GGUF_TYPES}), omit }}")
            return GgufKey(v["field"], v.get("type", "u32"), v.get("omit", MISSING))
        raise _fail(path, f'gguf.metadata.{k}: expected "field" or {{ field = ... }}')

    return parse


def _flag_parser(path: Path) -> Callable[[str, Any], GgufFlag]:
    def parse(k: str, v: Any) -> GgufFlag:
        if isinstance(v, dict) and len(v) == 1 and set(v) <= {"present", "absent"}:
            ((how, tensor),) = v.items()
            return GgufFlag(str(tensor), how == "present")
        raise _fail(path, f'gguf.flags.{k}: expected {{ present = "..." }} or {{ absent = "..." }}')

    return parse


def _extra_parser(path: Path) -> Callable[[str, Any], str]:
    def parse(k: str, v: Any) -> str:
        if not isinstance(v, str):
            raise _fail(path, f"gguf.extra.{k}: expected the name of a rule")
        return v

    return parse


def _merged(base: GgufSpec | None, spec: Mapping, table: str, parse) -> dict:
    """The base's table with the child's keys merged in (`false` removes a base key)."""
    out = dict(getattr(base, table)) if base else {}
    for k, v in spec.get(table, {}).items():
        if v is False:
            out.pop(k, None)
        else:
            out[k] = parse(k, v)
    return out


def parse_gguf(path: Path, spec: Any, base: GgufSpec | None) -> GgufSpec | None:
    """The `[gguf]` table of the map at `path`, merged into its base's."""
    if spec is None:
        return base
    if not isinstance(spec, dict):
        raise _fail(path, "[gguf] must be a table")
    unknown = set(spec) - {"arch", "transforms", "metadata", "flags", "extra"}
    if unknown:
        raise _fail(path, f"[gguf]: unknown keys {sorted(unknown)}")
    arch = spec.get("arch", base.arch if base else None)
    if not isinstance(arch, str):
        raise _fail(path, '[gguf]: missing arch = "..."')
    transforms = dict(base.transforms) if base else {}
    if "transforms" in spec:  # replaces the base's as a whole
        transforms = _parse_transforms(path, spec["transforms"])
    return GgufSpec(
        arch=arch,
        transforms=transforms,
        metadata=_merged(base, spec, "metadata", _key_parser(path)),
        flags=_merged(base, spec, "flags", _flag_parser(path)),
        extra=_merged(base, spec, "extra", _extra_parser(path)),
    )
