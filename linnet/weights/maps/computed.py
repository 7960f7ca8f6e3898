"""Computed config fields: a source field that no single config.json key holds.

Each is declared once, as a `Computed` record with both directions:

    COMPUTED["mlp_ratio_ffn"].read({"hidden_size": 384, "mlp_ratio": 4}, "ffn")   # 1536
    hf = {"hidden_size": 384}
    COMPUTED["mlp_ratio_ffn"].write(hf, 1536)                                      # mlp_ratio = 4

`read(config, field_name)` takes the HF config and returns the source value; `write(hf,
value)` sets the HF keys that read it back (it runs after the plain fields are written,
so it may use them). A map names one with `field = { compute = "NAME" }` (see
docs/weights-maps.md); the loader refuses a name not in `COMPUTED`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from linnet.errors import ConfigError
from linnet.weights.maps.computed_sam import sam_computed
from linnet.weights.maps.computed_unet import unet_computed


@dataclass(frozen=True)
class Computed:
    """A source config field computed from several HF keys, and its inverse."""

    name: str
    read: Callable[[Mapping, str], Any]
    write: Callable[[dict, Any], None]

    def __post_init__(self) -> None:
        if not (callable(self.read) and callable(self.write)):
            raise TypeError(f"computed field {self.name}: needs both read and write")


def _int(config: Mapping, key: str, default: int) -> int:
    """An integer field of config.json, strictly: true, 2.5 and "2" are errors, not 1, 2, 2."""
    value = config.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config.json: {key} must be an int, got {value!r}")
    return value


def _number(config: Mapping, key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"config.json: {key} must be a finite number, got {value!r}")
    return value


def _read_layer_types_window(config: Mapping, field_name: str) -> Any:
    """Qwen2/Qwen3: one sliding window for all layers, or none.

    transformers applies `sliding_window` only to layers whose `layer_types` entry
    is "sliding_attention"; without `layer_types` those are the layers from
    `max_window_layers` on, and only when `use_sliding_window` is true. The Llama
    source has one window for every layer, so a mix is a ConfigError.
    """
    n_layers = _int(config, "num_hidden_layers", 32)
    window = config.get("sliding_window", 4096)
    types = config.get("layer_types")
    if types is None:
        if not config.get("use_sliding_window", False) or window is None:
            return 0
        first = _int(config, "max_window_layers", 28)
        # the kinds of layers i >= first and i < first, without a list as long as n_layers
        types = ["sliding_attention"] * (n_layers > max(first, 0))
        types += ["full_attention"] * (min(first, n_layers) > 0)
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ConfigError(f"config.json: layer_types must be a list of strings, got {types!r}")
    kinds = set(types)
    if kinds <= {"full_attention"}:
        return 0
    if kinds == {"sliding_attention"} and window:
        return _int(config, "sliding_window", 4096)
    raise ConfigError(
        f"config.json: layer_types mixes {sorted(kinds)} (sliding_window={window}); the source "
        f"has one attention window ({field_name}) for every layer"
    )


def _write_layer_types_window(hf: dict, value: Any) -> None:
    hf["use_sliding_window"] = bool(value)
    hf["sliding_window"] = int(value) if value else None
    hf["max_window_layers"] = 0


def _read_num_labels(config: Mapping, field_name: str) -> Any:
    """Classifier outputs: transformers derives `num_labels` from `id2label`."""
    labels = config.get("id2label")
    if labels and not isinstance(labels, Mapping):
        raise ConfigError(f"config.json: id2label must be an object, got {type(labels).__name__}")
    return len(labels) if labels else _int(config, "num_labels", 2)


def _write_num_labels(hf: dict, value: Any) -> None:
    hf["num_labels"] = int(value)
    hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(int(value))}
    hf["label2id"] = {f"LABEL_{i}": i for i in range(int(value))}


def _read_mlp_ratio_ffn(config: Mapping, field_name: str) -> Any:
    """DINOv2: the MLP width is int(hidden_size * mlp_ratio)."""
    return int(_int(config, "hidden_size", 768) * _number(config, "mlp_ratio", 4))


def _write_mlp_ratio_ffn(hf: dict, value: Any) -> None:
    hidden, ffn = hf.get("hidden_size", 768), int(value)
    ratio = ffn / hidden
    if int(hidden * ratio) < ffn:  # float rounding fell just below: step up one ulp
        ratio = math.nextafter(ratio, math.inf)
    hf["mlp_ratio"] = int(ratio) if ratio == int(ratio) else ratio


def _read_global_every(config: Mapping, field_name: str) -> Any:
    """ModernBERT: global attention on layers i % n == 0, local on the others.

    Hub configs give `global_attn_every_n_layers`; transformers 5 saves `layer_types` too
    (and its models follow `layer_types`). The source expresses the every-n pattern only,
    so a `layer_types` that no n produces is a ConfigError.
    """
    every = _int(config, "global_attn_every_n_layers", 3)
    types = config.get("layer_types")
    if types is None:
        return every
    if not isinstance(types, list):
        raise ConfigError(f"config.json: layer_types must be a list, got {types!r}")
    n_layers = len(types)
    full = [i for i, kind in enumerate(types) if kind == "full_attention"]
    # the stated n first, else the only n that can fit: the second global layer's index
    for n in [every, full[1] if len(full) > 1 else max(n_layers, 1)]:
        if n > 0 and types == _global_every(n, n_layers):
            return n
    raise ConfigError(
        f"config.json: layer_types {list(types)} is not global attention every n layers; "
        f"the source's {field_name} expresses only that pattern"
    )


def _global_every(n: int, n_layers: int) -> list[str]:
    return ["sliding_attention" if i % n else "full_attention" for i in range(n_layers)]


def _write_global_every(hf: dict, value: Any) -> None:
    hf["global_attn_every_n_layers"] = int(value)  # transformers derives layer_types from it


def _read_full_every(config: Mapping, field_name: str) -> Any:
    """GPT-OSS: full attention on layers i % n == n - 1, a sliding window on the others, as
    `layer_types` lists them (absent: every second layer, GptOssConfig's default). A list
    that no n produces is a ConfigError."""
    types = config.get("layer_types")
    if types is None:
        return 2
    if not isinstance(types, list):
        raise ConfigError(f"config.json: layer_types must be a list, got {types!r}")
    full = [i for i, kind in enumerate(types) if kind == "full_attention"]
    n = full[0] + 1 if full else len(types) + 1  # the first full layer is layer n - 1
    if types == _full_every(n, len(types)):
        return n
    raise ConfigError(
        f"config.json: layer_types {list(types)} is not full attention on every n-th layer; "
        f"the source's {field_name} expresses only that pattern"
    )


def _full_every(n: int, n_layers: int) -> list[str]:
    return ["full_attention" if i % n == n - 1 else "sliding_attention" for i in range(n_layers)]


def _write_full_every(hf: dict, value: Any) -> None:
    hf["layer_types"] = _full_every(int(value), int(hf["num_hidden_layers"]))


def _read_yarn_truncate(config: Mapping, field_name: str) -> Any:
    """YaRN's `truncate`: transformers reads `rope_parameters.get("truncate", True)`, but a
    GPT-OSS config.json without any rope parameters gets GptOssConfig's own (truncate
    false)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    if rope is None:
        return False
    value = rope.get("truncate", True) if isinstance(rope, Mapping) else None
    if not isinstance(value, bool):
        raise ConfigError(
            f"config.json: rope_parameters.truncate must be true or false, got {value!r}"
        )
    return value


def _write_yarn_truncate(hf: dict, value: Any) -> None:
    hf.setdefault("rope_parameters", {})["truncate"] = bool(value)


def _read_resnet_widths(config: Mapping, field_name: str) -> Any:
    """ResNet: the stem's width (`embedding_size`), then each stage's (`hidden_sizes`)."""
    sizes = config.get("hidden_sizes", [256, 512, 1024, 2048])
    if not isinstance(sizes, list):
        raise ConfigError(f"config.json: hidden_sizes must be a list of ints, got {sizes!r}")
    stages = {f"hidden_sizes[{i}]": v for i, v in enumerate(sizes)}
    return [_int(config, "embedding_size", 64), *(_int(stages, k, 0) for k in stages)]


def _write_resnet_widths(hf: dict, value: Any) -> None:
    hf["embedding_size"], hf["hidden_sizes"] = int(value[0]), [int(v) for v in value[1:]]


def _read_vae_channels(config: Mapping, field_name: str) -> Any:
    """AutoencoderKL's decoder: the mid block's width (`block_out_channels[-1]`), then each
    up block's output, widest first (`block_out_channels` reversed)."""
    sizes = config.get("block_out_channels", [64])
    if not isinstance(sizes, list) or not sizes:
        raise ConfigError(f"config.json: block_out_channels must be a list of ints, got {sizes!r}")
    blocks = {f"block_out_channels[{i}]": v for i, v in enumerate(sizes)}
    widths = [_int(blocks, k, 0) for k in blocks]
    return [widths[-1], *reversed(widths)]


def _write_vae_channels(hf: dict, value: Any) -> None:
    """block_out_channels, and one encoder and one decoder block type per width (diffusers
    builds as many blocks as the type lists name)."""
    hf["block_out_channels"] = [int(v) for v in reversed(value[1:])]
    hf["down_block_types"] = ["DownEncoderBlock2D"] * (len(value) - 1)
    hf["up_block_types"] = ["UpDecoderBlock2D"] * (len(value) - 1)


COMPUTED: dict[str, Computed] = {
    c.name: c
    for c in (
        Computed("layer_types_window", _read_layer_types_window, _write_layer_types_window),
        Computed("num_labels", _read_num_labels, _write_num_labels),
        Computed("mlp_ratio_ffn", _read_mlp_ratio_ffn, _write_mlp_ratio_ffn),
        Computed("global_every", _read_global_every, _write_global_every),
        Computed("resnet_widths", _read_resnet_widths, _write_resnet_widths),
        Computed("vae_channels", _read_vae_channels, _write_vae_channels),
        Computed("full_every", _read_full_every, _write_full_every),
        Computed("yarn_truncate", _read_yarn_truncate, _write_yarn_truncate),
    )
}
# diffusers' UNet2DConditionModel (issue 15): its own module
COMPUTED.update((c.name, c) for c in unet_computed(Computed))
COMPUTED.update((c.name, c) for c in sam_computed(Computed))  # SamModel (issue 15)
