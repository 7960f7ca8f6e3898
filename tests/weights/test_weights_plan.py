"""Weights maps and load plans against tiny checkpoints written by transformers.

Each architecture gets a small random model (hidden 32, 2 layers, vocab 64) saved
with `save_pretrained`; the params the source expects are computed here by hand
from the translated config (the compiler will produce them for real).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

from linnet.errors import (  # noqa: E402
    CheckpointError,
    ConfigError,
    PickledCheckpoint,
    UnsupportedArchitecture,
)
from linnet.weights.maps import (  # noqa: E402
    find_weights_map,
    load_weights_map,
    maps_dir,
    supported_architectures,
)
from linnet.weights.plan import make_plan  # noqa: E402
from linnet.weights.safetensors_io import Checkpoint, read_header  # noqa: E402

COMMON = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _configs():
    T = transformers
    return {
        "llama": T.LlamaConfig(**COMMON),
        "llama_tied_llama3": T.LlamaConfig(
            **COMMON, tie_word_embeddings=True, rope_parameters=dict(LLAMA3_ROPE)
        ),
        "llama_bias": T.LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True),
        "mistral": T.MistralConfig(**COMMON, sliding_window=16),
        "qwen2": T.Qwen2Config(**COMMON),
        "qwen2_tied": T.Qwen2Config(**COMMON, tie_word_embeddings=True),
        "qwen3": T.Qwen3Config(**COMMON, head_dim=16),
        "phi3": T.Phi3Config(**COMMON, sliding_window=47),
        "gpt2": T.GPT2Config(
            vocab_size=64,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=128,
            bos_token_id=None,
            eos_token_id=None,
        ),
    }


ARCHS = list(_configs())


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """name -> (folder, HF config object) for every tiny checkpoint."""
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name, cfg in _configs().items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        folder = root / name
        model.save_pretrained(folder)
        out[name] = (folder, model.config)
    # The same Llama, sharded.
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_configs()["llama"])
    model.save_pretrained(root / "llama_sharded", max_shard_size="20KB")
    out["llama_sharded"] = (root / "llama_sharded", model.config)
    return out


def copy_of(models, name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(models[name][0], dest)
    return dest


def read_all(folder: Path) -> dict:
    ck = Checkpoint(folder)
    return {n: ck.read(n) for n in ck.headers()}


def bits(t):
    """The raw bits of a float tensor, so comparisons are bit-exact (NaNs, -0.0)."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def rewrite(folder: Path, tensors: dict) -> None:
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )


# ---------------------------------------------------------------------------------------
# The params the sources expect, by hand (zoo/llama.linnet and zoo/gpt2.linnet)


def llama_params(cfg: dict) -> tuple[dict, dict]:
    vocab, dim, n_layers = cfg["vocab"], cfg["dim"], cfg["n_layers"]
    n_heads = cfg["n_heads"]
    n_kv = cfg.get("n_kv", n_heads)
    head_dim = cfg.get("head_dim", dim // n_heads)
    ffn = cfg["ffn"]
    attn_bias = cfg.get("attn_bias", False)
    qkv_bias = cfg.get("qkv_bias", attn_bias)
    qk_norm = cfg.get("qk_norm", False)
    mlp_bias = cfg.get("mlp_bias", False)
    p = {"embed": (vocab, dim)}
    for i in range(n_layers):
        L = f"layers.{i}."
        p[L + "attn_norm"] = (dim,)
        p[L + "wq"] = (n_heads * head_dim, dim)
        p[L + "wk"] = p[L + "wv"] = (n_kv * head_dim, dim)
        if qkv_bias:
            p[L + "bq"] = (n_heads * head_dim,)
            p[L + "bk"] = p[L + "bv"] = (n_kv * head_dim,)
        if qk_norm:
            p[L + "q_norm"] = p[L + "k_norm"] = (head_dim,)
        p[L + "wo"] = (dim, n_heads * head_dim)
        if attn_bias:
            p[L + "bo"] = (dim,)
        p[L + "mlp_norm"] = (dim,)
        p[L + "gate"] = p[L + "up"] = (ffn, dim)
        p[L + "down"] = (dim, ffn)
        if mlp_bias:
            p[L + "b_gate"] = p[L + "b_up"] = (ffn,)
            p[L + "b_down"] = (dim,)
    p["final_norm"] = (dim,)
    p["lm_head"] = (vocab, dim)
    tied = {"lm_head": "embed"} if cfg.get("tied", False) else {}
    return p, tied


def gpt2_params(cfg: dict) -> tuple[dict, dict]:
    vocab, dim, n_layers = cfg["vocab"], cfg["dim"], cfg["n_layers"]
    ffn = cfg.get("ffn", 4 * dim)
    p = {"wte": (vocab, dim), "wpe": (cfg["n_positions"], dim)}
    for i in range(n_layers):
        L = f"layers.{i}."
        for n in ("ln1_w", "ln1_b", "bq", "bk", "bv", "bo", "ln2_w", "ln2_b", "b_proj"):
            p[L + n] = (dim,)
        for n in ("wq", "wk", "wv", "wo"):
            p[L + n] = (dim, dim)
        p[L + "w_fc"] = (ffn, dim)
        p[L + "b_fc"] = (ffn,)
        p[L + "w_proj"] = (dim, ffn)
    p["lnf_w"] = p["lnf_b"] = (dim,)
    return p, {}


def expected_for(folder: Path):
    ck = Checkpoint(folder)
    weights_map = find_weights_map(ck.architecture)
    cfg = weights_map.translate_config(ck.read_config())
    params, tied = (gpt2_params if weights_map.source == "gpt2" else llama_params)(cfg)
    return ck, weights_map, cfg, params, tied


def plan_for(folder: Path, dtype: str = "f32"):
    ck, weights_map, cfg, params, tied = expected_for(folder)
    return make_plan(ck, weights_map, params, tied, dtype, config=cfg)


# ---------------------------------------------------------------------------------------
# Weights maps


def test_every_weights_map_is_one_architecture_transformers_ships():
    """One map per HF architecture (a new variant adds a map, not a line here), each a class
    transformers (or, for a diffusers-format map, diffusers) ships, and each found by its
    name with the source it declares."""
    import diffusers
    import transformers

    assert maps_dir().name == "weights_maps"
    archs = supported_architectures()
    assert len(archs) == len(set(archs)) == len(list(maps_dir().glob("*.toml")))
    library = {"transformers": transformers, "diffusers": diffusers}
    assert [a for a in archs if not hasattr(library[find_weights_map(a).config_format], a)] == []
    assert {"LlamaForCausalLM", "GPT2LMHeadModel", "BertModel", "ViTModel", "ResNetModel"} <= set(
        archs
    )
    sources = {"GPT2": "gpt2", "Bert": "bert", "Robe": "bert", "ViTM": "vit", "ViTF": "vit"}
    sources |= {"Dino": "vit", "Sigl": "vit", "Mode": "modernbert", "ResN": "resnet"}
    sources |= {"Auto": "sd_vae", "SiglipModel": "siglip", "GptO": "gpt_oss", "Whis": "whisper"}
    sources |= {"UNet": "unet", "SamModel": "sam"}
    for arch in archs:
        m = find_weights_map(arch)
        assert m.architecture == arch
        assert m.source == sources.get(arch, sources.get(arch[:4], "llama"))


def test_unsupported_architecture_lists_supported(models, tmp_path):
    folder = copy_of(models, "llama", tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitecture) as e:
        find_weights_map(Checkpoint(folder).architecture)
    assert "FalconForCausalLM" in str(e.value) and "LlamaForCausalLM" in str(e.value)


# ---------------------------------------------------------------------------------------
# Clean plans, loading and round trips


@pytest.mark.parametrize("name", ARCHS + ["llama_sharded"])
def test_plan_is_clean_and_loads(models, name):
    folder, hf_config = models[name]
    plan = plan_for(folder)
    assert plan.problems == []
    plan.check()
    loaded = dict(plan.load(torch.float32))
    _, _, _, params, tied = expected_for(folder)
    assert set(loaded) == set(params) - set(tied)
    for p, t in loaded.items():
        assert tuple(t.shape) == params[p], p
        assert t.dtype == torch.float32 and t.is_contiguous()
    # Loading agrees with the weights map's own from_hf (the transform path of the exporter).
    weights_map = plan.weights_map
    ref = weights_map.from_hf(read_all(folder), params)
    for p, t in loaded.items():
        assert torch.equal(t, ref[p]), p
    # Casting on the way.
    first = next(iter(plan.load("bf16")))
    assert first[1].dtype == torch.bfloat16
    text = plan.format()
    assert plan.architecture in text and "problem" not in text


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_is_bit_exact(models, name, dtype):
    folder, _ = models[name]
    _, weights_map, _, shapes, _ = expected_for(folder)
    tensors = {k: v.to(dtype) for k, v in read_all(folder).items()}
    params = weights_map.from_hf(tensors, shapes)
    assert all(tuple(v.shape) == shapes[k] for k, v in params.items())
    back = weights_map.to_hf(params)
    assert set(back) == {k for k in tensors if not weights_map.is_ignored(k)}
    for k, v in back.items():
        assert v.dtype == tensors[k].dtype and v.shape == tensors[k].shape, k
        assert torch.equal(bits(v), bits(tensors[k])), k
        assert v.is_contiguous()


def test_gpt2_conv1d_is_transposed_then_split(models):
    folder, _ = models["gpt2"]
    ck = Checkpoint(folder)
    plan = plan_for(folder)
    loaded = dict(plan.load(torch.float32))
    c_attn = ck.read("transformer.h.1.attn.c_attn.weight")  # (in, 3 * out)
    assert torch.equal(loaded["layers.1.wq"], c_attn[:, :32].T)
    assert torch.equal(loaded["layers.1.wv"], c_attn[:, 64:].T)
    assert torch.equal(loaded["layers.1.bk"], ck.read("transformer.h.1.attn.c_attn.bias")[32:64])
    assert torch.equal(loaded["layers.0.w_fc"], ck.read("transformer.h.0.mlp.c_fc.weight").T)
    row = next(r for r in plan.rows if r.hf == "transformer.h.0.attn.c_attn.weight")
    assert row.transform == "transpose → split[0]"
    assert row.params == ("layers.0.wq", "layers.0.wk", "layers.0.wv")
    assert "transpose → split[0]" in plan.format()


def test_phi3_fused_projections_split_by_param_shapes(models):
    folder, _ = models["phi3"]
    ck = Checkpoint(folder)
    loaded = dict(plan_for(folder).load(torch.float32))
    qkv = ck.read("model.layers.0.self_attn.qkv_proj.weight")  # q 32 rows, k 16, v 16
    assert torch.equal(loaded["layers.0.wq"], qkv[:32])
    assert torch.equal(loaded["layers.0.wk"], qkv[32:48])
    assert torch.equal(loaded["layers.0.wv"], qkv[48:])
    gate_up = ck.read("model.layers.1.mlp.gate_up_proj.weight")
    assert torch.equal(loaded["layers.1.gate"], gate_up[:64])
    assert torch.equal(loaded["layers.1.up"], gate_up[64:])


def test_gpt2_hub_layout_without_prefix_and_with_buffers(models, tmp_path):
    """The Hub's gpt2 was saved from GPT2Model: no "transformer." and attn.bias buffers."""
    folder = copy_of(models, "gpt2", tmp_path)
    tensors = read_all(folder)
    renamed = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    for i in range(2):
        renamed[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 128, 128, dtype=torch.uint8))
    renamed["lm_head.weight"] = tensors["transformer.wte.weight"].clone()
    rewrite(folder, renamed)
    plan = plan_for(folder)
    assert plan.problems == []
    notes = {r.hf: r.note for r in plan.rows}
    assert notes["h.0.attn.bias"] == "ignored" and notes["lm_head.weight"] == "ignored"
    loaded = dict(plan.load(torch.float32))
    assert torch.equal(loaded["wte"], tensors["transformer.wte.weight"])
    back = plan.weights_map.to_hf(plan.weights_map.from_hf(renamed), prefix=False)
    assert set(back) == {
        k for k in renamed if not k.endswith(".attn.bias") and k != "lm_head.weight"
    }


def test_tied_duplicate_is_accepted_if_shape_matches(models, tmp_path):
    folder = copy_of(models, "llama_tied_llama3", tmp_path)
    tensors = read_all(folder)
    assert "lm_head.weight" not in tensors  # transformers 5 does not save tied copies
    rewrite(folder, {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].clone()})
    plan = plan_for(folder)
    assert plan.problems == []
    row = next(r for r in plan.rows if r.hf == "lm_head.weight")
    assert row.note == "tied duplicate, ignored"
    assert "lm_head" not in dict(plan.load())

    rewrite(folder, {**tensors, "lm_head.weight": torch.zeros(63, 32)})
    plan = plan_for(folder)
    assert len(plan.problems) == 1 and plan.problems[0].tensor == "lm_head.weight"
    assert "[63, 32]" in plan.problems[0] and "[64, 32]" in plan.problems[0]


def test_sharded_checkpoint(models):
    folder, _ = models["llama_sharded"]
    ck = Checkpoint(folder)
    assert len(ck.files) > 1 and ck.index_path is not None
    assert {i.file for i in ck.headers().values()} == set(ck.files)
    single = dict(plan_for(models["llama"][0]).load(torch.float32))
    sharded = dict(plan_for(folder).load(torch.float32))
    assert single.keys() == sharded.keys()
    assert all(torch.equal(single[k], sharded[k]) for k in single)


def test_planning_needs_no_torch(models):
    """Headers, weights maps and plans work in a process where torch cannot be imported."""
    folder, _ = models["phi3"]
    _, _, _, params, tied = expected_for(folder)
    params["layers.0.bo"] = (32,)
    code = f"""
import sys
sys.modules["torch"] = None
from linnet.weights.safetensors_io import Checkpoint
from linnet.weights.maps import find_weights_map
from linnet.weights.plan import make_plan
ck = Checkpoint({str(folder)!r})
m = find_weights_map(ck.architecture)
plan = make_plan(ck, m, {params!r}, {tied!r}, "f32")
assert [p.tensor for p in plan.problems] == ["model.layers.0.self_attn.o_proj.bias"]
print(len(plan.rows))
"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "15"


# ---------------------------------------------------------------------------------------
# Config translation


@pytest.mark.parametrize("name", ARCHS)
def test_config_translation_matches_transformers(models, name):
    folder, hf = models[name]
    cfg = find_weights_map(Checkpoint(folder).architecture).translate_config(
        Checkpoint(folder).read_config()
    )
    assert cfg["vocab"] == hf.vocab_size
    assert cfg["dim"] == hf.hidden_size
    assert cfg["n_layers"] == hf.num_hidden_layers
    assert cfg["n_heads"] == hf.num_attention_heads
    assert cfg["max_positions"] == hf.max_position_embeddings
    assert cfg["act"] == "f32"
    if name == "gpt2":
        assert cfg["eps"] == hf.layer_norm_epsilon and cfg["gelu_approx"] == "tanh"
        assert "ffn" not in cfg  # n_inner null: the source's 4 * dim
        return
    assert cfg["ffn"] == hf.intermediate_size
    assert cfg["eps"] == hf.rms_norm_eps
    assert cfg.get("n_kv", cfg["n_heads"]) == hf.num_key_value_heads
    hf_head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert cfg.get("head_dim", cfg["dim"] // cfg["n_heads"]) == hf_head_dim
    assert cfg["rope_theta"] == hf.rope_parameters["rope_theta"]
    assert cfg["rope_scaling"] == hf.rope_parameters["rope_type"]
    assert cfg["tied"] == hf.tie_word_embeddings
    assert cfg.get("window", 0) == (getattr(hf, "sliding_window", None) or 0)
    assert cfg.get("qkv_bias", cfg.get("attn_bias")) == name.startswith(("qwen2", "llama_bias"))
    assert cfg.get("qk_norm", False) == (name == "qwen3")
    if name == "llama_tied_llama3":
        assert (cfg["rope_factor"], cfg["rope_low_freq"], cfg["rope_high_freq"]) == (8.0, 1.0, 4.0)
        assert cfg["rope_original_max"] == 64 and cfg["rope_theta"] == 500000.0


def test_old_style_llama_config():
    """A transformers 4 config.json: rope_theta and rope_scaling, torch_dtype."""
    old = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    cfg = find_weights_map("LlamaForCausalLM").translate_config(old)
    assert cfg["rope_theta"] == 500000.0 and cfg["rope_scaling"] == "llama3"
    assert cfg["rope_original_max"] == 8192 and cfg["act"] == "bf16"
    old["rope_scaling"] = None
    cfg = find_weights_map("LlamaForCausalLM").translate_config(old)
    assert cfg["rope_scaling"] == "default"
    old["rope_scaling"] = {"type": "linear", "factor": 2.0}
    with pytest.raises(ConfigError, match="linear"):
        find_weights_map("LlamaForCausalLM").translate_config(old)


@pytest.mark.parametrize(
    "arch,config,match",
    [
        ("LlamaForCausalLM", {"rope_parameters": {"rope_type": "yarn"}}, "yarn"),
        ("LlamaForCausalLM", {"hidden_act": "gelu"}, "hidden_act"),
        ("LlamaForCausalLM", {"dtype": "int8"}, "int8"),
        ("Phi3ForCausalLM", {"rope_parameters": {"partial_rotary_factor": 0.5}}, "partial_rot"),
        ("Phi3ForCausalLM", {"rope_scaling": {"type": "longrope"}}, "longrope"),
        ("GPT2LMHeadModel", {"tie_word_embeddings": False}, "tie_word_embeddings"),
        ("GPT2LMHeadModel", {"activation_function": "relu"}, "relu"),
        (
            "Qwen2ForCausalLM",
            {"num_hidden_layers": 4, "use_sliding_window": True, "max_window_layers": 2},
            "layer_types",
        ),
    ],
)
def test_config_the_source_cannot_express_is_an_error(arch, config, match):
    with pytest.raises(ConfigError, match=match):
        find_weights_map(arch).translate_config(config)


def test_window_translation():
    t = lambda arch, c: find_weights_map(arch).translate_config(c).get("window", 0)  # noqa: E731
    assert t("MistralForCausalLM", {"sliding_window": None}) == 0
    assert t("MistralForCausalLM", {}) == 4096  # MistralConfig's default
    assert t("Phi3ForCausalLM", {"sliding_window": 2047}) == 2047
    assert t("Qwen2ForCausalLM", {"use_sliding_window": False, "sliding_window": 4096}) == 0
    assert (
        t("Qwen3ForCausalLM", {"layer_types": ["sliding_attention"] * 2, "sliding_window": 9}) == 9
    )
    assert t("LlamaForCausalLM", {}) == 0
    assert (
        find_weights_map("GPT2LMHeadModel").translate_config({"activation_function": "gelu"})[
            "gelu_approx"
        ]
        == "none"
    )


# ---------------------------------------------------------------------------------------
# Failures: each names the tensor or the file


def test_missing_tensor(models, tmp_path):
    folder = copy_of(models, "llama", tmp_path)
    tensors = read_all(folder)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    rewrite(folder, tensors)
    plan = plan_for(folder)
    assert len(plan.problems) == 1
    assert "missing tensor model.layers.1.mlp.up_proj.weight" in plan.problems[0]
    assert "layers.1.up" in plan.problems[0]
    with pytest.raises(CheckpointError) as e:
        plan.check()
    assert e.value.tensor == "model.layers.1.mlp.up_proj.weight"
    with pytest.raises(CheckpointError):
        next(plan.load())


def test_wrong_shape(models, tmp_path):
    folder = copy_of(models, "qwen3", tmp_path)
    tensors = read_all(folder)
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 32)
    tensors["model.layers.1.self_attn.q_norm.weight"] = torch.zeros(8)
    rewrite(folder, tensors)
    plan = plan_for(folder)
    assert len(plan.problems) == 2
    first = plan.problems[0]
    assert first.tensor == "model.layers.0.self_attn.k_proj.weight"
    assert "[16, 32]" in first and "[32, 32]" in first
    with pytest.raises(CheckpointError, match=r"and 1 more problem") as e:
        plan.check()
    assert e.value.tensor == "model.layers.0.self_attn.k_proj.weight"


def test_wrong_shape_of_a_fused_tensor(models, tmp_path):
    folder = copy_of(models, "gpt2", tmp_path)
    tensors = read_all(folder)
    tensors["transformer.h.1.attn.c_attn.weight"] = torch.zeros(96, 32)  # not transposed
    rewrite(folder, tensors)
    (problem,) = plan_for(folder).problems
    assert problem.tensor == "transformer.h.1.attn.c_attn.weight"
    assert "expected [32, 96]" in problem


def test_extra_tensor(models, tmp_path):
    folder = copy_of(models, "mistral", tmp_path)
    tensors = read_all(folder)
    tensors["model.layers.0.self_attn.rope_scale"] = torch.zeros(4)
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)  # no qkv_bias here
    rewrite(folder, tensors)
    plan = plan_for(folder)
    by_tensor = {p.tensor: p for p in plan.problems}
    assert set(by_tensor) == {
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.rope_scale",
    }
    assert "not list it as ignorable" in by_tensor["model.layers.0.self_attn.rope_scale"]
    assert "layers.0.bq" in by_tensor["model.layers.0.self_attn.q_proj.bias"]


def test_extra_layer(models, tmp_path):
    folder = copy_of(models, "llama", tmp_path)
    tensors = read_all(folder)
    tensors["model.layers.2.input_layernorm.weight"] = torch.ones(32)
    rewrite(folder, tensors)
    (problem,) = plan_for(folder).problems
    assert problem.tensor == "model.layers.2.input_layernorm.weight"


def test_ignorable_tensors_are_accepted(models, tmp_path):
    folder = copy_of(models, "llama", tmp_path)
    tensors = read_all(folder)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    rewrite(folder, tensors)
    plan = plan_for(folder)
    assert plan.problems == []
    assert any(r.note == "ignored" for r in plan.rows)


def test_non_float_dtype(models, tmp_path):
    folder = copy_of(models, "llama", tmp_path)
    tensors = read_all(folder)
    tensors["model.norm.weight"] = torch.ones(32, dtype=torch.int32)
    rewrite(folder, tensors)
    (problem,) = plan_for(folder).problems
    assert problem.tensor == "model.norm.weight" and "I32" in problem


def test_truncated_file(models, tmp_path):
    folder = copy_of(models, "llama", tmp_path)
    f = folder / "model.safetensors"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size - 100)
    ck = Checkpoint(folder)  # finding the files reads no header yet
    with pytest.raises(CheckpointError) as e:
        ck.headers()
    assert "truncated" in str(e.value) and str(f) in str(e.value)
    assert e.value.file == str(f) and e.value.tensor is not None
    assert e.value.tensor in str(e.value)


def test_truncated_header(models, tmp_path):
    folder = copy_of(models, "llama", tmp_path)
    f = folder / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(40)
    with pytest.raises(CheckpointError, match="truncated") as e:
        Checkpoint(folder).headers()
    assert e.value.file == str(f)


def test_corrupt_header_json(tmp_path):
    f = tmp_path / "model.safetensors"
    body = b"{not json}"
    f.write_bytes(struct.pack("<Q", len(body)) + body)
    with pytest.raises(CheckpointError, match="not valid JSON") as e:
        read_header(f)
    assert e.value.file == str(f)


def test_pickled_only_folder_is_refused_unopened(tmp_path, monkeypatch):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04junk that must never be unpickled")

    opened = []

    def guard(real):
        def wrapper(file, *args, **kwargs):
            if str(file).endswith(".bin"):
                opened.append(file)
                raise AssertionError(f"opened {file}")
            return real(file, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(builtins, "open", guard(builtins.open))
    monkeypatch.setattr(io, "open", guard(io.open))
    monkeypatch.setattr(os, "open", guard(os.open))
    monkeypatch.setattr(torch, "load", guard(torch.load))
    with pytest.raises(PickledCheckpoint) as e:
        Checkpoint(folder)
    assert "pytorch_model.bin" in str(e.value) and "never unpickles" in str(e.value)
    assert e.value.file == str(folder / "pytorch_model.bin")
    assert opened == []


def test_missing_folder_and_config(models, tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint folder") as e:
        Checkpoint(tmp_path / "nowhere")
    assert e.value.file == str(tmp_path / "nowhere")
    folder = copy_of(models, "llama", tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json") as e:
        Checkpoint(folder)
    assert e.value.file == str(folder / "config.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        Checkpoint(empty)


def test_index_names_a_tensor_missing_from_its_shard(models, tmp_path):
    folder = copy_of(models, "llama_sharded", tmp_path)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = index["weight_map"]["model.norm.weight"]
    index["weight_map"]["model.layers.0.self_attn.q_proj.bias"] = shard
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="not there") as e:
        Checkpoint(folder).headers()
    assert e.value.tensor == "model.layers.0.self_attn.q_proj.bias"
    assert e.value.file == str(folder / shard)


def test_index_names_a_missing_shard(models, tmp_path):
    folder = copy_of(models, "llama_sharded", tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.norm.weight"]
    (folder / shard).unlink()
    with pytest.raises(CheckpointError, match="missing shard") as e:
        Checkpoint(folder)
    assert e.value.file == str(folder / shard)


def test_read_is_lazy_and_cached(models):
    folder, _ = models["llama_sharded"]
    with Checkpoint(folder) as ck:
        t = ck.read("model.norm.weight")
        assert t.shape == (32,)
        assert len(ck._handles) == 1
        ck.read("model.norm.weight")
        assert len(ck._handles) == 1
        with pytest.raises(CheckpointError, match="no tensor nope"):
            ck.read("nope")


# ---------------------------------------------------------------------------------------
# WeightsMap edge cases


def test_to_hf_needs_every_part_of_a_fused_tensor():
    m = find_weights_map("Phi3ForCausalLM")
    with pytest.raises(CheckpointError, match="layers.0.wv") as e:
        m.to_hf({"layers.0.wq": torch.zeros(4, 2), "layers.0.wk": torch.zeros(2, 2)})
    assert e.value.tensor == "model.layers.0.self_attn.qkv_proj.weight"
    with pytest.raises(CheckpointError, match="no rule") as e:
        m.to_hf({"layers.0.mystery": torch.zeros(1)})
    assert e.value.tensor == "layers.0.mystery"


def test_weights_map_inheritance_and_bad_map(tmp_path):
    (tmp_path / "base.toml").write_text(
        'architecture = "A"\nsource = "s"\n[config]\nx = ["x", 1]\n'
        '[[tensors]]\nhf = "a.{i}.w"\nparam = "l.{i}.w"\n'
    )
    (tmp_path / "child.toml").write_text(
        'architecture = "B"\nbase = "base.toml"\n[config.const]\nx = 5\n'
        '[[tensors]]\nhf = "b.{i}.w"\ntransforms = ["transpose"]\nparam = "l.{i}.w"\n'
    )
    child = load_weights_map(tmp_path / "child.toml")
    assert child.source == "s" and child.translate_config({"x": 2}) == {"x": 5}
    assert [r.hf for r in child.rules] == ["b.{i}.w"]
    assert find_weights_map("B", tmp_path).architecture == "B"
    (tmp_path / "bad.toml").write_text('architecture = "C"\nsource = "s"\ntypo = 1\n')
    with pytest.raises(ConfigError, match="typo"):
        load_weights_map(tmp_path / "bad.toml")
