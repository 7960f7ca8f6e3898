"""Computed config fields of diffusers' UNet2DConditionModel (zoo/unet.linnet, issue 15):
the source's per-level lists from diffusers' block lists. The source has SDXL's topology,
three levels of two layers; another is refused here, with the key that says so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from linnet.errors import ConfigError

LEVELS = 3
CROSS_DOWN, PLAIN_DOWN = "CrossAttnDownBlock2D", "DownBlock2D"
CROSS_UP, PLAIN_UP = "CrossAttnUpBlock2D", "UpBlock2D"


def _ints(config: Mapping, key: str, default: Any) -> list[int]:
    """A per-level list of ints (a single int stands for every level), LEVELS long."""
    value = config.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value] * LEVELS
    ok = isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
    )
    if not ok or len(value) != LEVELS:
        raise ConfigError(
            f"config.json: {key} must be {LEVELS} positive ints (zoo/unet.linnet has SDXL's "
            f"{LEVELS} levels), got {value!r}"
        )
    return list(value)


def _attention_levels(config: Mapping) -> list[bool]:
    """Which levels have transformers: down block types, mirrored by the up block types."""
    down = config.get("down_block_types")
    up = config.get("up_block_types")
    if (
        not isinstance(down, list)
        or len(down) != LEVELS
        or not set(down) <= {CROSS_DOWN, PLAIN_DOWN}
    ):
        raise ConfigError(
            f"config.json: down_block_types must be {LEVELS} of {CROSS_DOWN}, {PLAIN_DOWN}, "
            f"got {down!r}"
        )
    levels = [t == CROSS_DOWN for t in down]
    mirrored = [CROSS_UP if a else PLAIN_UP for a in reversed(levels)]
    if up != mirrored:
        raise ConfigError(f"config.json: up_block_types must mirror the down blocks: {mirrored}")
    return levels


# Options SDXL leaves off (null or false) that the source has no way to compute.
UNSET = (
    "class_embed_type",
    "num_class_embeds",
    "encoder_hid_dim_type",
    "time_cond_proj_dim",
    "time_embedding_dim",
    "time_embedding_act_fn",
    "timestep_post_act",
    "cross_attention_norm",
    "only_cross_attention",
    "dual_cross_attention",
    "mid_block_only_cross_attention",
    "center_input_sample",
    "resnet_skip_time_act",
    "class_embeddings_concat",
)


def _refuse_unset_options(config: Mapping) -> None:
    for key in UNSET:
        if config.get(key) not in (None, False):
            raise ConfigError(
                f"config.json: {key} = {config[key]!r} is not supported for "
                "UNet2DConditionModel (zoo/unet.linnet has SDXL's options: null or false)"
            )


def _read_widths(config: Mapping, field_name: str) -> Any:
    """conv_in's width, each level's (block_out_channels), the mid block's (the last's)."""
    _refuse_unset_options(config)
    widths = _ints(config, "block_out_channels", None)
    if config.get("layers_per_block", 2) != 2:
        raise ConfigError(
            "config.json: layers_per_block must be 2 (zoo/unet.linnet has SDXL's layers), "
            f"got {config.get('layers_per_block')!r}"
        )
    return [widths[0], *widths, widths[-1]]


def _write_widths(hf: dict, value: Any) -> None:
    hf["block_out_channels"] = [int(v) for v in value[1 : LEVELS + 1]]
    hf["layers_per_block"] = 2


def _read_depth(config: Mapping, field_name: str) -> Any:
    """Transformer layers per level; 0 where the level has none (DownBlock2D)."""
    layers = _ints(config, "transformer_layers_per_block", 1)
    return [n if attends else 0 for n, attends in zip(layers, _attention_levels(config))]


def _write_depth(hf: dict, value: Any) -> None:
    hf["transformer_layers_per_block"] = [int(v) or 1 for v in value]
    hf["down_block_types"] = [CROSS_DOWN if v else PLAIN_DOWN for v in value]
    hf["up_block_types"] = [CROSS_UP if v else PLAIN_UP for v in reversed(value)]


def _read_heads(config: Mapping, field_name: str) -> Any:
    """Heads per level: `num_attention_heads`, else `attention_head_dim` (diffusers' name
    for the head count in SD and SDXL configs)."""
    key = "num_attention_heads" if config.get("num_attention_heads") else "attention_head_dim"
    return _ints(config, key, 8)


def _write_heads(hf: dict, value: Any) -> None:
    hf["attention_head_dim"] = [int(v) for v in value]


def _read_head_dims(config: Mapping, field_name: str) -> Any:
    """Each level's width over its heads (diffusers' attention_head_dim per head)."""
    widths, heads = _read_widths(config, field_name)[1:-1], _read_heads(config, field_name)
    if any(w % h for w, h in zip(widths, heads)):
        raise ConfigError(f"config.json: block_out_channels {widths} must divide by heads {heads}")
    return [w // h for w, h in zip(widths, heads)]


def _write_nothing(hf: dict, value: Any) -> None:
    """Derived from fields written elsewhere."""


def unet_computed(computed_type) -> list:
    return [
        computed_type("unet_widths", _read_widths, _write_widths),
        computed_type("unet_depth", _read_depth, _write_depth),
        computed_type("unet_heads", _read_heads, _write_heads),
        computed_type("unet_head_dims", _read_head_dims, _write_nothing),
    ]
