"""Tiny random GptOssForCausalLM checkpoints, built by transformers (issue 16).

    from tests.tiny_gpt_oss import build_gpt_oss
    folder = build_gpt_oss("spread", tmp_path)     # or "one_expert"

Source config fields (zoo/gpt_oss.linnet) that weights_maps/gpt_oss.toml writes as config.json:
3 layers (sliding, full, sliding), a window of 4 (shorter than the 24-token probe), 4 heads
over 2 kv heads, 4 experts with 2 per token, YaRN with an original context of 32 so the
16-dim heads' 8 frequencies span the ramp (kept, blended, divided by the factor). Weights
as `tests/tiny_decoders.py` draws them, then the sinks N(0, 1) (large enough to matter) and
the router per variant: "spread" keeps the random router (tokens go to every expert),
"one_expert" zeroes its weight and biases experts 0 and 1 so every token picks those two.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.tiny_decoders import MIN_LOGIT_GAP, _init_weights, _min_probe_gap, tiny_config

ARCH = "GptOssForCausalLM"
GPT_OSS = dict(
    vocab=256,
    dim=64,
    n_layers=3,
    n_heads=4,
    n_kv=2,
    head_dim=16,
    ffn=32,
    n_experts=4,
    top_k=2,
    eps=1e-5,
    rope_scaling="yarn",
    rope_theta=10000.0,
    rope_factor=32.0,
    rope_original_max=32,
    rope_beta_fast=32.0,
    rope_beta_slow=1.0,
    rope_truncate=False,
    window=4,
    full_every=2,
    swiglu_alpha=1.702,
    swiglu_limit=7.0,
    tied=False,
    max_positions=1024,  # factor x original context: transformers warns otherwise
)
VARIANTS = ("spread", "one_expert")
_SEED = 4321


@torch.no_grad()
def _draw(model, seed: int, variant: str) -> None:
    _init_weights(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for layer in model.model.layers:
        sinks = layer.self_attn.sinks
        sinks.copy_(torch.randn(sinks.shape, generator=g))
        if variant == "one_expert":
            router = layer.mlp.router
            router.weight.zero_()
            router.bias.copy_(torch.tensor([3.0, 2.0, -3.0, -4.0]))


def build_gpt_oss(variant: str, out_dir: Path, fields: dict | None = None) -> Path:
    """The tiny checkpoint of `variant` in `out_dir / variant` (built once per folder); the
    seed moves on until greedy choices on the probe are separated (`MIN_LOGIT_GAP`)."""
    from transformers import AutoModelForCausalLM

    target = Path(out_dir) / variant
    if (target / "config.json").is_file():
        return target
    config = tiny_config(ARCH, fields or GPT_OSS)
    for seed in range(_SEED, _SEED + 20):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="eager"
        )
        _draw(model, seed, variant)
        model.eval()
        gap, _ = _min_probe_gap(model, config.vocab_size)
        if gap >= MIN_LOGIT_GAP:
            model.save_pretrained(target)
            (target / "linnet_tiny.json").write_text(json.dumps({"seed": seed, "gap": gap}))
            return target
    raise RuntimeError(f"gpt-oss/{variant}: no seed gave a logit gap >= {MIN_LOGIT_GAP}")


MXFP4_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}
PACKED = ("gate_up_proj", "down_proj")


def to_mxfp4(folder: Path, target: Path) -> Path:
    """A copy of a tiny checkpoint whose expert weights are MXFP4 (`_blocks` and `_scales`,
    quantized by `linnet.weights.mxfp4.quantize`), with gpt-oss-20b's quantization_config:
    the layout openai/gpt-oss-20b ships."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from linnet.weights import mxfp4

    if (target / "config.json").is_file():
        return target
    shutil.copytree(folder, target)
    tensors = load_file(target / "model.safetensors")
    for name in [n for n in tensors if n.rsplit(".", 1)[-1] in PACKED]:
        tensors[name + "_blocks"], tensors[name + "_scales"] = mxfp4.quantize(tensors.pop(name))
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = MXFP4_CONFIG
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return target


def gpt_oss_headers(hf: dict) -> dict[str, tuple[str, list[int]]]:
    """{name: (safetensors dtype, shape)} of a GPT-OSS checkpoint as openai ships it: BF16,
    the experts' projections as MXFP4 `_blocks`/`_scales` pairs."""
    d, v, e = hf["hidden_size"], hf["vocab_size"], hf["num_local_experts"]
    hd, q, kv, f = (
        hf["head_dim"],
        hf["num_attention_heads"],
        hf["num_key_value_heads"],
        hf["intermediate_size"],
    )
    out = {"model.embed_tokens.weight": ("BF16", [v, d]), "lm_head.weight": ("BF16", [v, d])}
    out["model.norm.weight"] = ("BF16", [d])
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes = {
            "input_layernorm.weight": [d], "post_attention_layernorm.weight": [d],
            "self_attn.q_proj.weight": [q * hd, d], "self_attn.q_proj.bias": [q * hd],
            "self_attn.k_proj.weight": [kv * hd, d], "self_attn.k_proj.bias": [kv * hd],
            "self_attn.v_proj.weight": [kv * hd, d], "self_attn.v_proj.bias": [kv * hd],
            "self_attn.o_proj.weight": [d, q * hd], "self_attn.o_proj.bias": [d],
            "self_attn.sinks": [q], "mlp.router.weight": [e, d], "mlp.router.bias": [e],
            "mlp.experts.gate_up_proj_bias": [e, 2 * f], "mlp.experts.down_proj_bias": [e, d],
        }  # fmt: skip
        out.update({p + k: ("BF16", s) for k, s in shapes.items()})
        for name, rows, cols in (("gate_up_proj", 2 * f, d), ("down_proj", d, f)):
            out[p + f"mlp.experts.{name}_blocks"] = ("U8", [e, rows, cols // 32, 16])
            out[p + f"mlp.experts.{name}_scales"] = ("U8", [e, rows, cols // 32])
    return out


def write_header_only(folder: Path, hf: dict) -> Path:
    """A checkpoint folder whose model.safetensors has the header of `gpt_oss_headers(hf)`
    and no data: the file is extended to its full size without writing (sparse), so headers
    check out and nothing but the header takes disk."""
    import struct

    folder.mkdir(parents=True, exist_ok=True)
    sizes = {"BF16": 2, "U8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in sorted(gpt_oss_headers(hf).items()):
        n = sizes[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    (folder / "config.json").write_text(json.dumps(hf))
    return folder
