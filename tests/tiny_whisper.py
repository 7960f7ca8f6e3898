"""Tiny random Whisper checkpoints (WhisperForConditionalGeneration) built by transformers.

    from tests.tiny_whisper import build_tiny_whisper, whisper_mel
    folder = build_tiny_whisper("tiny", tmp_path)      # WHISPER_CONFIGS["tiny"]: 80 mel bins
    mel = whisper_mel(folder)                          # f32 [2, n_mels, 2 * source positions]

Both configurations keep their real model's structure (tiny: 80 mel bins, whisper-large-v3:
128 and a vocabulary of its own size class) at a small width, with every weight redrawn so
no norm or bias sits at transformers' init. Greedy choices on the probe are well separated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

_SHAPE = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=2,
    encoder_ffn_dim=48,
    decoder_ffn_dim=64,
    max_source_positions=50,  # 100 mel frames: a 1 s window (chunk_length 1)
    max_target_positions=48,
)
#: name -> WhisperConfig fields. Special ids sit inside the vocabulary.
WHISPER_CONFIGS = {
    "tiny": dict(
        _SHAPE,
        num_mel_bins=80,
        vocab_size=96,
        decoder_start_token_id=90,
        pad_token_id=91,
        bos_token_id=91,
        eos_token_id=92,
        begin_suppress_tokens=[93, 92],
    ),  # fmt: skip
    "large-v3": dict(
        _SHAPE,
        num_mel_bins=128,
        vocab_size=112,
        decoder_start_token_id=100,
        pad_token_id=101,
        bos_token_id=101,
        eos_token_id=102,
        begin_suppress_tokens=[103, 102],
    ),  # fmt: skip
}


@torch.no_grad()
def _redraw(model, seed: int) -> None:
    """Weights N(0, 1/sqrt(fan_in)), norm weights 1 + N(0, 0.2), biases N(0, 0.1); the
    encoder's positions stay transformers' sinusoids (what real checkpoints hold)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "embed_positions" in name and "encoder" in name:
            continue
        noise = torch.randn(p.shape, generator=g)
        if "layer_norm" in name and name.endswith("weight"):
            p.copy_(1 + 0.2 * noise)
        elif name.endswith("bias"):
            p.copy_(0.1 * noise)
        elif p.dim() == 1:
            p.copy_(noise)
        else:
            fan_in = p[0].numel()
            p.copy_(noise / fan_in**0.5)


def _rules(name: str) -> dict:
    """generation_config.json fields as the real checkpoints have them, on the tiny vocab:
    three language tokens, both tasks, no-timestamps, suppressed and begin-suppressed ids."""
    start = WHISPER_CONFIGS[name]["decoder_start_token_id"]
    return dict(
        lang_to_id={"<|en|>": start - 6, "<|de|>": start - 5, "<|fr|>": start - 4},
        task_to_id={"translate": start - 3, "transcribe": start - 2},
        no_timestamps_token_id=start - 1,
        suppress_tokens=[1, 2, 15, 31],
        is_multilingual=True,
        max_length=WHISPER_CONFIGS[name]["max_target_positions"],
    )


def build_tiny_whisper(name: str, root: Path, seed: int = 0) -> Path:
    """A random WhisperForConditionalGeneration saved with `save_pretrained` (f32), with
    Whisper's decoding rules in generation_config.json and a preprocessor_config.json whose
    1 s window (chunk_length 1: 100 mel frames) fits the tiny encoder."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    folder = Path(root) / f"whisper-{name}"
    if (folder / "config.json").exists():
        return folder
    config = WhisperConfig(**WHISPER_CONFIGS[name])
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    _redraw(model, seed)
    for key, value in _rules(name).items():
        setattr(model.generation_config, key, value)
    model.generation_config._from_model_config = False  # else loading rebuilds it from config
    model.save_pretrained(folder)
    n_mels = WHISPER_CONFIGS[name]["num_mel_bins"]
    WhisperFeatureExtractor(feature_size=n_mels, chunk_length=1).save_pretrained(folder)
    return folder


def whisper_mel(folder: Path, batch: int = 2, seed: int = 0) -> torch.Tensor:
    """Random log-mel-like features [batch, n_mels, 2 * max_source_positions]."""
    cfg = json.loads((Path(folder) / "config.json").read_text())
    frames = 2 * cfg["max_source_positions"]
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg["num_mel_bins"], frames, generator=g)


def reference_model(folder: Path, rules: bool = True):
    """transformers' model; without `rules`, its generate is the plain greedy loop."""
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, trust_remote_code=False
    ).eval()
    if not rules:
        g = model.generation_config
        g.suppress_tokens = g.begin_suppress_tokens = None
        for key in ("lang_to_id", "task_to_id", "no_timestamps_token_id", "is_multilingual"):
            if hasattr(g, key):
                delattr(g, key)  # as a config without them: generate checks hasattr
    return model


def greedy_reference(folder: Path, name: str, steps: int):
    """transformers' side of the tiny-Whisper comparisons, without generation rules:
    (model, mel [2, ...], prompt [2, 3]: start token then two text tokens, the encoder's
    output, `generate`'s greedy tokens: the prompt and `steps` more)."""
    hf = reference_model(folder, rules=False)
    mel = whisper_mel(folder)
    start = WHISPER_CONFIGS[name]["decoder_start_token_id"]
    prompt = torch.tensor([[start, 4, 5], [start, 6, 7]])
    with torch.no_grad():
        encoder = hf.model.encoder(mel).last_hidden_state
        tokens = hf.generate(
            input_features=mel, decoder_input_ids=prompt, max_new_tokens=steps,
            do_sample=False, eos_token_id=None,
        )  # fmt: skip
    return hf, mel, prompt, encoder, tokens


#: A tiny checkpoint laid out as the real vocabularies are: text, then eos, start, three
#: languages, both tasks, no-timestamps, and timestamp tokens to the end of the vocabulary
#: (40 of them: <|0.00|> to <|0.78|>, a 1 s window holds 0.02 s steps up to 1.00 s).
TIMESTAMP_LAYOUT = dict(text=80, vocab=128)


def build_timestamp_whisper(root: Path, stamp_bias: float, seed: int = 0) -> Path:
    """A tiny WhisperForConditionalGeneration whose timestamp tokens win often enough to
    exercise every timestamp rule: their (tied) embedding rows get `stamp_bias` times the
    mean direction of the decoder's final hidden states, so their logits rise by about
    that much, and a generation_config with max_initial_timestamp_index."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    folder = Path(root) / f"whisper-timestamps-{stamp_bias:g}"
    if (folder / "config.json").exists():
        return folder
    eos, vocab = TIMESTAMP_LAYOUT["text"], TIMESTAMP_LAYOUT["vocab"]
    config = WhisperConfig(**dict(
        _SHAPE, num_mel_bins=80, vocab_size=vocab, decoder_start_token_id=eos + 1,
        pad_token_id=eos, bos_token_id=eos, eos_token_id=eos, begin_suppress_tokens=[eos],
    ))  # fmt: skip
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    _redraw(model, seed)
    begin = eos + 8
    with torch.no_grad():
        rows = model.model.decoder.embed_tokens.weight
        direction = torch.nn.functional.normalize(model.model.decoder.layer_norm.bias, dim=0)
        rows[begin:] += stamp_bias * direction
    g = model.generation_config
    g.lang_to_id = {"<|en|>": eos + 2, "<|de|>": eos + 3, "<|fr|>": eos + 4}
    g.task_to_id = {"translate": eos + 5, "transcribe": eos + 6}
    g.no_timestamps_token_id = eos + 7
    g.suppress_tokens, g.is_multilingual = [1, 2, 15], True
    g.max_initial_timestamp_index = 10
    g.max_length = _SHAPE["max_target_positions"]
    g._from_model_config = False
    model.save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=80, chunk_length=1).save_pretrained(folder)
    return folder
