"""A scaled-down copy of a zoo entry's config, for parity on tiny random weights.

The copy keeps what decides the code path (architecture, GQA ratio, an explicit head_dim
that differs from hidden / heads, tied head, rope type and its parameters, sliding window,
norm eps) and shrinks the sizes: 2 layers, head_dim 16, vocab 256, 128 positions. A rope
scaling's original context shrinks to 32 so that llama3's three frequency bands all occur;
a sliding window shorter than the context becomes 8, shorter than a parity probe.

Encoders (BERT, RoBERTa) keep their activation, eps, token types and pad id (RoBERTa's
positions count past it); ModernBERT keeps its global layer period (4 layers: global 0 and 3,
local 1 and 2), both rope thetas and eps, with a local window of 6 keys, shorter than a
parity sentence; images (ViT, DINOv2) keep eps, qkv bias, mlp ratio, layer scale,
a grid of 4 x 4 patches; ResNet keeps its layer type, four stages (widths / 16 of ResNet-50's
and ResNet-18's first, at most 2 layers a stage: every stage has a first and, where the real
one does, further layers) and whether stage 0 needs a projection shortcut.
"""

from __future__ import annotations

import copy

MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "GPT2LMHeadModel": "gpt2",
    "BertModel": "bert",
    "BertForMaskedLM": "bert",
    "RobertaModel": "roberta",
    "RobertaForMaskedLM": "roberta",
    "ModernBertModel": "modernbert",
    "ModernBertForMaskedLM": "modernbert",
    "ViTModel": "vit",
    "ViTForImageClassification": "vit",
    "Dinov2Model": "dinov2",
    "ResNetModel": "resnet",
    "ResNetForImageClassification": "resnet",
}
ENCODERS = ("BertModel", "BertForMaskedLM", "RobertaModel", "RobertaForMaskedLM")
MODERNBERTS = ("ModernBertModel", "ModernBertForMaskedLM")
VITS = ("ViTModel", "ViTForImageClassification", "Dinov2Model")
RESNETS = ("ResNetModel", "ResNetForImageClassification")
LABELS = 5  # a classifier's classes
WINDOWED = ("MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM")
VOCAB = 256
POSITIONS = 128
LAYERS = 2
HEAD_DIM = 16
MAX_KV = 2


def scaled_config(entry) -> dict:
    """HF config.json fields (with model_type and architectures) of a tiny model shaped like
    `entry`'s."""
    cfg = entry.config
    arch = entry.architecture
    if arch not in MODEL_TYPES:
        raise ValueError(f"{entry.name}: no tiny config for {arch}")
    if arch in MODERNBERTS:
        return {**_modernbert(cfg), "model_type": MODEL_TYPES[arch], "architectures": [arch]}
    if arch in ENCODERS + VITS + RESNETS:
        small = _encoder(cfg) if arch in ENCODERS else _vit(cfg) if arch in VITS else _resnet(cfg)
        if "num_labels" in cfg:
            small["num_labels"] = LABELS
        return {**small, "model_type": MODEL_TYPES[arch], "architectures": [arch]}
    if arch == "GPT2LMHeadModel":
        out = {
            "n_embd": 4 * HEAD_DIM,
            "n_layer": LAYERS,
            "n_head": 4,
            "n_positions": POSITIONS,
            "layer_norm_epsilon": cfg.get("layer_norm_epsilon", 1e-5),
        }
    else:
        out = _decoder(cfg, arch)
    out.update(
        vocab_size=VOCAB,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
        model_type=MODEL_TYPES[arch],
        architectures=[arch],
    )
    return out


def _decoder(cfg: dict, arch: str) -> dict:
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    ratio = heads // kv
    n_kv = min(kv, MAX_KV) if ratio > 1 else 4  # grouped: up to 2 kv heads; MHA: 4 heads
    n_heads = n_kv * ratio
    hidden = n_heads * HEAD_DIM
    out = {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "max_position_embeddings": POSITIONS,
        "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6),
    }
    explicit = cfg.get("head_dim")
    if explicit and explicit != cfg["hidden_size"] // heads:
        # head_dim is not hidden / heads: keep it so (here twice the implied size).
        out["head_dim"] = 2 * HEAD_DIM
    rope = copy.deepcopy(cfg.get("rope_parameters") or {"rope_type": "default"})
    if "original_max_position_embeddings" in rope:
        rope["original_max_position_embeddings"] = 32
    out["rope_parameters"] = rope
    if "original_max_position_embeddings" in cfg:  # Phi-3
        out["original_max_position_embeddings"] = POSITIONS
    window = cfg.get("sliding_window")
    if window and window < cfg["max_position_embeddings"]:
        out["sliding_window"] = 8
    elif arch in WINDOWED:
        out["sliding_window"] = None  # their config classes default to a window otherwise
    return out


def _encoder(cfg: dict) -> dict:
    pad = cfg.get("pad_token_id", 0)
    return {
        "vocab_size": VOCAB,
        "hidden_size": 4 * HEAD_DIM,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "intermediate_size": 8 * HEAD_DIM,
        "max_position_embeddings": 64 + (pad + 1 if "pad_token_id" in cfg else 0),
        "type_vocab_size": cfg.get("type_vocab_size", 2),
        "layer_norm_eps": cfg.get("layer_norm_eps", 1e-12),
        "hidden_act": cfg.get("hidden_act", "gelu"),
        "pad_token_id": pad,
    }


def _vit(cfg: dict) -> dict:
    patch = cfg.get("patch_size", 16) // 2  # ViT 8, DINOv2 7: a 4 x 4 grid
    out = {
        "hidden_size": 2 * HEAD_DIM,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 2,
        "image_size": 4 * patch,
        "patch_size": patch,
    }
    keep = ("layer_norm_eps", "qkv_bias", "hidden_act", "mlp_ratio", "layerscale_value")
    keep += ("use_swiglu_ffn",)
    out.update({k: cfg[k] for k in keep if k in cfg})
    if "intermediate_size" in cfg:
        out["intermediate_size"] = (
            out["hidden_size"] * cfg["intermediate_size"] // cfg["hidden_size"]
        )
    return out


def _resnet(cfg: dict) -> dict:
    widths = cfg["hidden_sizes"]
    scale = widths[0] // 16
    keep = ("layer_type", "hidden_act", "downsample_in_first_stage")
    return {
        "embedding_size": cfg["embedding_size"] // scale,
        "hidden_sizes": [w // scale for w in widths],
        "depths": [min(d, 2) for d in cfg["depths"]],
        **{k: cfg[k] for k in keep if k in cfg},
    }


def _modernbert(cfg: dict) -> dict:
    every = cfg.get("global_attn_every_n_layers", 3)
    special = dict(pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2)
    keep = ("global_rope_theta", "local_rope_theta", "norm_eps", "hidden_activation")
    return {
        "vocab_size": VOCAB,
        "hidden_size": 4 * HEAD_DIM,
        "num_hidden_layers": every + 1,  # global layers 0 and `every`, local ones between
        "num_attention_heads": 4,
        "intermediate_size": 6 * HEAD_DIM,
        "max_position_embeddings": POSITIONS,
        "global_attn_every_n_layers": every,
        "local_attention": 6,
        **{k: cfg[k] for k in keep if k in cfg},
        **special,
    }
