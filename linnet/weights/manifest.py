"""Weights maps: one declarative TOML manifest per Hugging Face architecture.

A manifest says which `.linnet` source an architecture runs on, how HF
`config.json` fields become source config fields, and how each HF tensor becomes
source params (and back: every transform has an inverse, so the exporters use
the same manifest). The format:

```toml
architecture = "LlamaForCausalLM"     # config.json `architectures[0]`
source = "llama"                      # zoo/llama.linnet
base = "llama.toml"                   # optional: inherit, then override (see below)
base_prefix = "bert."                 # optional: the base's tensor names (and ignore
                                      #   patterns) under this prefix, for a task model
                                      #   that holds the base model (BertForMaskedLM);
                                      #   hf_prefix defaults to it
hf_prefix = "transformer."            # optional: HF base_model_prefix; tensors saved
                                      #   without it (from the bare base model) also match
ignore = ["model.layers.{i}.self_attn.rotary_emb.inv_freq"]   # may be present, unused

[buffers]  # non-float tensors: ignored on load, written back by an HF export (a scalar
           #   `value` beside every tensor whose name ends with `beside`)
".num_batches_tracked" = { beside = ".running_mean", dtype = "i64", value = 0 }

[config]   # source field -> where to find it in config.json (all values are HF-side)
vocab = ["vocab_size", 32000]         # paths tried in order; a final non-string is the
                                      #   default when no path is present
rope_theta = ["rope_parameters.rope_theta", "rope_theta", 10000.0]   # dotted: nested dicts
window = { from = ["sliding_window"], null = 0, default = 4096 }     # the long form
rope_scaling = { from = ["rope_parameters.rope_type"], default = "default",
                 map = { default = "default", llama3 = "llama3" } }  # others: ConfigError
window = { compute = "layer_types_window" }    # a named rule written in Python

[config.const]     # fixed values for this architecture
qkv_bias = true

[config.require]   # HF fields the source cannot express other than with this value
hidden_act = { equals = "silu" }
partial_rotary_factor = { from = ["rope_parameters.partial_rotary_factor"], equals = 1.0 }

[[tensors]]
hf = "model.layers.{i}.self_attn.q_proj.weight"
param = "layers.{i}.wq"
[[tensors]]        # fused: split along an axis, sizes taken from the params' shapes
hf = "model.layers.{i}.self_attn.qkv_proj.weight"
split = { axis = 0, params = ["layers.{i}.wq", "layers.{i}.wk", "layers.{i}.wv"] }
[[tensors]]        # transforms run first (HF -> source), then the split
hf = "transformer.h.{i}.attn.c_attn.weight"
transforms = ["transpose"]
split = { axis = 0, params = ["layers.{i}.wq", "layers.{i}.wk", "layers.{i}.wv"] }
```

Config semantics: a path whose value is JSON `null` means "the HF derived
default" and the field is omitted (the source's own default or derivation
applies) unless the spec gives `null = value`. A field with no value found and
no default is omitted too. `map` applies to every value, the default included;
a value outside the map is a `ConfigError`.

Placeholders `{i}` (any `{name}`) stand for non-negative integers (layer
indices); the params of a rule use the placeholders of its `hf` pattern. In an `hf`
pattern, `{i+1}` stands for i + 1: `encoder.stages.{s}.layers.{i+1}.x` -> `stages.{s}.rest.{i}.x`
(a ResNet stage's layers after its first).

Inheritance (`base`): the child takes the base's config fields, consts,
requirements, ignore list, prefix and tensor rules, then overrides: a config
name the child sets (as a field or a const) replaces the base's entry of that
name; a child tensor rule replaces every base rule that targets any of its params.

GGUF (read by `linnet.converters.gguf_*`): a rule may name its GGUF tensor, and a
`[gguf]` table gives llama.cpp's architecture, metadata keys and layout changes:

```toml
model_type = "llama"                  # config.json `model_type` (not inherited)

[[tensors]]
hf = "model.layers.{i}.self_attn.q_proj.weight"
param = "layers.{i}.wq"
gguf = "blk.{i}.attn_q.weight"        # the rule's params, concatenated along the split
                                      #   axis in the source's layout (torch's [out, in],
                                      #   which llama.cpp uses too), then [gguf.transforms]

[gguf]
arch = "llama"                        # general.architecture
[gguf.transforms]                     # GGUF tensor pattern -> transforms (source -> GGUF)
"blk.{i}.attn_q.weight" = [{ rope_permute = "n_heads" }]   # heads: a source config field
[gguf.metadata]                       # key ({arch} = gguf.arch) -> source config field
"{arch}.block_count" = "n_layers"                          # u32 unless `type` says otherwise
"{arch}.rope.freq_base" = { field = "rope_theta", type = "f32" }
"{arch}.attention.sliding_window" = { field = "window", type = "u32", omit = 0 }
[gguf.flags]                          # bool config fields read from tensor presence on import
tied = { absent = "output.weight" }
[gguf.extra]                          # GGUF tensors computed from the config: a named rule
"rope_freqs.weight" = "llama3_rope_freqs"
```

A child's `[gguf]` table merges into its base's: `arch` and `transforms` (as a whole)
replace the base's; `metadata`, `flags` and `extra` merge key by key (a child value of
`false` removes the base's key). `rope_permute` is llama.cpp's Q/K permutation: its
"normal" rope rotates interleaved pairs while HF rotates halves; its inverse undoes it.
`Manifest.config_to_hf` inverts the config translation (source values -> config.json).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from linnet.errors import CheckpointError, ConfigError, UnsupportedArchitecture

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def maps_dir() -> Path:
    """The folder of weights-map manifests (`linnet.weights_maps`, or the repo's weights_maps/)."""
    try:
        import linnet.weights_maps as wm

        return Path(wm.HERE)
    except ImportError:
        return Path(__file__).resolve().parents[2] / "weights_maps"


# ----------------------------------------------------------------------------------------
# Tensor transforms (HF -> source; each has an inverse)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _concat(parts: list, axis: int):
    if _is_torch(parts[0]):
        import torch

        return torch.cat(parts, dim=axis)
    import numpy as np

    return np.concatenate(parts, axis=axis)


def _contiguous(x: Any):
    if _is_torch(x):
        return x.contiguous()
    import numpy as np

    return np.ascontiguousarray(x)


@dataclass(frozen=True)
class Transform:
    """One invertible per-tensor transform: `permute` (`transpose` is the 2-D case)."""

    kind: str
    axes: tuple[int, ...]

    @property
    def text(self) -> str:
        if self.kind == "transpose":
            return "transpose"
        return f"permute{list(self.axes)}"

    def _inverse_axes(self) -> tuple[int, ...]:
        inv = [0] * len(self.axes)
        for i, a in enumerate(self.axes):
            inv[a] = i
        return tuple(inv)

    def _check_rank(self, rank: int) -> None:
        if rank != len(self.axes):
            raise ValueError(f"{self.text} needs a rank-{len(self.axes)} tensor, got rank {rank}")

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape after the transform (HF -> source)."""
        self._check_rank(len(shape))
        return tuple(shape[a] for a in self.axes)

    def inverse_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        self._check_rank(len(shape))
        return tuple(shape[a] for a in self._inverse_axes())

    def apply(self, x):
        self._check_rank(x.ndim)
        return x.permute(*self.axes) if _is_torch(x) else x.transpose(self.axes)

    def invert(self, x):
        axes = self._inverse_axes()
        self._check_rank(x.ndim)
        return x.permute(*axes) if _is_torch(x) else x.transpose(axes)


def _parse_transform(spec: Any, where: str) -> Transform:
    if spec == "transpose":
        return Transform("transpose", (1, 0))
    if isinstance(spec, dict) and set(spec) == {"permute"}:
        axes = spec["permute"]
        if (
            isinstance(axes, list)
            and all(isinstance(a, int) for a in axes)
            and sorted(axes) == list(range(len(axes)))
        ):
            return Transform("permute", tuple(axes))
    raise ConfigError(
        f'{where}: unknown transform {spec!r} (known: "transpose", {{ permute = [...] }})'
    )


# ----------------------------------------------------------------------------------------
# Tensor rules

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\+([0-9]+))?\}")


def _compile(pattern: str) -> tuple[re.Pattern, tuple[str, ...]]:
    """A name pattern with `{i}` placeholders -> (full-match regex, placeholder names).
    `{i+1}` stands for the number i + 1 (its group is named `i__1`: see `_bindings`)."""
    out, names, pos = [], [], 0
    for m in _PLACEHOLDER.finditer(pattern):
        out.append(re.escape(pattern[pos : m.start()]))
        name, offset = m.group(1), m.group(2)
        group = f"{name}__{offset}" if offset else name
        out.append(f"(?P={group})" if name in names else rf"(?P<{group}>0|[1-9][0-9]*)")
        if name not in names:
            names.append(name)
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return re.compile("".join(out)), tuple(names)


def _bindings(m: re.Match | None) -> dict[str, str] | None:
    """Placeholder values of a match, offsets removed (`{i+1}` matching 3 binds i = 2);
    None when there is no match or a number is below its offset."""
    if m is None:
        return None
    out = {}
    for group, value in m.groupdict().items():
        name, _, offset = group.partition("__")
        n = int(value) - int(offset or 0)
        if n < 0:
            return None
        out[name] = str(n)
    return out


def _fill(pattern: str, bindings: Mapping[str, str]) -> str:
    return _PLACEHOLDER.sub(
        lambda m: str(int(bindings[m.group(1)]) + int(m.group(2) or 0)), pattern
    )


@dataclass
class Rule:
    """One HF tensor pattern -> one param, or several (split along `split_axis`)."""

    hf: str
    params: tuple[str, ...]
    transforms: tuple[Transform, ...] = ()
    split_axis: int | None = None
    gguf: str | None = None  # the GGUF tensor name pattern (see the module docstring)
    hf_regex: re.Pattern = field(init=False, repr=False)
    param_regexes: tuple[re.Pattern, ...] = field(init=False, repr=False)
    placeholders: tuple[str, ...] = field(init=False, repr=False)
    gguf_regex: re.Pattern | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.hf_regex, self.placeholders = _compile(self.hf)
        self.param_regexes = tuple(_compile(p)[0] for p in self.params)
        self.gguf_regex = _compile(self.gguf)[0] if self.gguf else None

    @property
    def text(self) -> str:
        """The transform chain, e.g. "transpose → split[0]" ("" for a plain copy)."""
        steps = [t.text for t in self.transforms]
        if self.split_axis is not None:
            steps.append(f"split[{self.split_axis}]")
        return " → ".join(steps)

    def hf_name(self, bindings: Mapping[str, str]) -> str:
        return _fill(self.hf, bindings)

    def targets(self, bindings: Mapping[str, str]) -> tuple[str, ...]:
        return tuple(_fill(p, bindings) for p in self.params)

    # shapes ------------------------------------------------------------------------

    def hf_shape(self, param_shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        """The HF tensor shape that gives these param shapes (raises ValueError if none can)."""
        if self.split_axis is None:
            (shape,) = param_shapes
        else:
            ax = self.split_axis
            first = param_shapes[0]
            for s in param_shapes:
                if (
                    len(s) != len(first)
                    or ax >= len(s)
                    or any(a != b for k, (a, b) in enumerate(zip(s, first, strict=True)) if k != ax)
                ):
                    raise ValueError(
                        f"params of shapes {', '.join(map(str, map(list, param_shapes)))} "
                        f"cannot be concatenated along axis {ax}"
                    )
            shape = tuple(
                sum(s[ax] for s in param_shapes) if k == ax else d for k, d in enumerate(first)
            )
        for t in reversed(self.transforms):
            shape = t.inverse_shape(shape)
        return tuple(shape)

    # tensors -----------------------------------------------------------------------

    def forward(self, x, sizes: list[int] | None = None) -> list:
        """HF tensor -> param tensors (views where possible). `sizes`: split sizes; by
        default equal parts."""
        for t in self.transforms:
            x = t.apply(x)
        return self.split(x, sizes)

    def inverse(self, parts: list):
        """Param tensors -> the HF tensor (contiguous)."""
        x = self.joined(parts)
        for t in reversed(self.transforms):
            x = t.invert(x)
        return _contiguous(x)

    def joined(self, parts: list):
        """Param tensors concatenated along the split axis, in the source's layout (the
        GGUF tensor before [gguf.transforms])."""
        return parts[0] if self.split_axis is None else _concat(list(parts), self.split_axis)

    def gguf_name(self, bindings: Mapping[str, str]) -> str | None:
        return _fill(self.gguf, bindings) if self.gguf else None

    def split(self, x, sizes: list[int] | None = None) -> list:
        """The inverse of `joined`: split along the split axis (equal parts by default)."""
        if self.split_axis is None:
            return [x]
        ax, n = self.split_axis, len(self.params)
        if sizes is None:
            if x.shape[ax] % n:
                raise ValueError(f"cannot split axis {ax} of size {x.shape[ax]} into {n} parts")
            sizes = [x.shape[ax] // n] * n
        if sum(sizes) != x.shape[ax]:
            raise ValueError(f"split sizes {sizes} do not add up to {x.shape[ax]}")
        out, start = [], 0
        for s in sizes:
            out.append(x[(slice(None),) * ax + (slice(start, start + s),)])
            start += s
        return out


# ----------------------------------------------------------------------------------------
# Config translation

_MISSING = object()


def _lookup(config: Mapping, path: str) -> Any:
    """Value at a dotted path, `_MISSING` if any step is absent (or not a dict)."""
    node: Any = config
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


def _map_key(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def layer_types_window(config: Mapping, field_name: str) -> Any:
    """Qwen2/Qwen3: one sliding window for all layers, or none.

    transformers applies `sliding_window` only to layers whose `layer_types` entry
    is "sliding_attention"; without `layer_types` those are the layers from
    `max_window_layers` on, and only when `use_sliding_window` is true. The Llama
    source has one window for every layer, so a mix is a ConfigError.
    """
    n_layers = config.get("num_hidden_layers", 32)
    window = config.get("sliding_window", 4096)
    types = config.get("layer_types")
    if types is None:
        if not config.get("use_sliding_window", False) or window is None:
            return 0
        first = config.get("max_window_layers", 28)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    kinds = set(types)
    if kinds <= {"full_attention"}:
        return 0
    if kinds == {"sliding_attention"} and window:
        return int(window)
    raise ConfigError(
        f"config.json: layer_types mixes {sorted(kinds)} (sliding_window={window}); the source "
        f"has one attention window ({field_name}) for every layer"
    )


def num_labels(config: Mapping, field_name: str) -> Any:
    """Classifier outputs: transformers derives `num_labels` from `id2label`."""
    labels = config.get("id2label")
    return len(labels) if labels else int(config.get("num_labels", 2))


def mlp_ratio_ffn(config: Mapping, field_name: str) -> Any:
    """DINOv2: the MLP width is int(hidden_size * mlp_ratio)."""
    return int(config.get("hidden_size", 768) * config.get("mlp_ratio", 4))


def global_every(config: Mapping, field_name: str) -> Any:
    """ModernBERT: global attention on layers i % n == 0, local on the others.

    Hub configs give `global_attn_every_n_layers`; transformers 5 saves `layer_types` too
    (and its models follow `layer_types`). The source expresses the every-n pattern only,
    so a `layer_types` that no n produces is a ConfigError.
    """
    every = int(config.get("global_attn_every_n_layers", 3))
    types = config.get("layer_types")
    if types is None:
        return every
    n_layers = len(types)
    for n in [every, *range(1, n_layers + 1)]:  # the stated n first, else the n that fits
        pattern = ["sliding_attention" if i % n else "full_attention" for i in range(n_layers)]
        if list(types) == pattern:
            return n
    raise ConfigError(
        f"config.json: layer_types {list(types)} is not global attention every n layers; "
        f"the source's {field_name} expresses only that pattern"
    )


def resnet_widths(config: Mapping, field_name: str) -> Any:
    """ResNet: the stem's width (`embedding_size`), then each stage's (`hidden_sizes`)."""
    sizes = config.get("hidden_sizes", [256, 512, 1024, 2048])
    return [int(config.get("embedding_size", 64)), *map(int, sizes)]


COMPUTED: dict[str, Callable[[Mapping, str], Any]] = {
    "resnet_widths": resnet_widths,
    "layer_types_window": layer_types_window,
    "global_every": global_every,
    "num_labels": num_labels,
    "mlp_ratio_ffn": mlp_ratio_ffn,
}


@dataclass
class FieldSpec:
    """How one source config field is read from config.json."""

    name: str
    paths: tuple[str, ...] = ()
    default: Any = _MISSING
    null: Any = _MISSING
    map: dict[str, Any] | None = None
    compute: str | None = None

    def resolve(self, config: Mapping, arch: str) -> Any:
        """The source value, or `_MISSING` to leave the source default."""
        if self.compute is not None:
            return COMPUTED[self.compute](config, self.name)
        value, where = _MISSING, None
        for path in self.paths:
            found = _lookup(config, path)
            if found is _MISSING:
                continue
            where = path
            value = self.null if found is None else found
            break
        if where is None:
            value = self.default
        if value is _MISSING:
            return _MISSING
        if self.map is not None:
            key = _map_key(value)
            if key not in self.map:
                allowed = ", ".join(repr(k) for k in self.map)
                raise ConfigError(
                    f"config.json: {where or 'default of ' + self.name} = {value!r} is not "
                    f"supported for {arch} (supported: {allowed})"
                )
            value = self.map[key]
        return value


def _same(value: Any, want: Any) -> bool:
    """JSON equality that keeps booleans apart from numbers (true != 1)."""
    if isinstance(value, bool) or isinstance(want, bool):
        return value is want
    return value == want


@dataclass
class Requirement:
    """An HF config field the source can only express with one value (or a few)."""

    name: str
    paths: tuple[str, ...]
    allowed: tuple[Any, ...]
    why: str = ""

    def check(self, config: Mapping, arch: str) -> None:
        for path in self.paths:
            value = _lookup(config, path)
            if value is _MISSING:
                continue
            if not any(_same(value, a) for a in self.allowed):
                want = " or ".join(repr(a) for a in self.allowed)
                why = f": {self.why}" if self.why else ""
                raise ConfigError(
                    f"config.json: {path} = {value!r} is not supported for {arch} "
                    f"(needs {want}){why}"
                )
            return


# ----------------------------------------------------------------------------------------
# GGUF: llama.cpp's names, metadata keys and layout changes


def rope_permute(x, n_head: int):
    """llama.cpp's Q/K row permutation (`LlamaModel.permute` in convert_hf_to_gguf.py):
    within each head, rows [first half; second half] become interleaved pairs, so that
    llama.cpp's "normal" rope (pairs 2j, 2j+1) equals HF's half rotation (j, j + d/2).
    x: [n_head * head_dim, ...] (a weight or a bias)."""
    rows = x.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"rope_permute: {rows} rows do not split into {n_head} heads of pairs")
    rest = tuple(x.shape[1:])
    y = x.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2)
    return _contiguous(y.reshape(rows, *rest))


def rope_unpermute(x, n_head: int):
    """The inverse of `rope_permute`."""
    rows = x.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"rope_permute: {rows} rows do not split into {n_head} heads of pairs")
    rest = tuple(x.shape[1:])
    y = x.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2)
    return _contiguous(y.reshape(rows, *rest))


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


GGUF_TYPES = ("u32", "i32", "f32", "bool", "str")


@dataclass(frozen=True)
class GgufKey:
    """One metadata key: the source config field it holds, its GGUF type, and a value
    (`omit`) that is not written (None never is)."""

    field: str
    type: str = "u32"
    omit: Any = _MISSING


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
        self._transform_regexes = [(_compile(k)[0], v) for k, v in self.transforms.items()]

    def key(self, pattern: str) -> str:
        return pattern.replace("{arch}", self.arch)

    def transforms_for(self, name: str) -> tuple[GgufTransform, ...]:
        for regex, ts in self._transform_regexes:
            if regex.fullmatch(name):
                return ts
        return ()


def _parse_gguf(path: Path, spec: Any, base: GgufSpec | None) -> GgufSpec | None:
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
    if "transforms" in spec:
        transforms = {}
        for name, ts in spec["transforms"].items():
            parsed = []
            for t in ts if isinstance(ts, list) else [ts]:
                if not (isinstance(t, dict) and set(t) == {"rope_permute"}):
                    raise _fail(path, f"gguf.transforms.{name}: expected {{ rope_permute = F }}")
                parsed.append(GgufTransform("rope_permute", str(t["rope_permute"])))
            transforms[name] = tuple(parsed)

    def merged(table: str, parse) -> dict:
        out = dict(getattr(base, table)) if base else {}
        for k, v in spec.get(table, {}).items():
            if v is False:
                out.pop(k, None)
            else:
                out[k] = parse(k, v)
        return out

    def parse_key(k: str, v: Any) -> GgufKey:
        if isinstance(v, str):
            return GgufKey(v)
        if isinstance(v, dict) and isinstance(v.get("field"), str):
            if set(v) - {"field", "type", "omit"} or v.get("type", "u32") not in GGUF_TYPES:
                raise _fail(path, f"gguf.metadata.{k}: {{ field, type ({GGUF_TYPES}), omit }}")
            return GgufKey(v["field"], v.get("type", "u32"), v.get("omit", _MISSING))
        raise _fail(path, f'gguf.metadata.{k}: expected "field" or {{ field = ... }}')

    def parse_flag(k: str, v: Any) -> GgufFlag:
        if isinstance(v, dict) and len(v) == 1 and set(v) <= {"present", "absent"}:
            ((how, tensor),) = v.items()
            return GgufFlag(str(tensor), how == "present")
        raise _fail(path, f'gguf.flags.{k}: expected {{ present = "..." }} or {{ absent = "..." }}')

    def parse_extra(k: str, v: Any) -> str:
        if not isinstance(v, str):
            raise _fail(path, f"gguf.extra.{k}: expected the name of a rule")
        return v

    return GgufSpec(
        arch=arch,
        transforms=transforms,
        metadata=merged("metadata", parse_key),
        flags=merged("flags", parse_flag),
        extra=merged("extra", parse_extra),
    )


def _set_path(config: dict, path: str, value: Any) -> None:
    keys = path.split(".")
    node = config
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def layer_types_window_to_hf(config: dict, value: Any) -> None:
    """The inverse of `layer_types_window`: one window for every layer, or none."""
    config["use_sliding_window"] = bool(value)
    config["sliding_window"] = int(value) if value else None
    config["max_window_layers"] = 0


def global_every_to_hf(config: dict, value: Any) -> None:
    """The inverse of `global_every` (transformers derives layer_types from it)."""
    config["global_attn_every_n_layers"] = int(value)


def resnet_widths_to_hf(config: dict, value: Any) -> None:
    config["embedding_size"], config["hidden_sizes"] = value[0], list(value[1:])


COMPUTED_TO_HF: dict[str, Callable[[dict, Any], None]] = {
    "resnet_widths": resnet_widths_to_hf,
    "layer_types_window": layer_types_window_to_hf,
    "global_every": global_every_to_hf,
}


@dataclass(frozen=True)
class Buffer:
    """A non-float HF tensor the source has no param for (BatchNorm's int64
    `num_batches_tracked`): ignored on load; an HF export writes it back, a scalar of
    `dtype` and `value`, beside every tensor whose name ends with `beside`."""

    suffix: str  # ".num_batches_tracked"
    beside: str  # ".running_mean"
    dtype: str  # "i64"
    value: int


BUFFER_DTYPES = ("i64",)


def _parse_buffers(path: Path, spec: Any) -> dict[str, Buffer]:
    if not isinstance(spec, dict):
        raise _fail(path, "[buffers] must be a table")
    out = {}
    for suffix, v in spec.items():
        if not (
            isinstance(v, dict)
            and set(v) == {"beside", "dtype", "value"}
            and isinstance(v["beside"], str)
            and v["dtype"] in BUFFER_DTYPES
            and isinstance(v["value"], int)
        ):
            raise _fail(path, f'buffers."{suffix}": {{ beside = "...", dtype = "i64", value = N }}')
        out[suffix] = Buffer(suffix, v["beside"], v["dtype"], v["value"])
    return out


# ----------------------------------------------------------------------------------------
# The manifest


@dataclass
class Manifest:
    architecture: str
    source: str
    path: Path
    rules: list[Rule]
    ignore: list[str]
    fields: dict[str, FieldSpec]
    const: dict[str, Any]
    require: list[Requirement]
    hf_prefix: str = ""
    model_type: str = ""
    gguf: GgufSpec | None = None
    buffers: dict[str, Buffer] = field(default_factory=dict)
    _ignore_regexes: list[re.Pattern] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._ignore_regexes = [_compile(p)[0] for p in self.ignore]

    def __repr__(self) -> str:
        return f"Manifest({self.architecture!r} -> {self.source!r}, {self.path.name})"

    # matching ------------------------------------------------------------------------

    def _candidates(self, name: str) -> list[str]:
        """`name`, and the prefixed name if the tensor was saved from the bare base model."""
        if self.hf_prefix and not name.startswith(self.hf_prefix):
            return [name, self.hf_prefix + name]
        return [name]

    def match(self, name: str, params=None) -> tuple[Rule, dict[str, str]] | None:
        """The rule (and placeholder bindings) for HF tensor `name`, or None. Given the
        source's `params` (names), a rule whose targets they all hold comes first: one HF
        name may feed different params per config (ResNet's `layer.0` is a basic layer's
        first 3x3 conv, or a bottleneck's 1x1 reduce)."""
        found = []
        for candidate in self._candidates(name):
            for rule in self.rules:
                bindings = _bindings(rule.hf_regex.fullmatch(candidate))
                if bindings is not None:
                    if params is None or all(t in params for t in rule.targets(bindings)):
                        return rule, bindings
                    found.append((rule, bindings))
        return found[0] if found else None

    def is_ignored(self, name: str) -> bool:
        if any(name.endswith(suffix) for suffix in self.buffers):
            return True
        return any(r.fullmatch(c) for c in self._candidates(name) for r in self._ignore_regexes)

    def buffers_beside(self, hf_name: str) -> list[tuple[str, Buffer]]:
        """(name, buffer) for each buffer an HF export writes beside tensor `hf_name`."""
        return [
            (hf_name[: -len(b.beside)] + b.suffix, b)
            for b in self.buffers.values()
            if hf_name.endswith(b.beside)
        ]

    def rule_for_param(self, param: str) -> tuple[Rule, dict[str, str]] | None:
        """The rule (and bindings) whose targets include `param`, or None."""
        for rule in self.rules:
            for regex in rule.param_regexes:
                m = regex.fullmatch(param)
                if m:
                    return rule, m.groupdict()
        return None

    # config --------------------------------------------------------------------------

    def translate_config(self, hf_config: Mapping) -> dict[str, Any]:
        """Source config values from an HF config.json dict (only fields the manifest names;
        a field with no value and no default is left out, so the source default applies)."""
        if not isinstance(hf_config, Mapping):
            raise ConfigError("config.json: not a JSON object")
        for req in self.require:
            req.check(hf_config, self.architecture)
        out: dict[str, Any] = {}
        for name, spec in self.fields.items():
            value = spec.resolve(hf_config, self.architecture)
            if value is not _MISSING:
                out[name] = value
        out.update(self.const)
        return out

    # tensors -------------------------------------------------------------------------

    def from_hf(
        self,
        tensors: Mapping[str, Any],
        param_shapes: Mapping[str, tuple[int, ...]] | None = None,
    ) -> dict[str, Any]:
        """HF-named tensors -> source params (ignorable tensors are dropped).

        A split takes its part sizes from `param_shapes` (param -> shape); without
        them it splits into equal parts, which is wrong for fused grouped-query QKV."""
        out: dict[str, Any] = {}
        for name, x in tensors.items():
            found = self.match(name)
            if found is None:
                if self.is_ignored(name):
                    continue
                raise CheckpointError(
                    f"tensor {name}: no rule of {self.path.name} maps it", tensor=name
                )
            rule, bindings = found
            targets = rule.targets(bindings)
            sizes = None
            if rule.split_axis is not None and param_shapes is not None:
                missing = [t for t in targets if t not in param_shapes]
                if missing:
                    raise CheckpointError(
                        f"tensor {name}: no shape given for {', '.join(missing)}", tensor=name
                    )
                sizes = [param_shapes[t][rule.split_axis] for t in targets]
            try:
                parts = rule.forward(x, sizes)
            except ValueError as e:
                raise CheckpointError(f"tensor {name}: {e}", tensor=name) from e
            for param, part in zip(targets, parts, strict=True):
                if param in out:
                    raise CheckpointError(
                        f"tensor {name}: param {param} is already set by another tensor",
                        tensor=name,
                    )
                out[param] = _contiguous(part)
        return out

    def to_hf(self, params: Mapping[str, Any], *, prefix: bool = True) -> dict[str, Any]:
        """Source params -> HF-named tensors (the exact inverse of `from_hf`).

        A param no rule covers is an error; a split rule needs all its params. With
        `prefix=False`, names drop `hf_prefix` (as a bare base-model checkpoint has them).
        """
        out: dict[str, Any] = {}
        used: set[str] = set()
        for rule in self.rules:
            seen: list[dict[str, str]] = []
            for p in params:
                m = None
                for regex in rule.param_regexes:
                    m = regex.fullmatch(p)
                    if m:
                        break
                if m and m.groupdict() not in seen:
                    seen.append(m.groupdict())
            for bindings in seen:
                targets = rule.targets(bindings)
                missing = [t for t in targets if t not in params]
                name = rule.hf_name(bindings)
                if missing:
                    raise CheckpointError(
                        f"tensor {name} needs params {', '.join(targets)}; "
                        f"missing {', '.join(missing)}",
                        tensor=name,
                    )
                if not prefix and self.hf_prefix and name.startswith(self.hf_prefix):
                    name = name[len(self.hf_prefix) :]
                out[name] = rule.inverse([params[t] for t in targets])
                used.update(targets)
        stray = [p for p in params if p not in used]
        if stray:
            raise CheckpointError(
                f"param {stray[0]} has no rule in {self.path.name}"
                + (f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""),
                tensor=stray[0],
            )
        return out

    # GGUF ----------------------------------------------------------------------------

    def groups(self, params) -> list[tuple[Rule, dict[str, str]]]:
        """(rule, bindings) for every HF tensor that `params` (names) make, in rule order;
        a param no rule covers, or a fused tensor with a part missing, is an error."""
        out: list[tuple[Rule, dict[str, str]]] = []
        used: set[str] = set()
        names = list(params)
        for rule in self.rules:
            seen: list[dict[str, str]] = []
            for p in names:
                for regex in rule.param_regexes:
                    m = regex.fullmatch(p)
                    if m:
                        if m.groupdict() not in seen:
                            seen.append(m.groupdict())
                        break
            for bindings in sorted(seen, key=lambda b: [int(v) for v in b.values()]):
                targets = rule.targets(bindings)
                missing = [t for t in targets if t not in params]
                if missing:
                    name = rule.hf_name(bindings)
                    raise CheckpointError(
                        f"tensor {name} needs params {', '.join(targets)}; "
                        f"missing {', '.join(missing)}",
                        tensor=name,
                    )
                out.append((rule, bindings))
                used.update(targets)
        stray = [p for p in names if p not in used]
        if stray:
            raise CheckpointError(
                f"param {stray[0]} has no rule in {self.path.name}", tensor=stray[0]
            )
        return out

    def _need_gguf(self) -> GgufSpec:
        if self.gguf is None:
            raise UnsupportedArchitecture(
                f"{self.architecture}: {self.path.name} has no [gguf] table, so no GGUF names"
            )
        return self.gguf

    def match_gguf(self, name: str) -> tuple[Rule, dict[str, str]] | None:
        """The rule (and bindings) whose GGUF pattern matches tensor `name`, or None."""
        for rule in self.rules:
            if rule.gguf_regex is not None:
                bindings = _bindings(rule.gguf_regex.fullmatch(name))
                if bindings is not None:
                    return rule, bindings
        return None

    def gguf_tensor(self, rule: Rule, bindings: Mapping[str, str], parts: list, config: Mapping):
        """Params of one rule -> (GGUF name, GGUF tensor)."""
        spec = self._need_gguf()
        name = rule.gguf_name(bindings)
        if name is None:
            raise CheckpointError(
                f"{self.path.name}: tensor {rule.hf_name(bindings)} has no GGUF name",
                tensor=rule.hf_name(bindings),
            )
        x = rule.joined(parts)
        for t in spec.transforms_for(name):
            x = t.apply(x, config)
        return name, _contiguous(x)

    def params_from_gguf(
        self, rule: Rule, bindings: Mapping[str, str], x, config: Mapping, sizes=None
    ) -> list:
        """One GGUF tensor -> the rule's params (the inverse of `gguf_tensor`)."""
        spec = self._need_gguf()
        for t in reversed(spec.transforms_for(rule.gguf_name(bindings))):
            x = t.invert(x, config)
        return [_contiguous(p) for p in rule.split(x, sizes)]

    def to_gguf(self, params: Mapping[str, Any], config: Mapping) -> dict[str, Any]:
        """Source params -> GGUF-named tensors (extra computed tensors not included)."""
        out = {}
        for rule, bindings in self.groups(params):
            parts = [params[t] for t in rule.targets(bindings)]
            name, x = self.gguf_tensor(rule, bindings, parts, config)
            out[name] = x
        return out

    def from_gguf(
        self,
        tensors: Mapping[str, Any],
        config: Mapping,
        param_shapes: Mapping[str, tuple[int, ...]] | None = None,
    ) -> dict[str, Any]:
        """GGUF-named tensors -> source params; names in [gguf.extra] are skipped."""
        spec = self._need_gguf()
        out: dict[str, Any] = {}
        for name, x in tensors.items():
            if name in spec.extra:
                continue
            found = self.match_gguf(name)
            if found is None:
                raise CheckpointError(
                    f"GGUF tensor {name}: no rule of {self.path.name} maps it", tensor=name
                )
            rule, bindings = found
            targets = rule.targets(bindings)
            sizes = None
            if rule.split_axis is not None and param_shapes is not None:
                sizes = [param_shapes[t][rule.split_axis] for t in targets]
            try:
                parts = self.params_from_gguf(rule, bindings, x, config, sizes)
            except ValueError as e:
                raise CheckpointError(f"GGUF tensor {name}: {e}", tensor=name) from e
            out.update(zip(targets, parts, strict=True))
        return out

    def config_to_hf(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Source config values -> a config.json dict that `translate_config` reads back to
        the same values (fields the manifest does not name are left out)."""
        if not self.model_type:
            raise ConfigError(f"{self.path.name}: no model_type, so no config.json can be made")
        out: dict[str, Any] = {"architectures": [self.architecture], "model_type": self.model_type}
        for req in self.require:
            _set_path(out, req.paths[0], req.allowed[0])
        for name, spec in self.fields.items():
            if name in self.const:
                continue
            if name not in values:
                if spec.map is not None and spec.default is not _MISSING and spec.paths:
                    _set_path(out, spec.paths[0], spec.default)  # e.g. rope_type "default"
                continue
            value = values[name]
            if spec.compute is not None:
                COMPUTED_TO_HF[spec.compute](out, value)
                continue
            if value is None or not spec.paths:
                continue
            if spec.null is not _MISSING and _same(value, spec.null):
                value = None
            elif spec.map is not None:
                keys = [k for k, v in spec.map.items() if _same(v, value)]
                if not keys:
                    raise ConfigError(
                        f"{name} = {value!r} has no config.json value in {self.path.name}"
                    )
                value = keys[0]
            _set_path(out, spec.paths[0], value)
        return out


# ----------------------------------------------------------------------------------------
# Loading

_TOP_KEYS = {
    "architecture",
    "source",
    "base",
    "base_prefix",
    "hf_prefix",
    "ignore",
    "config",
    "tensors",
    "model_type",
    "gguf",
    "buffers",
}


def _fail(path: Path, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {msg}")


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise _fail(path, f"cannot read weights map: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise _fail(path, f"invalid TOML: {e}") from e


def _parse_field(path: Path, name: str, spec: Any) -> FieldSpec:
    if isinstance(spec, list):
        paths = list(spec)
        default = _MISSING
        if paths and not isinstance(paths[-1], str):
            default = paths.pop()
        if not all(isinstance(p, str) for p in paths):
            raise _fail(path, f"config.{name}: paths must be strings, then one default")
        return FieldSpec(name, tuple(paths), default)
    if isinstance(spec, dict):
        unknown = set(spec) - {"from", "default", "null", "map", "compute"}
        if unknown:
            raise _fail(path, f"config.{name}: unknown keys {sorted(unknown)}")
        if "compute" in spec:
            if spec["compute"] not in COMPUTED:
                raise _fail(
                    path,
                    f"config.{name}: unknown compute {spec['compute']!r} "
                    f"(known: {', '.join(COMPUTED)})",
                )
            return FieldSpec(name, compute=spec["compute"])
        paths = spec.get("from", [name])
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise _fail(path, f"config.{name}: `from` must be a list of paths")
        mapping = spec.get("map")
        if mapping is not None and not isinstance(mapping, dict):
            raise _fail(path, f"config.{name}: `map` must be a table")
        return FieldSpec(
            name,
            tuple(paths),
            default=spec.get("default", _MISSING),
            null=spec.get("null", _MISSING),
            map=mapping,
        )
    raise _fail(path, f"config.{name}: expected a list of paths or a table")


def _parse_require(path: Path, name: str, spec: Any) -> Requirement:
    if not isinstance(spec, dict) or not ({"equals", "one_of"} & set(spec)):
        raise _fail(
            path, f"config.require.{name}: expected {{ equals = ... }} or {{ one_of = [...] }}"
        )
    paths = spec.get("from", [name])
    if isinstance(paths, str):
        paths = [paths]
    allowed = tuple(spec["one_of"]) if "one_of" in spec else (spec["equals"],)
    return Requirement(name, tuple(paths), allowed, spec.get("why", ""))


def _parse_rule(path: Path, i: int, spec: Any) -> Rule:
    where = f"{path}: tensors[{i}]"
    if not isinstance(spec, dict) or not isinstance(spec.get("hf"), str):
        raise ConfigError(f'{where}: each [[tensors]] entry needs hf = "..."')
    unknown = set(spec) - {"hf", "param", "split", "transforms", "gguf"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    if ("param" in spec) == ("split" in spec):
        raise ConfigError(f"{where} ({spec['hf']}): give exactly one of `param` and `split`")
    split_axis = None
    if "param" in spec:
        params = (spec["param"],)
    else:
        split = spec["split"]
        if (
            not isinstance(split, dict)
            or not isinstance(split.get("axis"), int)
            or not isinstance(split.get("params"), list)
            or len(split["params"]) < 2
        ):
            raise ConfigError(f"{where}: split = {{ axis = N, params = [two or more] }}")
        split_axis = split["axis"]
        params = tuple(split["params"])
    if not all(isinstance(p, str) for p in params):
        raise ConfigError(f"{where}: param names must be strings")
    transforms = tuple(_parse_transform(t, where) for t in spec.get("transforms", []))
    gguf = spec.get("gguf")
    if gguf is not None and not isinstance(gguf, str):
        raise ConfigError(f'{where}: gguf = "..." must be a tensor name')
    rule = Rule(spec["hf"], params, transforms, split_axis, gguf)
    for p in params:
        extra = set(_compile(p)[1]) - set(rule.placeholders)
        if extra:
            raise ConfigError(f"{where}: param {p} uses placeholders {sorted(extra)} not in hf")
    return rule


def load_manifest(path: str | Path, _seen: tuple[Path, ...] = ()) -> Manifest:
    """Load one manifest file (following `base`)."""
    path = Path(path).resolve()
    if path in _seen:
        raise _fail(path, "`base` chain loops back to this file")
    data = _read_toml(path)
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise _fail(path, f"unknown keys {sorted(unknown)}")
    if not isinstance(data.get("architecture"), str):
        raise _fail(path, 'missing architecture = "..."')

    base = None
    if "base" in data:
        base = load_manifest(path.parent / data["base"], (*_seen, path))

    config = data.get("config", {})
    if not isinstance(config, dict):
        raise _fail(path, "[config] must be a table")
    const = config.get("const", {})
    require = config.get("require", {})
    fields = {
        name: _parse_field(path, name, spec)
        for name, spec in config.items()
        if name not in ("const", "require")
    }
    requirements = [_parse_require(path, name, spec) for name, spec in require.items()]
    rules = [_parse_rule(path, i, spec) for i, spec in enumerate(data.get("tensors", []))]
    ignore = list(data.get("ignore", []))

    source = data.get("source", base.source if base else None)
    if not isinstance(source, str):
        raise _fail(path, 'missing source = "..."')
    base_prefix = data.get("base_prefix", "")
    if base_prefix and base is None:
        raise _fail(path, "base_prefix needs a base")
    prefix = data.get("hf_prefix", base_prefix or (base.hf_prefix if base else ""))

    if base is not None:
        names = set(fields) | set(const)
        # Keep the base's order; a child's field takes its base entry's place.
        merged_fields = {
            k: fields.get(k, v) for k, v in base.fields.items() if k in fields or k not in names
        }
        merged_fields.update(fields)
        fields = merged_fields
        const = {**{k: v for k, v in base.const.items() if k not in names}, **const}
        mine = {r.name for r in requirements}
        requirements = [r for r in base.require if r.name not in mine] + requirements
        claimed = {p for r in rules for p in r.params}
        inherited = [r for r in base.rules if not claimed & set(r.params)]
        # a task model holds the base model under a prefix (BertForMaskedLM: `bert.`)
        inherited = [replace(r, hf=base_prefix + r.hf) for r in inherited]
        rules = inherited + rules
        base_ignore = [base_prefix + p for p in base.ignore]
        ignore = base_ignore + [p for p in ignore if p not in base_ignore]

    seen_params: dict[str, str] = {}
    for r in rules:
        for p in r.params:
            if p in seen_params:
                raise _fail(path, f"param {p} is the target of both {seen_params[p]} and {r.hf}")
            seen_params[p] = r.hf

    return Manifest(
        architecture=data["architecture"],
        source=source,
        path=path,
        rules=rules,
        ignore=ignore,
        fields=fields,
        const=dict(const),
        require=requirements,
        hf_prefix=prefix,
        model_type=str(data.get("model_type", "")),
        gguf=_parse_gguf(path, data.get("gguf"), base.gguf if base else None),
        buffers={**(base.buffers if base else {}), **_parse_buffers(path, data.get("buffers", {}))},
    )


def all_manifests(folder: Path | None = None) -> dict[str, Path]:
    """Architecture name -> manifest file, for every manifest in the weights-maps folder."""
    folder = Path(folder) if folder is not None else maps_dir()
    out: dict[str, Path] = {}
    for p in sorted(folder.glob("*.toml")):
        arch = _read_toml(p).get("architecture")
        if isinstance(arch, str):
            out[arch] = p
    return out


def find_manifest(architecture: str, folder: Path | None = None) -> Manifest:
    """The manifest for an HF architecture (config.json `architectures[0]`)."""
    known = all_manifests(folder)
    if architecture not in known:
        raise UnsupportedArchitecture(
            f"architecture {architecture!r} has no weights map; supported: "
            + ", ".join(sorted(known))
        )
    return load_manifest(known[architecture])


def supported_architectures(folder: Path | None = None) -> list[str]:
    return sorted(all_manifests(folder))
