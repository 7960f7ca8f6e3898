"""Tests of the checkpoint builders themselves (tests/checkpoints.py)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402

from tests.checkpoints import (  # noqa: E402
    CHAT_MESSAGES,
    MIN_LOGIT_GAP,
    PROBE_NEW_TOKENS,
    SMOLLM2_DIRNAME,
    TINY_CONFIGS,
    TINY_EDGES,
    build_smollm2,
    build_tiny,
    chat_prompt_ids,
    detach_gguf_quantizer,
    load_reference,
    load_smollm2_gguf,
    logit_gaps,
    probe_ids,
    reference_greedy,
    reference_logits,
)
from tests.smollm2 import build_inputs, build_key  # noqa: E402

VARIANTS = sorted(TINY_CONFIGS)
IDS = [f"{a}-{v}" for a, v in VARIANTS]

L0 = "model.layers.0."

# What each variant claims: config attributes, and tensors (name -> shape, or None: absent).
EXPECTED: dict[tuple[str, str], dict] = {
    ("LlamaForCausalLM", "base"): dict(
        config=dict(
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
        ),
        rope="default",
        tensors={
            "lm_head.weight": (256, 64),
            L0 + "self_attn.k_proj.weight": (16, 64),
            L0 + "self_attn.q_proj.bias": None,
        },
    ),
    ("LlamaForCausalLM", "mha"): dict(
        config=dict(num_attention_heads=4, num_key_value_heads=4, head_dim=16),
        tensors={L0 + "self_attn.k_proj.weight": (64, 64)},
    ),
    ("LlamaForCausalLM", "head_dim"): dict(
        config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
        tensors={
            L0 + "self_attn.q_proj.weight": (128, 64),
            L0 + "self_attn.k_proj.weight": (64, 64),
            L0 + "self_attn.o_proj.weight": (64, 128),
        },
    ),
    ("LlamaForCausalLM", "attn_bias"): dict(
        config=dict(attention_bias=True, mlp_bias=False),
        tensors={
            L0 + "self_attn.q_proj.bias": (64,),
            L0 + "self_attn.k_proj.bias": (16,),
            L0 + "self_attn.v_proj.bias": (16,),
            L0 + "self_attn.o_proj.bias": (64,),
            L0 + "mlp.up_proj.bias": None,
        },
    ),
    ("LlamaForCausalLM", "mlp_bias"): dict(
        config=dict(attention_bias=False, mlp_bias=True),
        tensors={
            L0 + "mlp.gate_proj.bias": (128,),
            L0 + "mlp.up_proj.bias": (128,),
            L0 + "mlp.down_proj.bias": (64,),
            L0 + "self_attn.q_proj.bias": None,
        },
    ),
    ("LlamaForCausalLM", "llama3"): dict(
        config=dict(
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128
        ),
        rope="llama3",
        rope_params=dict(
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
            rope_theta=10000.0,
        ),
        tensors={},
    ),
    ("LlamaForCausalLM", "tied"): dict(
        config=dict(
            hidden_size=96,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=True,
        ),
        tensors={"lm_head.weight": None, "model.embed_tokens.weight": (256, 96)},
    ),
    ("MistralForCausalLM", "base"): dict(
        config=dict(sliding_window=8, num_attention_heads=8, num_key_value_heads=2),
        window=8,
        tensors={"lm_head.weight": (256, 64)},
    ),
    ("Qwen2ForCausalLM", "base"): dict(
        config=dict(tie_word_embeddings=True, vocab_size=160, num_key_value_heads=2),
        tensors={
            L0 + "self_attn.q_proj.bias": (64,),
            L0 + "self_attn.k_proj.bias": (16,),
            L0 + "self_attn.v_proj.bias": (16,),
            L0 + "self_attn.o_proj.bias": None,
            "lm_head.weight": None,
        },
    ),
    ("Qwen3ForCausalLM", "base"): dict(
        config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
        tensors={
            L0 + "self_attn.q_norm.weight": (32,),
            L0 + "self_attn.k_norm.weight": (32,),
            L0 + "self_attn.q_proj.weight": (128, 64),
            L0 + "self_attn.q_proj.bias": None,
        },
    ),
    ("Phi3ForCausalLM", "base"): dict(
        config=dict(sliding_window=None, num_attention_heads=8, num_key_value_heads=8),
        tensors={
            L0 + "self_attn.qkv_proj.weight": (192, 64),
            L0 + "mlp.gate_up_proj.weight": (256, 64),
            L0 + "self_attn.q_proj.weight": None,
        },
    ),
    ("Phi3ForCausalLM", "window"): dict(
        config=dict(sliding_window=8, num_attention_heads=8, num_key_value_heads=2),
        window=8,
        tensors={
            L0 + "self_attn.qkv_proj.weight": (96, 64),
            L0 + "mlp.gate_up_proj.weight": (256, 64),
        },
    ),
    ("GPT2LMHeadModel", "base"): dict(
        config=dict(n_positions=128, n_embd=64, n_layer=2, n_head=4, tie_word_embeddings=True),
        tensors={
            "transformer.wpe.weight": (128, 64),
            "transformer.wte.weight": (199, 64),
            "transformer.h.0.attn.c_attn.weight": (64, 192),
            "lm_head.weight": None,
        },
    ),
}


def _tensors(path):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_every_variant_is_described():
    assert set(EXPECTED) == set(TINY_CONFIGS) == set(TINY_EDGES)
    archs = {a for a, _ in TINY_CONFIGS}
    assert archs == {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Phi3ForCausalLM",
        "GPT2LMHeadModel",
    }


def test_unknown_variant_raises(tmp_path):
    with pytest.raises(KeyError):
        build_tiny("llama", "nope", tmp_path)


@pytest.mark.parametrize("key", VARIANTS, ids=IDS)
def test_tiny_config_edges(tiny_checkpoint, key):
    from transformers import AutoConfig

    arch, variant = key
    path = tiny_checkpoint(arch, variant)
    want = EXPECTED[key]
    cfg = AutoConfig.from_pretrained(path, trust_remote_code=False)
    assert cfg.architectures == [arch]
    for name, value in want["config"].items():
        assert getattr(cfg, name) == value, name
    raw = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in raw
    if "rope" in want:
        assert cfg.rope_parameters["rope_type"] == want["rope"]
    for name, value in want.get("rope_params", {}).items():
        assert cfg.rope_parameters[name] == value, name
    info = json.loads((path / "linnet_tiny.json").read_text())
    assert info["arch"] == arch and info["variant"] == variant


@pytest.mark.parametrize("key", VARIANTS, ids=IDS)
def test_tiny_tensors(tiny_checkpoint, key):
    arch, variant = key
    tensors = _tensors(tiny_checkpoint(arch, variant))
    assert all(t.dtype == torch.float32 for t in tensors.values())
    for name, shape in EXPECTED[key]["tensors"].items():
        if shape is None:
            assert name not in tensors, name
        else:
            assert name in tensors, name
            assert tuple(tensors[name].shape) == shape, name
    # Biases and norm weights are drawn, not left at transformers' zeros and ones.
    for name, t in tensors.items():
        if name.endswith(".bias") and t.ndim == 1:
            assert t.abs().min() > 0 and t.std() > 0.01, name
        if "norm" in name or ".ln_" in name:
            assert not torch.allclose(t, torch.ones_like(t)), name


@pytest.mark.parametrize("key", VARIANTS, ids=IDS)
def test_tiny_reloads_with_separated_greedy_logits(tiny_checkpoint, key):
    """Every probe position, and every step of its greedy continuation, has a clear top-1.
    transformers' generate() agrees with a plain full-forward greedy loop."""
    path = tiny_checkpoint(*key)
    model = load_reference(path)
    assert model.config._attn_implementation == "eager"
    assert not getattr(model, "is_quantized", False)
    vocab = model.config.vocab_size
    ids = probe_ids(vocab)
    logits = reference_logits(path, ids)
    assert logits.dtype == torch.float32 and logits.shape == (*ids.shape, vocab)
    assert logit_gaps(logits).min() >= MIN_LOGIT_GAP

    seq = ids
    for _ in range(PROBE_NEW_TOKENS):
        last = reference_logits(path, seq)[:, -1]
        assert logit_gaps(last).min() >= MIN_LOGIT_GAP
        seq = torch.cat([seq, last.argmax(-1, keepdim=True)], dim=1)
    got = reference_greedy(path, ids, PROBE_NEW_TOKENS)
    assert torch.equal(got, seq)

    # Other random prompts: no near-ties either (the ~1e-3 a parity check could trip on).
    for seed in (1, 2, 3):
        other = probe_ids(vocab, seed=seed)
        assert logit_gaps(reference_logits(path, other)).min() > 1e-3, seed


@pytest.mark.parametrize("key", VARIANTS, ids=IDS)
def test_tiny_greedy_depends_on_context(tiny_checkpoint, key):
    """Guards against a degenerate draw (e.g. a large tied embedding: the model then just
    repeats its input token and attention never changes a greedy choice)."""
    path = tiny_checkpoint(*key)
    vocab = load_reference(path).config.vocab_size
    ids = probe_ids(vocab)
    full = reference_logits(path, ids).argmax(-1)
    alone = reference_logits(path, ids.reshape(-1, 1)).argmax(-1).reshape(ids.shape)
    assert (full != alone).float().mean() >= 0.5
    assert (full == ids).float().mean() <= 0.5


@pytest.mark.parametrize(
    "key",
    [k for k in VARIANTS if "window" in EXPECTED[k]],
    ids=[i for k, i in zip(VARIANTS, IDS) if "window" in EXPECTED[k]],
)
def test_tiny_sliding_window_matters(tiny_checkpoint, key):
    from transformers import AutoModelForCausalLM

    path = tiny_checkpoint(*key)
    w = EXPECTED[key]["window"]
    vocab = load_reference(path).config.vocab_size
    ids = probe_ids(vocab)
    assert ids.shape[1] > w
    windowed = reference_logits(path, ids)
    full = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.float32,
        attn_implementation="eager",
        sliding_window=None,
        trust_remote_code=False,
    ).eval()
    assert full.config.sliding_window is None
    with torch.no_grad():
        unwindowed = full(input_ids=ids).logits
    # Position i sees keys i-w+1 .. i: the first w positions are unaffected, later ones are.
    torch.testing.assert_close(windowed[:, :w], unwindowed[:, :w], rtol=0, atol=1e-4)
    assert (windowed[:, w:] - unwindowed[:, w:]).abs().amax(dim=-1).min() > 1e-2


def test_tiny_llama3_rope_changes_frequencies(tiny_checkpoint):
    from transformers import AutoModelForCausalLM

    path = tiny_checkpoint("LlamaForCausalLM", "llama3")
    model = load_reference(path)
    cfg = model.config
    dim = cfg.head_dim
    theta = cfg.rope_parameters["rope_theta"]
    plain = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    scaled = model.model.rotary_emb.inv_freq.float()
    ratio = plain / scaled
    kept = torch.isclose(ratio, torch.tensor(1.0))
    divided = torch.isclose(ratio, torch.tensor(8.0))
    smoothed = ~kept & ~divided
    # All three llama3 regimes occur at these sizes.
    assert kept.any() and divided.any() and smoothed.any(), ratio

    ids = probe_ids(cfg.vocab_size)
    default = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.float32,
        attn_implementation="eager",
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        trust_remote_code=False,
    ).eval()
    with torch.no_grad():
        other = default(input_ids=ids).logits
    assert (reference_logits(path, ids) - other).abs().max() > 0.1


def test_tiny_tied_reloads_tied(tiny_checkpoint):
    for arch, variant in [("llama", "tied"), ("qwen2", "base"), ("gpt2", "base")]:
        model = load_reference(tiny_checkpoint(arch, variant))
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    model = load_reference(tiny_checkpoint("llama", "base"))
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight


@pytest.mark.parametrize(
    "key",
    [("LlamaForCausalLM", "base"), ("Phi3ForCausalLM", "window"), ("GPT2LMHeadModel", "base")],
    ids=["llama", "phi3", "gpt2"],
)
def test_tiny_build_is_deterministic_and_reused(tmp_path, key):
    a = build_tiny(*key, out_dir=tmp_path / "a")
    b = build_tiny(*key, out_dir=tmp_path / "b")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "config.json").read_text() == (b / "config.json").read_text()
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    assert build_tiny(*key, out_dir=tmp_path / "a") == a
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "a").iterdir()] == [a.name]  # no temp leftovers


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (slow: marked through the fixtures)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_gguf():
    return load_smollm2_gguf()


def test_smollm2_checkpoint_is_plain_f32(smollm2_checkpoint):
    from transformers import AutoTokenizer

    path = smollm2_checkpoint
    assert (path / "linnet_build.json").is_file()
    cfg = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["tie_word_embeddings"] is True
    assert (
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["vocab_size"],
    ) == (576, 30, 9, 3, 49152)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert "lm_head.weight" not in keys
        assert len(keys) == 2 + 30 * 9
        assert {f.get_slice(k).get_dtype() for k in keys} == {"F32"}
    model = load_reference(path)
    assert getattr(model, "hf_quantizer", None) is None
    assert not getattr(model, "is_quantized", False)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    assert "<|im_start|>" in tok.chat_template


def test_smollm2_matches_gguf_loaded(smollm2_checkpoint, smollm2_gguf, chat_prompts):
    model, gguf_tok = smollm2_gguf
    # The GGUF-loaded model cannot be saved as it is ...
    if getattr(model, "hf_quantizer", None) is not None:
        with pytest.raises(ValueError, match="not serializable"):
            model.save_pretrained("/nonexistent/never-written")
    # ... the saved checkpoint gives the same logits, and the same chat-templated ids.
    assert [t.tolist() for t in chat_prompt_ids(gguf_tok)] == [t.tolist() for t in chat_prompts]
    for ids in chat_prompts:
        with torch.no_grad():
            want = model(input_ids=ids).logits
        got = reference_logits(smollm2_checkpoint, ids)
        assert (got - want).abs().max() <= 1e-5
    detach_gguf_quantizer(model)
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None


def test_smollm2_chat_prompts_are_robust(smollm2_checkpoint, chat_prompts):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_checkpoint, trust_remote_code=False)
    assert len(chat_prompts) == len(CHAT_MESSAGES) == 3
    for text, ids in zip(CHAT_MESSAGES, chat_prompts):
        assert ids.dtype == torch.long and ids.ndim == 2 and ids.shape[0] == 1
        decoded = tok.decode(ids[0])
        assert text in decoded and decoded.endswith("<|im_start|>assistant\n")
        gap = logit_gaps(reference_logits(smollm2_checkpoint, ids)[0, -1])
        assert gap > 0.05, (text, float(gap))
    out = reference_greedy(smollm2_checkpoint, chat_prompts[0], 12, stop_at_eos=True)
    assert "4" in tok.decode(out[0, chat_prompts[0].shape[1] :])  # "What is 2 plus 2?"


def test_smollm2_first_token_agrees_with_llama_cpp(smollm2_checkpoint, chat_prompts):
    """An independent check of transformers' GGUF conversion (dequantization, q/k permutation):
    llama.cpp on the Q4_1 file itself picks the same first token."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import numpy as np

    from tests.checkpoints import smollm2_gguf_path

    llm = llama_cpp.Llama(
        model_path=str(smollm2_gguf_path()),
        n_ctx=256,
        logits_all=True,
        verbose=False,
        n_threads=torch.get_num_threads(),  # ggml's threads busy-wait against the other worker
    )
    for ids in chat_prompts:
        llm.reset()
        llm.eval(ids[0].tolist())
        theirs = torch.from_numpy(np.array(llm.scores[ids.shape[1] - 1]))
        ours = reference_logits(smollm2_checkpoint, ids)[0, -1]
        assert int(theirs.argmax()) == int(ours.argmax())


class Rebuilt(Exception):
    """Raised by a stand-in for the GGUF load: the build did not reuse the cache."""


def refuse_to_build(monkeypatch) -> None:
    import tests.smollm2

    def load():
        raise Rebuilt

    monkeypatch.setattr(tests.smollm2, "load_smollm2_gguf", load)


def test_smollm2_build_is_reused(smollm2_checkpoint, monkeypatch):
    path = smollm2_checkpoint
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    refuse_to_build(monkeypatch)  # reuse loads nothing
    assert build_smollm2(path.parent) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    recorded = json.loads((path / "linnet_build.json").read_text())
    assert {k: recorded[k] for k in build_inputs()} == build_inputs()


@pytest.mark.parametrize(
    "change",
    ["builder_sha256", "source_sha256", "torch", "transformers", "gguf"],
)
def test_smollm2_cache_is_keyed_by_its_inputs(tmp_path, monkeypatch, change):
    """A folder built from other inputs is never reused: the key (its name) changes."""
    import tests.smollm2

    inputs = build_inputs()
    cached = tmp_path / f"{SMOLLM2_DIRNAME}-{build_key(inputs)}"
    cached.mkdir()
    (cached / "linnet_build.json").write_text(json.dumps(inputs))
    refuse_to_build(monkeypatch)
    assert build_smollm2(tmp_path) == cached  # same inputs: reused, nothing loaded

    changed = json.loads(json.dumps(inputs))
    if change in changed:
        changed[change] = "0" * 64
    else:
        changed["libraries"][change] += "+changed"
    monkeypatch.setattr(tests.smollm2, "build_inputs", lambda: changed)
    with pytest.raises(Rebuilt):
        build_smollm2(tmp_path)
