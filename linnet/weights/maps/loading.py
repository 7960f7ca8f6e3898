"""Loading weights maps: weights_maps/*.toml -> `WeightsMap` (format: docs/weights-maps.md).

find_weights_map("Qwen2ForCausalLM")     # by config.json `architectures[0]`
load_weights_map("weights_maps/qwen2.toml")
all_weights_maps()                       # {"BertModel": Path(".../bert.toml"), ...}
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from linnet.errors import ConfigError, UnsupportedArchitecture
from linnet.weights.maps.computed import COMPUTED
from linnet.weights.maps.config import MISSING, FieldSpec, Requirement
from linnet.weights.maps.gguf import parse_gguf
from linnet.weights.maps.rules import Rule, compile_pattern
from linnet.weights.maps.transforms import parse_transform
from linnet.weights.maps.weights_map import BUFFER_DTYPES, Buffer, WeightsMap

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOP_KEYS = {
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
    "config_format",
}


CONFIG_FORMATS = ("transformers", "diffusers")


def maps_dir() -> Path:
    """The folder of weights maps (`linnet.weights_maps`, or the repo's weights_maps/)."""
    try:
        import linnet.weights_maps as wm

        return Path(wm.HERE)
    except ImportError:
        return Path(__file__).resolve().parents[3] / "weights_maps"


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


def _paths(path: Path, name: str, spec: Any) -> list[str]:
    paths = spec.get("from", [name])
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise _fail(path, f"config.{name}: `from` must be a list of paths")
    return paths


def _parse_computed(path: Path, name: str, spec: dict) -> FieldSpec:
    rule = COMPUTED.get(spec["compute"])
    if rule is None:
        raise _fail(
            path,
            f"config.{name}: unknown compute {spec['compute']!r} (known: {', '.join(COMPUTED)})",
        )
    if rule.read is None or rule.write is None:  # both directions, or the export breaks
        raise _fail(path, f"config.{name}: compute {rule.name!r} lacks its read or its write")
    return FieldSpec(name, computed=rule)


def _parse_field(path: Path, name: str, spec: Any) -> FieldSpec:
    if isinstance(spec, list):
        paths = list(spec)
        default = MISSING
        if paths and not isinstance(paths[-1], str):
            default = paths.pop()
        if not all(isinstance(p, str) for p in paths):
            raise _fail(path, f"config.{name}: paths must be strings, then one default")
        return FieldSpec(name, tuple(paths), default)
    if not isinstance(spec, dict):
        raise _fail(path, f"config.{name}: expected a list of paths or a table")
    unknown = set(spec) - {"from", "default", "null", "map", "compute"}
    if unknown:
        raise _fail(path, f"config.{name}: unknown keys {sorted(unknown)}")
    if "compute" in spec:
        return _parse_computed(path, name, spec)
    mapping = spec.get("map")
    if mapping is not None and not isinstance(mapping, dict):
        raise _fail(path, f"config.{name}: `map` must be a table")
    return FieldSpec(
        name,
        tuple(_paths(path, name, spec)),
        default=spec.get("default", MISSING),
        null=spec.get("null", MISSING),
        map=mapping,
    )


def _parse_present(path: Path, spec: Any) -> dict[str, str]:
    """[config.present]: bool field -> the HF tensor whose presence sets it."""
    if not isinstance(spec, dict) or not all(isinstance(v, str) for v in spec.values()):
        raise _fail(path, '[config.present]: field = "hf.tensor.name"')
    return dict(spec)


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


def _rule_params(where: str, spec: dict) -> tuple[tuple, int | None]:
    if ("param" in spec) == ("split" in spec):
        raise ConfigError(f"{where} ({spec['hf']}): give exactly one of `param` and `split`")
    if "param" in spec:
        params, split_axis = (spec["param"],), None
    else:
        split = spec["split"]
        if (
            not isinstance(split, dict)
            or not isinstance(split.get("axis"), int)
            or not isinstance(split.get("params"), list)
            or len(split["params"]) < 2
        ):
            raise ConfigError(f"{where}: split = {{ axis = N, params = [two or more] }}")
        params, split_axis = tuple(split["params"]), split["axis"]
    if not all(isinstance(p, str) for p in params):
        raise ConfigError(f"{where}: param names must be strings")
    return params, split_axis


def _parse_rule(path: Path, i: int, spec: Any) -> Rule:
    where = f"{path}: tensors[{i}]"
    if not isinstance(spec, dict) or not isinstance(spec.get("hf"), str):
        raise ConfigError(f'{where}: each [[tensors]] entry needs hf = "..."')
    unknown = set(spec) - {"hf", "param", "split", "transforms", "gguf"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    params, split_axis = _rule_params(where, spec)
    transforms = tuple(parse_transform(t, where) for t in spec.get("transforms", []))
    gguf = spec.get("gguf")
    if gguf is not None and not isinstance(gguf, str):
        raise ConfigError(f'{where}: gguf = "..." must be a tensor name')
    rule = Rule(spec["hf"], params, transforms, split_axis, gguf)
    for p in params:
        extra = set(compile_pattern(p)[1]) - set(rule.placeholders)
        if extra:
            raise ConfigError(f"{where}: param {p} uses placeholders {sorted(extra)} not in hf")
    return rule


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


def _own_parts(path: Path, data: dict) -> dict[str, Any]:
    """The map's own config fields, consts, requirements, rules and ignore list."""
    config = data.get("config", {})
    if not isinstance(config, dict):
        raise _fail(path, "[config] must be a table")
    return dict(
        fields={
            name: _parse_field(path, name, spec)
            for name, spec in config.items()
            if name not in ("const", "require", "present")
        },
        const=dict(config.get("const", {})),
        present=_parse_present(path, config.get("present", {})),
        require=[_parse_require(path, n, s) for n, s in config.get("require", {}).items()],
        rules=[_parse_rule(path, i, spec) for i, spec in enumerate(data.get("tensors", []))],
        ignore=list(data.get("ignore", [])),
    )


def _inherit(own: dict[str, Any], base: WeightsMap, base_prefix: str) -> dict[str, Any]:
    """`own` over the base's parts: a name the child sets replaces the base's entry; a child
    rule replaces every base rule that targets any of its params."""
    names = set(own["fields"]) | set(own["const"]) | set(own["present"])
    # Keep the base's order; a child's field takes its base entry's place.
    fields = {
        k: own["fields"].get(k, v)
        for k, v in base.fields.items()
        if k in own["fields"] or k not in names
    }
    fields.update(own["fields"])
    mine = {r.name for r in own["require"]}
    claimed = {p for r in own["rules"] for p in r.params}
    # a task model holds the base model under a prefix (BertForMaskedLM: `bert.`)
    inherited = [
        replace(r, hf=base_prefix + r.hf) for r in base.rules if not claimed & set(r.params)
    ]
    base_ignore = [base_prefix + p for p in base.ignore]
    return dict(
        fields=fields,
        const={**{k: v for k, v in base.const.items() if k not in names}, **own["const"]},
        present={
            **{k: base_prefix + v for k, v in base.present.items() if k not in names},
            **own["present"],
        },
        require=[r for r in base.require if r.name not in mine] + own["require"],
        rules=inherited + own["rules"],
        ignore=base_ignore + [p for p in own["ignore"] if p not in base_ignore],
    )


def _check_targets(path: Path, rules: list[Rule]) -> None:
    seen_params: dict[str, str] = {}
    for r in rules:
        for p in r.params:
            if p in seen_params:
                raise _fail(path, f"param {p} is the target of both {seen_params[p]} and {r.hf}")
            seen_params[p] = r.hf


def load_weights_map(path: str | Path, _seen: tuple[Path, ...] = ()) -> WeightsMap:
    """Load one weights map file (following `base`)."""
    path = Path(path).resolve()
    if path in _seen:
        raise _fail(path, "`base` chain loops back to this file")
    data = _read_toml(path)
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise _fail(path, f"unknown keys {sorted(unknown)}")
    if not isinstance(data.get("architecture"), str):
        raise _fail(path, 'missing architecture = "..."')
    base = load_weights_map(path.parent / data["base"], (*_seen, path)) if "base" in data else None
    parts = _own_parts(path, data)
    source = data.get("source", base.source if base else None)
    if not isinstance(source, str):
        raise _fail(path, 'missing source = "..."')
    base_prefix = data.get("base_prefix", "")
    if base_prefix and base is None:
        raise _fail(path, "base_prefix needs a base")
    if base is not None:
        parts = _inherit(parts, base, base_prefix)
    _check_targets(path, parts["rules"])
    return WeightsMap(
        architecture=data["architecture"],
        source=source,
        path=path,
        hf_prefix=data.get("hf_prefix", base_prefix or (base.hf_prefix if base else "")),
        model_type=str(data.get("model_type", base.model_type if base else "")),
        config_format=_config_format(path, data, base),
        gguf=parse_gguf(path, data.get("gguf"), base.gguf if base else None),
        buffers={**(base.buffers if base else {}), **_parse_buffers(path, data.get("buffers", {}))},
        **parts,
    )


def _config_format(path: Path, data: dict, base) -> str:
    """How config.json names the class: "transformers" (`architectures`, `model_type`) or
    "diffusers" (`_class_name`)."""
    value = data.get("config_format", base.config_format if base else "transformers")
    if value not in CONFIG_FORMATS:
        raise _fail(path, f"config_format must be one of {CONFIG_FORMATS}, got {value!r}")
    return value


def architecture_of(hf_config: dict) -> str | None:
    """The class a config.json names: transformers' `architectures[0]`, else diffusers'
    `_class_name`; None when it names none."""
    archs = hf_config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    name = hf_config.get("_class_name")
    return name if isinstance(name, str) and not archs else None


def all_weights_maps(folder: Path | None = None) -> dict[str, Path]:
    """Architecture name -> weights map file, for every map in the weights-maps folder."""
    folder = Path(folder) if folder is not None else maps_dir()
    out: dict[str, Path] = {}
    for p in sorted(folder.glob("*.toml")):
        arch = _read_toml(p).get("architecture")
        if isinstance(arch, str):
            out[arch] = p
    return out


def find_weights_map(architecture: str, folder: Path | None = None) -> WeightsMap:
    """The weights map for an HF architecture (config.json `architectures[0]`)."""
    known = all_weights_maps(folder)
    if architecture not in known:
        raise UnsupportedArchitecture(
            f"architecture {architecture!r} has no weights map; supported: "
            + ", ".join(sorted(known))
        )
    return load_weights_map(known[architecture])


def supported_architectures(folder: Path | None = None) -> list[str]:
    return sorted(all_weights_maps(folder))
