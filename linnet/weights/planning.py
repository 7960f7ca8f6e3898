"""From a checkpoint to a plan, a source and a config, reading headers only.

    plan, source, config, hf_config = plan_checkpoint("path/to/folder", dtype="bf16")
    plan.check()                    # every missing, extra or misshapen tensor, named

The checkpoint is a folder, or an object that reads like one (`Checkpoint`, the Hub's
`RemoteCheckpoint`: `read_config()` and `headers()`). Nothing here imports torch:
`linnet plan`, the exporters' and the Hub's planning run without it.
"""

from __future__ import annotations

import os

from linnet.check.config import ParamLimitError
from linnet.core.dtypes import normalize_dtype
from linnet.errors import CheckpointError, ConfigError
from linnet.source import Source
from linnet.weights.maps import WeightsMap, architecture_of, find_weights_map
from linnet.weights.plan import Plan, make_plan
from linnet.weights.safetensors_io import Checkpoint

# The cache is preallocated: cap the default so an 8B model with a 128k context
# does not reserve tens of GB. Pass max_positions= to go further.
DEFAULT_MAX_POSITIONS = 4096


def cache_length(overrides: dict, max_positions: int | None) -> int:
    """The KV-cache rows to allocate: `max_positions` if given, else the context capped."""
    limit = overrides.get("max_positions", DEFAULT_MAX_POSITIONS)
    return max_positions or min(limit, DEFAULT_MAX_POSITIONS)


def source_for(weights_map: WeightsMap) -> Source:
    from linnet.zoo import source_path

    return Source.load(source_path(weights_map.source))


SPARE_PARAMS = 10_000


def bounded_layout(source: Source, config: dict, ckpt, weights_map: WeightsMap, origins=None):
    """The source's params for `config`, bounded by what the checkpoint can hold: each of its
    tensors feeds at most as many params as the map's widest split, so a block count past
    that (num_hidden_layers = 10**9) is refused before millions of names are made."""
    tensors = len(ckpt.headers())
    widest = max((len(rule.params) for rule in weights_map.rules), default=1)
    try:  # (with room to spare, so that the plan itself names a few missing tensors)
        return source.params(config, max_params=widest * tensors + SPARE_PARAMS)
    except ParamLimitError as err:
        origin = (origins or {}).get(err.field or "", f"config `{err.field or err.block}`")
        raise ConfigError(
            f"{origin} = {err.count} asks for `{err.block}[{err.count}]`, more params "
            f"than the {tensors} tensors of the checkpoint can hold"
        ) from None


def plan_checkpoint(
    checkpoint, *, dtype=None, max_positions: int | None = None
) -> tuple[Plan, Source, dict, dict]:
    """Read config and headers only; return the plan, source, config and HF config."""
    is_path = isinstance(checkpoint, (str, os.PathLike))
    ckpt = Checkpoint(checkpoint) if is_path else checkpoint
    hf_config = ckpt.read_config()
    arch = architecture_of(hf_config)
    if arch is None:
        raise CheckpointError(
            f"{ckpt.config_path}: no `architectures` list (or diffusers `_class_name`) naming "
            "the model class",
            file=str(ckpt.config_path),
        )
    weights_map = find_weights_map(arch)
    source = source_for(weights_map)
    overrides = weights_map.translate_config(hf_config, ckpt.headers())
    if dtype is not None:
        overrides["act"] = normalize_dtype(dtype)
    overrides.setdefault("act", "f32")
    if "max_positions" in source.fields:  # a source with a cache: cap its length
        overrides["max_positions"] = cache_length(overrides, max_positions)
    origins = weights_map.config_origins(
        hf_config, str(getattr(ckpt, "config_path", "config.json"))
    )
    config = source.config(overrides, origins)
    layout = bounded_layout(source, config, ckpt, weights_map, origins)
    shapes = {name: tuple(d.value for d in t.shape) for name, t in layout.shapes.items()}
    plan = make_plan(ckpt, weights_map, shapes, layout.tied, config["act"], config=config)
    return plan, source, config, hf_config
