"""`WeightsMap`: one HF architecture's weights map, loaded from weights_maps/*.toml.

    wmap = find_weights_map("LlamaForCausalLM")
    config = wmap.translate_config(hf_config)       # config.json -> source config values
    params = wmap.from_hf(hf_tensors, param_shapes)  # HF tensors -> source params
    wmap.to_hf(params); wmap.config_to_hf(config)    # and back (exports)
    wmap.to_gguf(params, config); wmap.from_gguf(gguf_tensors, config)

The format's reference: docs/weights-maps.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linnet.errors import CheckpointError, ConfigError, UnsupportedArchitecture
from linnet.weights.maps import config as cfg
from linnet.weights.maps.config import FieldSpec, Requirement
from linnet.weights.maps.gguf import GgufSpec
from linnet.weights.maps.rules import Rule, bindings, compile_pattern
from linnet.weights.maps.transforms import contiguous

BUFFER_DTYPES = ("i64",)


@dataclass(frozen=True)
class Buffer:
    """A non-float HF tensor the source has no param for (BatchNorm's int64
    `num_batches_tracked`): ignored on load; an HF export writes it back, a scalar of
    `dtype` and `value`, beside every tensor whose name ends with `beside`."""

    suffix: str  # ".num_batches_tracked"
    beside: str  # ".running_mean"
    dtype: str  # "i64"
    value: int


def _missing_parts(rule: Rule, values: Mapping[str, str], params) -> CheckpointError | None:
    targets = rule.targets(values)
    missing = [t for t in targets if t not in params]
    if not missing:
        return None
    name = rule.hf_name(values)
    return CheckpointError(
        f"tensor {name} needs params {', '.join(targets)}; missing {', '.join(missing)}",
        tensor=name,
    )


def _stray(params, used: set[str], where: str, count: bool) -> CheckpointError | None:
    stray = [p for p in params if p not in used]
    if not stray:
        return None
    more = f" (and {len(stray) - 1} more)" if count and len(stray) > 1 else ""
    return CheckpointError(f"param {stray[0]} has no rule in {where}{more}", tensor=stray[0])


@dataclass
class WeightsMap:
    architecture: str
    source: str
    path: Path
    rules: list[Rule]
    ignore: list[str]
    fields: dict[str, FieldSpec]
    const: dict[str, Any]
    require: list[Requirement]
    present: dict[str, str] = field(default_factory=dict)  # bool field -> HF tensor
    hf_prefix: str = ""
    model_type: str = ""
    config_format: str = "transformers"  # or "diffusers": the class is `_class_name`
    gguf: GgufSpec | None = None
    buffers: dict[str, Buffer] = field(default_factory=dict)
    _ignore_regexes: list[re.Pattern] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._ignore_regexes = [compile_pattern(p)[0] for p in self.ignore]

    def __repr__(self) -> str:
        return f"WeightsMap({self.architecture!r} -> {self.source!r}, {self.path.name})"

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
                values = bindings(rule.hf_regex.fullmatch(candidate))
                if values is not None:
                    if params is None or all(t in params for t in rule.targets(values)):
                        return rule, values
                    found.append((rule, values))
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
            values = rule.param_bindings(param)
            if values is not None:
                return rule, values
        return None

    def groups(self, params, *, ordered: bool = True) -> list[tuple[Rule, dict[str, str]]]:
        """(rule, bindings) for every HF tensor that `params` (names) make, in rule order
        (layers in index order unless `ordered=False`); a param no rule covers, or a fused
        tensor with a part missing, is an error."""
        out: list[tuple[Rule, dict[str, str]]] = []
        used: set[str] = set()
        for rule in self.rules:
            seen: list[dict[str, str]] = []
            for p in params:
                values = rule.param_bindings(p)
                if values is not None and values not in seen:
                    seen.append(values)
            if ordered:
                seen.sort(key=lambda b: [int(v) for v in b.values()])
            for values in seen:
                error = _missing_parts(rule, values, params)
                if error:
                    raise error
                out.append((rule, values))
                used.update(rule.targets(values))
        error = _stray(params, used, self.path.name, count=not ordered)
        if error:
            raise error
        return out

    # config --------------------------------------------------------------------------

    def translate_config(self, hf_config: Mapping, tensor_names=None) -> dict[str, Any]:
        """Source config values from an HF config.json dict (only fields the map names;
        a field with no value and no default is left out, so the source default applies).
        `tensor_names`: the checkpoint's tensors, which set the `[config.present]` fields
        (without them those fields keep the source default)."""
        out = cfg.translate(self.fields, self.const, self.require, hf_config, self.architecture)
        if tensor_names is not None:
            out.update(self.presence(tensor_names))
        return out

    def presence(self, tensor_names) -> dict[str, bool]:
        """The `[config.present]` fields: true where the checkpoint has the tensor (under
        any of its candidate names: a bare base model's tensors lack `hf_prefix`)."""
        held = {c for name in tensor_names for c in self._candidates(name)}
        return {field_name: hf in held for field_name, hf in self.present.items()}

    def config_origins(self, hf_config: Mapping, file: str = "config.json") -> dict[str, str]:
        """{source field: "config.json: its HF path"} for the fields this config sets."""
        return cfg.origins(self.fields, hf_config, file)

    def config_to_hf(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Source config values -> a config.json dict that `translate_config` reads back to
        the same values (fields the map does not name are left out)."""
        if self.config_format == "diffusers":
            out: dict[str, Any] = {"_class_name": self.architecture}
        elif not self.model_type:
            raise ConfigError(f"{self.path.name}: no model_type, so no config.json can be made")
        else:
            out = {"architectures": [self.architecture], "model_type": self.model_type}
        out.update(cfg.to_hf(self.fields, self.const, self.require, values, self.path.name))
        return out

    # HF tensors ----------------------------------------------------------------------

    def _split_sizes(self, name, rule, targets, param_shapes) -> list[int] | None:
        if rule.split_axis is None or param_shapes is None:
            return None
        missing = [t for t in targets if t not in param_shapes]
        if missing:
            raise CheckpointError(
                f"tensor {name}: no shape given for {', '.join(missing)}", tensor=name
            )
        return [param_shapes[t][rule.split_axis] for t in targets]

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
            rule, values = found
            targets = rule.targets(values)
            sizes = self._split_sizes(name, rule, targets, param_shapes)
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
                out[param] = contiguous(part)
        return out

    def to_hf(self, params: Mapping[str, Any], *, prefix: bool = True) -> dict[str, Any]:
        """Source params -> HF-named tensors (the exact inverse of `from_hf`).

        A param no rule covers is an error; a split rule needs all its params. With
        `prefix=False`, names drop `hf_prefix` (as a bare base-model checkpoint has them).
        """
        out: dict[str, Any] = {}
        for rule, values in self.groups(params, ordered=False):
            name = rule.hf_name(values)
            if not prefix and self.hf_prefix and name.startswith(self.hf_prefix):
                name = name[len(self.hf_prefix) :]
            out[name] = rule.inverse([params[t] for t in rule.targets(values)])
        return out

    # GGUF tensors --------------------------------------------------------------------

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
                values = bindings(rule.gguf_regex.fullmatch(name))
                if values is not None:
                    return rule, values
        return None

    def gguf_tensor(self, rule: Rule, values: Mapping[str, str], parts: list, config: Mapping):
        """Params of one rule -> (GGUF name, GGUF tensor)."""
        spec = self._need_gguf()
        name = rule.gguf_name(values)
        if name is None:
            raise CheckpointError(
                f"{self.path.name}: tensor {rule.hf_name(values)} has no GGUF name",
                tensor=rule.hf_name(values),
            )
        x = rule.joined(parts)
        for t in spec.transforms_for(name):
            x = t.apply(x, config)
        return name, contiguous(x)

    def params_from_gguf(
        self, rule: Rule, values: Mapping[str, str], x, config: Mapping, sizes=None
    ) -> list:
        """One GGUF tensor -> the rule's params (the inverse of `gguf_tensor`)."""
        spec = self._need_gguf()
        for t in reversed(spec.transforms_for(rule.gguf_name(values))):
            x = t.invert(x, config)
        return [contiguous(p) for p in rule.split(x, sizes)]

    def to_gguf(self, params: Mapping[str, Any], config: Mapping) -> dict[str, Any]:
        """Source params -> GGUF-named tensors (extra computed tensors not included)."""
        out = {}
        for rule, values in self.groups(params):
            parts = [params[t] for t in rule.targets(values)]
            name, x = self.gguf_tensor(rule, values, parts, config)
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
            rule, values = found
            targets = rule.targets(values)
            sizes = None
            if rule.split_axis is not None and param_shapes is not None:
                sizes = [param_shapes[t][rule.split_axis] for t in targets]
            try:
                parts = self.params_from_gguf(rule, values, x, config, sizes)
            except ValueError as e:
                raise CheckpointError(f"GGUF tensor {name}: {e}", tensor=name) from e
            out.update(zip(targets, parts, strict=True))
        return out
