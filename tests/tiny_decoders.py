"""Tiny random decoder checkpoints built by transformers, and transformers' reference.

    from tests.tiny_decoders import build_tiny, probe_ids, reference_logits
    folder = build_tiny("llama", "tied", tmp_path)      # TINY_CONFIGS[("LlamaForCausalLM", "tied")]
    reference_logits(folder, probe_ids(256))

``build_tiny(arch, variant, out_dir)`` builds a small random HF checkpoint (safetensors, f32)
from ``TINY_CONFIGS[(arch, variant)]``: source config fields that the architecture's weights
map writes as config.json (``tiny_config``). Builds are deterministic (fixed seed, own
generator) and the weights are drawn so that logits are well separated: greedy choices never
tie. ``reference_logits`` / ``reference_greedy``: transformers (f32, eager attention).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402


def cache_root() -> Path:
    env = os.environ.get("LINNET_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "linnet"


# --------------------------------------------------------------------------------------------
# Tiny random checkpoints
# --------------------------------------------------------------------------------------------

# Source config fields (zoo/llama.linnet, zoo/gpt2.linnet): the weights map writes the
# config.json (`tiny_config`), as it does for parity CI's scaled-down entries.
_LLAMA = dict(
    vocab=256,
    dim=64,
    ffn=128,
    n_layers=2,
    n_heads=8,
    n_kv=2,
    max_positions=128,
    eps=1e-5,
    rope_scaling="default",
    rope_theta=10000.0,
    tied=False,
)

#: (HF architecture, variant) -> source config fields of the tiny model.
TINY_CONFIGS: dict[tuple[str, str], dict[str, Any]] = {
    # GQA ratio 4 (8 heads, 2 kv heads), head_dim = 64 / 8, untied head, default rope.
    ("LlamaForCausalLM", "base"): dict(_LLAMA),
    # GQA ratio 1: plain multi-head attention.
    ("LlamaForCausalLM", "mha"): dict(_LLAMA, n_heads=4, n_kv=4),
    # Explicit head_dim 32 while hidden / heads = 16.
    ("LlamaForCausalLM", "head_dim"): dict(_LLAMA, n_heads=4, n_kv=2, head_dim=32),
    # Bias on q, k, v and o (Llama `attention_bias`).
    ("LlamaForCausalLM", "attn_bias"): dict(_LLAMA, attn_bias=True),
    # Bias on gate, up and down (Llama `mlp_bias`).
    ("LlamaForCausalLM", "mlp_bias"): dict(_LLAMA, mlp_bias=True),
    # Llama 3.1 rope scaling. head_dim 16, theta 1e4, original context 32: the 8 frequencies
    # fall in all three regimes (kept, smoothed, divided by 8).
    ("LlamaForCausalLM", "llama3"): dict(
        _LLAMA,
        n_heads=4,
        n_kv=2,
        rope_scaling="llama3",
        rope_factor=8.0,
        rope_low_freq=1.0,
        rope_high_freq=4.0,
        rope_original_max=32,
    ),
    # SmolLM2-like: tied embeddings, 6 heads / 2 kv heads (GQA ratio 3), theta 1e5,
    # hidden 96 (not a power of two), intermediate 96.
    ("LlamaForCausalLM", "tied"): dict(
        _LLAMA, dim=96, ffn=96, n_heads=6, n_kv=2, rope_theta=100000.0, tied=True
    ),
    # Sliding window 8, shorter than the probe sequence (24): the window changes the output.
    ("MistralForCausalLM", "base"): dict(_LLAMA, window=8),
    # Qwen2: bias on q, k, v (none on o); tied like Qwen2.5-0.5B; theta 1e6; vocab 160.
    ("Qwen2ForCausalLM", "base"): dict(
        _LLAMA, vocab=160, rope_theta=1000000.0, tied=True, eps=1e-6
    ),
    # Qwen3: per-head q/k rms norm, explicit head_dim 32 while hidden / heads = 16.
    ("Qwen3ForCausalLM", "base"): dict(
        _LLAMA, n_heads=4, n_kv=2, head_dim=32, rope_theta=1000000.0, eps=1e-6
    ),
    # Phi-3: fused qkv_proj and gate_up_proj, multi-head (like Phi-3-mini), no window.
    ("Phi3ForCausalLM", "base"): dict(_LLAMA, n_heads=8, n_kv=8, window=0),
    # Phi-3 with a sliding window of 8 (transformers honours `sliding_window` for Phi-3; the
    # real Phi-3-mini-4k has 2047) and GQA ratio 4.
    ("Phi3ForCausalLM", "window"): dict(_LLAMA, n_heads=8, n_kv=2, window=8),
    # GPT-2: learned positions (n_positions 128), layer norm with bias, Conv1D, tied head.
    ("GPT2LMHeadModel", "base"): dict(
        vocab=199, n_positions=128, max_positions=128, dim=64, n_layers=2, n_heads=4, eps=1e-5
    ),
}

#: What config edge each variant covers (for test ids and reports).
TINY_EDGES: dict[tuple[str, str], str] = {
    ("LlamaForCausalLM", "base"): "GQA ratio 4 (8 heads, 2 kv), untied head, default rope",
    ("LlamaForCausalLM", "mha"): "GQA ratio 1 (n_kv == n_heads == 4)",
    ("LlamaForCausalLM", "head_dim"): "explicit head_dim 32 != hidden/heads 16",
    ("LlamaForCausalLM", "attn_bias"): "attention_bias=True (q, k, v, o biases)",
    ("LlamaForCausalLM", "mlp_bias"): "mlp_bias=True (gate, up, down biases)",
    ("LlamaForCausalLM", "llama3"): "rope llama3 (factor 8, low 1, high 4, original 32)",
    ("LlamaForCausalLM", "tied"): "tied embeddings, SmolLM2-like, GQA ratio 3, hidden 96",
    ("MistralForCausalLM", "base"): "sliding_window 8 < probe length 24",
    ("Qwen2ForCausalLM", "base"): "q/k/v bias, no o bias, tied, vocab 160",
    ("Qwen3ForCausalLM", "base"): "per-head q/k norm, explicit head_dim 32 != 16",
    ("Phi3ForCausalLM", "base"): "fused qkv_proj / gate_up_proj, MHA, no window",
    ("Phi3ForCausalLM", "window"): "fused projections, sliding_window 8, GQA ratio 4",
    ("GPT2LMHeadModel", "base"): "learned positions (n_positions 128), Conv1D, tied",
}

#: Variants only named tests build (the per-architecture suites iterate TINY_CONFIGS alone):
#: KV heads fewer than ranks for the tensor-parallel tests (4 query heads over one KV head).
SIDE_CONFIGS: dict[tuple[str, str], dict[str, Any]] = {
    ("LlamaForCausalLM", "kv1"): dict(_LLAMA, n_heads=4, n_kv=1),
    # SmolLM2's heads scaled down: 9 heads over 3 KV heads (two ranks split them 2 + 1 KV
    # groups), and an odd ffn (two ranks hold 50 and 49 of its rows).
    ("LlamaForCausalLM", "kv3"): dict(_LLAMA, dim=72, ffn=99, n_heads=9, n_kv=3),
    # Four layers: a device budget below the model's size can stream some of them.
    ("LlamaForCausalLM", "deep"): dict(_LLAMA, n_layers=4),
}
SIDE_EDGES = {
    ("LlamaForCausalLM", "kv1"): "one KV head (fewer than 2 ranks)",
    ("LlamaForCausalLM", "kv3"): "9 heads / 3 KV heads, ffn 99 (uneven over 2 ranks)",
    ("LlamaForCausalLM", "deep"): "four layers (host offload)",
}


def tiny_fields(arch: str, variant: str) -> dict[str, Any]:
    """The source config fields of a tiny variant (TINY_CONFIGS or SIDE_CONFIGS)."""
    arch = canon_arch(arch)
    known = {**TINY_CONFIGS, **SIDE_CONFIGS}
    if (arch, variant) not in known:
        raise KeyError(f"no tiny config for {(arch, variant)}; known: {sorted(known)}")
    return known[(arch, variant)]


ARCH_ALIASES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}

#: The probe every tiny build is checked on: batch 2, 24 tokens (longer than the windows).
PROBE_SHAPE = (2, 24)
#: Greedy steps checked after the probe.
PROBE_NEW_TOKENS = 8
#: Smallest top-1 minus top-2 logit gap a build accepts on the probe and its continuation.
MIN_LOGIT_GAP = 0.05

_BASE_SEED = 1234
_MAX_SEED_TRIES = 20
_W_STD = 0.1  # inner projections
_EMB_STD = 0.25  # token embedding (tied or not): small beside what the blocks add
_HEAD_STD = 1.0  # untied lm_head
_LOGIT_GAIN = 2.0  # final norm scale x head std: logits ~ N(0, 4 * hidden), max |logit| ~ 60-90
_NORM_JITTER = 0.2  # norm weights ~ 1 + N(0, 0.2**2)
_BIAS_STD = 0.1
_MARKER = "linnet_tiny.json"


def tiny_variants() -> list[tuple[str, str]]:
    return list(TINY_CONFIGS)


def canon_arch(arch: str) -> str:
    """HF architecture name for ``arch`` or its alias ("llama" -> "LlamaForCausalLM")."""
    return ARCH_ALIASES.get(arch.lower(), arch)


def probe_ids(vocab_size: int, shape: tuple[int, int] = PROBE_SHAPE, seed: int = 0):
    """Deterministic random token ids [B, S] in [0, vocab_size)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, shape, generator=g, dtype=torch.long)


def greedy_steps(model, steps: int = 3) -> list:
    """A Linnet decoder's logits for the first probe row's prompt, then for `steps` greedy
    one-token steps after it (the cache reset first)."""
    ids = probe_ids(model.hf_config["vocab_size"])[:1]
    model.reset()
    outs = [model.decode(ids, 0)]
    for _ in range(steps):
        outs.append(model.decode(outs[-1].argmax(-1)[:, None], model.position))
    return outs


def logit_gaps(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit along the last axis."""
    top = torch.topk(logits.float(), 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def tiny_config(arch: str, fields: dict[str, Any], kind: str = "decoder"):
    """The transformers config of a tiny `arch` model with these source config fields: the
    architecture's weights map writes it (model_type included), with token ids inside the
    vocab, by the path parity CI's scaled-down entries take (`linnet.zoo.scaled`)."""
    from linnet.zoo.scaled import tiny_hf_config, weights_map_for
    from transformers import AutoConfig

    fields = json.loads(json.dumps(fields))  # deep copy
    hf = tiny_hf_config(weights_map_for(arch), fields, kind)
    return AutoConfig.for_model(hf.pop("model_type"), **hf)


def _config_for(arch: str, variant: str):
    return tiny_config(arch, tiny_fields(arch, variant))


@torch.no_grad()
def _init_weights(model, seed: int) -> None:
    """Redraw every parameter from a private generator: inner weights N(0, 0.1), embedding
    N(0, 0.25), untied head N(0, 1), norm weights 1 + N(0, 0.2), every bias N(0, 0.1)
    (transformers would leave norms at one and biases at zero, which would hide them); then
    scale the final norm so that logits have std ~ 2 * sqrt(hidden) (~16): greedy choices are well
    separated, and that without touching the residual stream.

    The embedding is kept small on purpose: with a tied head and a large embedding, the
    token's own embedding dominates the residual stream, so the model just predicts its
    input token and attention never changes a greedy choice."""
    g = torch.Generator().manual_seed(seed)
    inp = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    base = model.base_model
    final_norm = getattr(base, "norm", None) or getattr(base, "ln_f", None)
    if final_norm is None:
        raise RuntimeError(f"no final norm found in {type(base).__name__}")
    seen: set[int] = set()
    for _, module in model.named_modules():
        is_norm = "norm" in type(module).__name__.lower()
        for p_name, p in module.named_parameters(recurse=False):
            if id(p) in seen:  # a tied parameter, already drawn
                continue
            seen.add(id(p))
            if p is inp:
                new = torch.randn(p.shape, generator=g) * _EMB_STD
            elif p is out:
                new = torch.randn(p.shape, generator=g) * _HEAD_STD
            elif is_norm and p_name == "weight":
                new = 1.0 + torch.randn(p.shape, generator=g) * _NORM_JITTER
            elif p.ndim == 1:
                new = torch.randn(p.shape, generator=g) * _BIAS_STD
            else:
                new = torch.randn(p.shape, generator=g) * _W_STD
            p.copy_(new.to(p.dtype))
    head_std = _EMB_STD if out is inp else _HEAD_STD
    for p in final_norm.parameters():
        p.mul_(_LOGIT_GAIN / head_std)
    if getattr(model.config, "tie_word_embeddings", False):
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


@torch.no_grad()
def _min_probe_gap(model, vocab_size: int) -> tuple[float, torch.Tensor]:
    ids = probe_ids(vocab_size)
    seq = ids
    gaps = []
    logits = model(input_ids=seq).logits
    gaps.append(logit_gaps(logits).min())
    for _ in range(PROBE_NEW_TOKENS):  # plain full-forward greedy continuation
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
        logits = model(input_ids=seq).logits
        gaps.append(logit_gaps(logits[:, -1]).min())
    return float(torch.stack(gaps).min()), seq


def draw_separated(config, label: str):
    """(model, seed, gap): a causal LM of `config` whose weights (`_init_weights`) give a
    top-1/top-2 logit gap of at least ``MIN_LOGIT_GAP`` on ``probe_ids(vocab)`` and its greedy
    continuation; seeds are tried from a fixed one on, deterministically."""
    from transformers import AutoModelForCausalLM

    for attempt in range(_MAX_SEED_TRIES):
        seed = _BASE_SEED + attempt
        torch.manual_seed(seed)  # transformers' own init, overwritten below
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="eager"
        )
        _init_weights(model, seed)
        model.eval()
        gap, _ = _min_probe_gap(model, config.vocab_size)
        if gap >= MIN_LOGIT_GAP:
            return model, seed, gap
    raise RuntimeError(f"{label}: no seed gave a logit gap >= {MIN_LOGIT_GAP}")


def build_tiny(
    arch: str,
    variant: str = "base",
    out_dir: str | os.PathLike | None = None,
    vocab_size: int | None = None,
) -> Path:
    """Build the tiny random checkpoint ``TINY_CONFIGS[(arch, variant)]`` into
    ``out_dir / f"{arch}-{variant}"`` (default ``out_dir``: ``cache_root() / "tiny"``) and
    return that folder. Reuses a complete earlier build. ``arch`` may be an alias ("llama").
    ``vocab_size`` overrides the config's (the folder name then ends in ``-v{vocab_size}``),
    to sit beside a tokenizer of that size.

    The seed starts at a fixed value and moves on (deterministically) until the top-1/top-2
    logit gap is at least ``MIN_LOGIT_GAP`` at every position of ``probe_ids(vocab)`` and of
    its greedy continuation; ``linnet_tiny.json`` in the folder records the seed and the gap.
    """
    arch = canon_arch(arch)
    tiny_fields(arch, variant)  # a KeyError naming the known variants
    out_dir = Path(out_dir) if out_dir is not None else cache_root() / "tiny"
    target = out_dir / (f"{arch}-{variant}" + (f"-v{vocab_size}" if vocab_size else ""))
    marker = target / _MARKER
    if marker.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    config = _config_for(arch, variant)
    config.vocab_size = vocab_size or config.vocab_size
    model, seed, gap = draw_separated(config, f"{arch}/{variant}")

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=out_dir))
    try:
        model.save_pretrained(tmp)
        info = {
            "arch": arch,
            "variant": variant,
            "edge": TINY_EDGES.get((arch, variant)) or SIDE_EDGES[(arch, variant)],
            "seed": seed,
            "min_probe_gap": gap,
            "probe_shape": list(PROBE_SHAPE),
            "probe_new_tokens": PROBE_NEW_TOKENS,
            "build_s": round(time.perf_counter() - t0, 3),
        }
        (tmp / _MARKER).write_text(json.dumps(info, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        try:
            os.rename(tmp, target)
        except OSError:
            if not marker.is_file():  # someone else won the race with an incomplete build
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------------------------
# Reference (transformers)
# --------------------------------------------------------------------------------------------

_REF_CACHE: dict[tuple, Any] = {}


def load_reference(ckpt_dir: str | os.PathLike, device="cpu", dtype=torch.float32):
    """transformers' AutoModelForCausalLM of `ckpt_dir` in `dtype`, eager attention, never
    its own code (trust_remote_code=False), in eval mode on `device` (the GPU checks:
    "cuda"); cached per folder (and config mtime), device and dtype."""
    from transformers import AutoModelForCausalLM

    path = Path(ckpt_dir).resolve()
    key = (str(path), (path / "config.json").stat().st_mtime, str(device), dtype)
    model = _REF_CACHE.get(key)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation="eager", trust_remote_code=False
        )
        model = model.eval().to(device)
        _REF_CACHE[key] = model
    return model


@torch.no_grad()
def reference_logits(ckpt_dir: str | os.PathLike, ids: torch.LongTensor) -> torch.Tensor:
    """f32 logits [B, S, V] of transformers' model for ``ids`` [B, S] (no padding)."""
    model = load_reference(ckpt_dir)
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.ndim == 1:
        ids = ids[None]
    return model(input_ids=ids).logits.float()


@torch.no_grad()
def reference_greedy(
    ckpt_dir: str | os.PathLike,
    ids: torch.LongTensor,
    max_new_tokens: int,
    *,
    stop_at_eos: bool = False,
) -> torch.LongTensor:
    """Greedy continuation by transformers' ``generate(do_sample=False)``: returns [B, S + n]
    (prompt included). By default it runs all ``max_new_tokens`` steps, ignoring EOS."""
    from transformers import GenerationConfig

    model = load_reference(ckpt_dir)
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.ndim == 1:
        ids = ids[None]
    eos = model.generation_config.eos_token_id if stop_at_eos else None
    gen = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        min_new_tokens=None,
        eos_token_id=eos,
        pad_token_id=eos if isinstance(eos, int) else 0,
        bos_token_id=model.generation_config.bos_token_id,
    )
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
