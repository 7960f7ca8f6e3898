"""Weights maps: one TOML file per Hugging Face architecture (weights_maps/*.toml).

    from linnet.weights.maps import find_weights_map
    wmap = find_weights_map("LlamaForCausalLM")
    config = wmap.translate_config(hf_config)
    params = wmap.from_hf(hf_tensors, param_shapes)

Modules: `transforms` (per-tensor transforms), `rules` (name patterns), `config` (config
translation), `computed` (computed config fields, each with its inverse), `gguf` (the
`[gguf]` table), `weights_map` (`WeightsMap`), `loading` (TOML -> `WeightsMap`).
The format's reference: docs/weights-maps.md.
"""

from linnet.weights.maps.computed import COMPUTED, Computed
from linnet.weights.maps.config import MISSING, FieldSpec, Requirement
from linnet.weights.maps.gguf import GgufFlag, GgufKey, GgufSpec, GgufTransform
from linnet.weights.maps.loading import (
    all_weights_maps,
    architecture_of,
    find_weights_map,
    load_weights_map,
    maps_dir,
    supported_architectures,
)
from linnet.weights.maps.rules import Rule
from linnet.weights.maps.transforms import Transform, rope_permute, rope_unpermute
from linnet.weights.maps.weights_map import Buffer, WeightsMap

__all__ = [
    "COMPUTED",
    "MISSING",
    "Buffer",
    "Computed",
    "FieldSpec",
    "GgufFlag",
    "GgufKey",
    "GgufSpec",
    "GgufTransform",
    "Requirement",
    "Rule",
    "Transform",
    "WeightsMap",
    "all_weights_maps",
    "architecture_of",
    "find_weights_map",
    "load_weights_map",
    "maps_dir",
    "rope_permute",
    "rope_unpermute",
    "supported_architectures",
]
