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
from linnet.weights.maps.rules import bindings, compile_pattern, fill
from linnet.weights.maps.transforms import rope_permute, rope_unpermute

GGUF_TYPES = ("u32", "i32", "f32", "bool", "str")


@dataclass(frozen=True)
class GgufTransform:
    """A source -> GGUF tensor transform: `rope_permute` with the head count taken from a
    source config field, or `transpose` (the last two axes: GPT-OSS's experts are x @ w in
    the source, [out, in] per expert in llama.cpp)."""

    kind: str
    field: str = ""

    def apply(self, x, config: Mapping):
        if self.kind == "transpose":
            return x.swapaxes(-1, -2)
        return rope_permute(x, int(config[self.field]))

    def invert(self, x, config: Mapping):
        if self.kind == "transpose":
            return x.swapaxes(-1, -2)
        return rope_unpermute(x, int(config[self.field]))

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The GGUF shape of a source tensor of `shape`."""
        if self.kind == "transpose":
            return (*shape[:-2], shape[-1], shape[-2])
        return tuple(shape)


@dataclass(frozen=True)
class GgufFused:
    """A GGUF tensor the source holds whole and llama.cpp as `parts` (name patterns), each
    every len(parts)-th slice along `axis`, starting at its index (transformers interleaves
    GPT-OSS's gate and up: gate = [..., 0::2], up = [..., 1::2])."""

    parts: tuple[str, ...]
    axis: int

    def names(self, values: Mapping[str, str]) -> list[str]:
        return [fill(p, values) for p in self.parts]

    def part_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        n, ax = len(self.parts), self.axis
        if shape[ax] % n:
            raise ValueError(f"axis {ax} of {list(shape)} does not split into {n} parts")
        return tuple(d // n if k == ax else d for k, d in enumerate(shape))

    def take(self, x, k: int):
        """Part `k` of the whole tensor `x`."""
        index = (slice(None),) * self.axis + (slice(k, None, len(self.parts)),)
        return x[index]

    def join(self, parts: list):
        """The whole tensor from its parts (numpy)."""
        import numpy as np

        return np.stack(parts, axis=self.axis + 1).reshape(self.whole_shape(tuple(parts[0].shape)))

    def whole_shape(self, part: tuple[int, ...]) -> tuple[int, ...]:
        n = len(self.parts)
        return tuple(d * n if k == self.axis else d for k, d in enumerate(part))


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
    fused: dict[str, GgufFused] = field(default_factory=dict)
    _transform_regexes: list = field(init=False, repr=False)
    _fused_regexes: list = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._transform_regexes = [(compile_pattern(k)[0], v) for k, v in self.transforms.items()]
        self._fused_regexes = [(compile_pattern(k)[0], v) for k, v in self.fused.items()]

    def key(self, pattern: str) -> str:
        return pattern.replace("{arch}", self.arch)

    def transforms_for(self, name: str) -> tuple[GgufTransform, ...]:
        for regex, ts in self._transform_regexes:
            if regex.fullmatch(name):
                return ts
        return ()

    def shape_for(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The GGUF shape of tensor `name` whose params, joined, have `shape`."""
        for t in self.transforms_for(name):
            shape = t.shape(shape)
        return tuple(shape)

    def fused_for(self, name: str) -> tuple[GgufFused, list[str]] | None:
        """(how, the part names) when `name` is written as several llama.cpp tensors."""
        for regex, how in self._fused_regexes:
            values = bindings(regex.fullmatch(name))
            if values is not None:
                return how, how.names(values)
        return None

    def fuse_names(self, names) -> dict[str, list[str]]:
        """{whole name: its part names} for each fused tensor whose parts are all in
        `names` (a GGUF file's tensors)."""
        out = {}
        for pattern, how in self.fused.items():
            first = compile_pattern(how.parts[0])[0]
            for name in names:
                values = bindings(first.fullmatch(name))
                if values is None:
                    continue
                parts = how.names(values)
                if all(p in names for p in parts):
                    out[fill(pattern, values)] = parts
        return out


def _fail(path: Path, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {msg}")


def _parse_transforms(path: Path, table: Mapping) -> dict[str, tuple[GgufTransform, ...]]:
    out = {}
    for name, ts in table.items():
        parsed = []
        for t in ts if isinstance(ts, list) else [ts]:
            if t == "transpose":
                parsed.append(GgufTransform("transpose"))
                continue
            if not (isinstance(t, dict) and set(t) == {"rope_permute"}):
                raise _fail(
                    path, f'gguf.transforms.{name}: expected {{ rope_permute = F }} or "transpose"'
                )
            parsed.append(GgufTransform("rope_permute", str(t["rope_permute"])))
        out[name] = tuple(parsed)
    return out


def _fused_parser(path: Path) -> Callable[[str, Any], GgufFused]:
    def parse(k: str, v: Any) -> GgufFused:
        parts = v.get("interleave") if isinstance(v, dict) else None
        if (
            set(v if isinstance(v, dict) else ()) != {"interleave", "axis"}
            or not isinstance(parts, list)
            or len(parts) < 2
            or not all(isinstance(p, str) for p in parts)
            or not isinstance(v["axis"], int)
            or v["axis"] < 0
        ):
            raise _fail(path, f'gguf.fused.{k}: expected {{ interleave = ["...", ...], axis = N }}')
        return GgufFused(tuple(parts), v["axis"])

    return parse


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
    unknown = set(spec) - {"arch", "transforms", "metadata", "flags", "extra", "fused"}
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
        fused=_merged(base, spec, "fused", _fused_parser(path)),
    )
