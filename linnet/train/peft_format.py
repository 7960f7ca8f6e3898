"""LoRA adapters in PEFT's format, and merging them into the base weights.

    save_adapter(folder, adapters, spec, targets, weights_map)   # adapter_model.safetensors
    adapters, spec = load_adapter(folder, weights_map)           # + adapter_config.json
    merged = merge_lora(base_params, adapters, targets, spec.scale)

A source param (`layers.3.wq`) names its HF module through the checkpoint's weights map
(`model.layers.3.self_attn.q_proj`); PEFT's tensors are then
`base_model.model.<module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r]. Only
params an HF tensor holds one-to-one (no transform, no fused split) can carry adapters.
"""

from __future__ import annotations

import json
from pathlib import Path

from linnet.atomic import atomic_path
from linnet.errors import LinnetError
from linnet.train.lora import LoraSpec, lora_names
from linnet.weights.maps.weights_map import WeightsMap

PEFT_PREFIX = "base_model.model."
WEIGHTS_FILE, CONFIG_FILE = "adapter_model.safetensors", "adapter_config.json"


def hf_module(wmap: WeightsMap, param: str) -> str:
    """The HF module whose `.weight` holds `param` as it is (LoRA's target there)."""
    found = wmap.rule_for_param(param)
    if found is None:
        raise LinnetError(
            f"param {param}: the {wmap.architecture} weights map has no tensor for it"
        )
    rule, values = found
    name = rule.hf_name(values)
    if rule.transforms or rule.split_axis is not None or not name.endswith(".weight"):
        raise LinnetError(
            f"param {param} is stored as {name} ({rule.text}), not one-to-one as a linear's "
            "weight: PEFT cannot hold a LoRA adapter for it"
        )
    return name[: -len(".weight")]


def peft_config(spec: LoraSpec, modules: list[str], base: str) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": spec.r,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }


def save_adapter(
    folder, adapters: dict, spec: LoraSpec, targets: list[str], wmap: WeightsMap, base: str = ""
) -> Path:
    """Write `adapters` (source names: `layers.0.wq_lora_a`, ...) as a PEFT adapter folder."""
    from safetensors.torch import save_file

    tensors, modules = {}, []
    for t in targets:
        module = hf_module(wmap, t)
        modules.append(module)
        a_name, b_name = lora_names(t)
        tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = adapters[a_name].detach().contiguous()
        tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = adapters[b_name].detach().contiguous()
    with atomic_path(folder, is_dir=True, overwrite=True) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        config = peft_config(spec, modules, base)
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return Path(folder)


def _read_spec(folder: Path) -> tuple[LoraSpec, list[str]]:
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
        modules = config["target_modules"]
        spec = LoraSpec(tuple(modules), int(config["r"]), float(config["lora_alpha"]))
        spec = LoraSpec(spec.targets, spec.r, spec.alpha, float(config.get("lora_dropout", 0.0)))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LinnetError(f"{path}: not a readable PEFT LoRA config ({err})") from err
    if config.get("use_dora") or config.get("use_rslora"):
        raise LinnetError(f"{path}: DoRA and rsLoRA adapters are not supported")
    return spec, modules


def load_adapter(folder, wmap: WeightsMap, params) -> tuple[dict, LoraSpec, list[str]]:
    """A PEFT LoRA folder as (adapters by source name, its spec with source-name targets,
    the target params). `params`: the source's param names."""
    from safetensors.torch import load_file

    folder = Path(folder)
    spec, _ = _read_spec(folder)
    tensors = load_file(str(folder / WEIGHTS_FILE))
    by_module = {hf_module(wmap, p): p for p in params if _one_to_one(wmap, p)}
    adapters, targets = {}, []
    for key, tensor in tensors.items():
        module, _, kind = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        param = by_module.get(module)
        if param is None or kind not in ("A.weight", "B.weight"):
            raise LinnetError(f"{folder / WEIGHTS_FILE}: tensor {key} names no linear of the model")
        a_name, b_name = lora_names(param)
        adapters[a_name if kind == "A.weight" else b_name] = tensor
        if param not in targets:
            targets.append(param)
    spec = LoraSpec(tuple(targets), spec.r, spec.alpha, spec.dropout)
    return adapters, spec, targets


def _one_to_one(wmap: WeightsMap, param: str) -> bool:
    try:
        hf_module(wmap, param)
    except LinnetError:
        return False
    return True


def merge_lora(params: dict, adapters: dict, targets: list[str], scale: float) -> dict:
    """Base params with each target's `scale * B @ A` added (as PEFT's merge), in f32."""
    merged = dict(params)
    for t in targets:
        a_name, b_name = lora_names(t)
        delta = (adapters[b_name].float() @ adapters[a_name].float()) * scale
        merged[t] = (params[t].float() + delta).to(params[t].dtype)
    return merged
