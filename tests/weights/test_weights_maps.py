"""Every weights map's config translation inverts, and a model exports to HF without its
config.json (the config rebuilt from the map) in a form transformers reloads.

For each map in weights_maps/*.toml: transformers' own config defaults for the map's
model type -> source config -> HF config -> source config gives the same values, and the
rebuilt config.json loads with `AutoConfig.from_pretrained` (trust_remote_code=False).
Then a tiny random checkpoint of each architecture (transformers' defaults, shrunk), loaded
with `linnet.torch.load` and stripped of its HF config, exports with the config made by
`WeightsMap.config_to_hf`, which transformers reloads to the same model.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

from linnet.errors import ConfigError  # noqa: E402
from linnet.weights.maps import (  # noqa: E402
    COMPUTED,
    all_weights_maps,
    find_weights_map,
    load_weights_map,
)
from linnet.weights.maps import loading as maps_loading  # noqa: E402

# transformers' configs; diffusers' (AutoencoderKL): tests/models/test_sd_vae.py
ARCHS = sorted(a for a in all_weights_maps() if find_weights_map(a).config_format == "transformers")


def _reload(hf: dict, folder: Path) -> dict:
    """config.json as transformers reads and saves it back (its derived fields included)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf))
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    return config.to_dict()


def _hf_config(arch: str, **kwargs) -> dict:
    """transformers' config for the map's model type: its defaults, then `kwargs` (its
    derived fields, such as Qwen2's `layer_types`, derived from them)."""
    wmap = find_weights_map(arch)
    hf = transformers.AutoConfig.for_model(wmap.model_type, **kwargs).to_dict()
    hf["architectures"] = [arch]
    return hf


# transformers' defaults leave some computed fields at their trivial value: these
# configs exercise the other direction (a window on every layer, a layer period of 2)
EXTRA_CONFIGS = {
    "Qwen2ForCausalLM": dict(use_sliding_window=True, sliding_window=64, max_window_layers=0),
    "Qwen3ForCausalLM": dict(use_sliding_window=True, sliding_window=64, max_window_layers=0),
    "ModernBertModel": dict(global_attn_every_n_layers=2),
    "Dinov2Model": dict(hidden_size=48, mlp_ratio=3),
    "ResNetForImageClassification": dict(num_labels=7),
}


CASES = [(a, {}) for a in ARCHS] + list(EXTRA_CONFIGS.items())


@pytest.mark.parametrize(
    "arch,kwargs", CASES, ids=[a + ("-extra" if kw else "") for a, kw in CASES]
)
def test_config_round_trips_through_hf(arch, kwargs, tmp_path):
    wmap = find_weights_map(arch)
    hf = _hf_config(arch, **kwargs)
    source = wmap.translate_config(hf)
    rebuilt = wmap.config_to_hf(source)
    assert wmap.translate_config(rebuilt) == source
    reloaded = _reload(rebuilt, tmp_path / "out")
    assert reloaded["model_type"] == wmap.model_type
    assert reloaded["architectures"] == [arch]
    assert wmap.translate_config(reloaded) == source


def test_extra_configs_reach_the_computed_fields():
    """The extra configs above are not no-ops: each gives a non-default computed value."""
    got = {a: find_weights_map(a).translate_config(_hf_config(a)) for a in EXTRA_CONFIGS}
    extra = {
        a: find_weights_map(a).translate_config(_hf_config(a, **c))
        for a, c in EXTRA_CONFIGS.items()
    }
    for arch in EXTRA_CONFIGS:
        assert got[arch] != extra[arch], arch
    assert extra["Qwen2ForCausalLM"]["window"] == 64
    assert extra["Dinov2Model"]["ffn"] == 144


def test_every_computed_field_declares_both_directions():
    for name, rule in COMPUTED.items():
        assert rule.name == name and callable(rule.read) and callable(rule.write)
    with pytest.raises(TypeError, match="read and write"):
        type(COMPUTED["num_labels"])("half", COMPUTED["num_labels"].read, None)


def test_loader_refuses_a_computed_field_without_its_inverse(tmp_path, monkeypatch):
    one_way = types.SimpleNamespace(name="one_way", read=lambda c, f: 1, write=None)
    monkeypatch.setitem(maps_loading.COMPUTED, "one_way", one_way)
    (tmp_path / "m.toml").write_text(
        'architecture = "X"\nsource = "llama"\n[config]\nn = { compute = "one_way" }\n'
    )
    with pytest.raises(ConfigError, match="lacks its read or its write"):
        load_weights_map(tmp_path / "m.toml")


def test_dinov2_ratio_inverts_for_awkward_widths():
    write, read = COMPUTED["mlp_ratio_ffn"].write, COMPUTED["mlp_ratio_ffn"].read
    for hidden in (7, 48, 49, 96, 384, 1000):
        for ffn in range(1, 4 * hidden + 1, 7):
            hf = {"hidden_size": hidden}
            write(hf, ffn)
            assert read(hf, "ffn") == ffn, (hidden, ffn, hf)


# ---------------------------------------------------------------------------------------
# Export without a source config.json, for every map


# Small values for the size keys a config class has (the others keep their defaults).
SHRINK = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    image_size=32,
    patch_size=8,
    embedding_size=8,
    hidden_sizes=[8, 12, 16, 24],
    depths=[1, 1, 1, 1],
    global_attn_every_n_layers=2,
    local_attention=16,
    global_attn_indexes=[1],  # SAM: every 2nd of the 2 layers global, as its source allows
    output_channels=32,  # SAM: the neck's width is the prompt and mask decoder width
    num_pos_feats=16,  # SAM: half the neck's width
    # Whisper (issue 14): the decoder's sizes have keys of their own
    decoder_attention_heads=4,
    decoder_layers=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_source_positions=16,
    max_target_positions=64,
)
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id")


def _tiny_kwargs(arch: str) -> dict:
    """transformers' defaults for the map's model type, shrunk (tiny, random weights)."""
    cls = transformers.CONFIG_MAPPING[find_weights_map(arch).model_type]
    return _shrunk(cls().to_dict(), set(getattr(cls, "attribute_map", {})))


def _shrunk(default: dict, aliases: set) -> dict:
    keys = set(default) | aliases
    out = {k: v for k, v in SHRINK.items() if k in keys}
    for k in TOKEN_IDS:  # special ids past the small vocab: the last ids of it instead
        if isinstance(default.get(k), int) and default[k] >= SHRINK["vocab_size"]:
            out[k] = SHRINK["vocab_size"] - 1 - TOKEN_IDS.index(k)
    for k, sub in default.items():  # SiglipModel's text_config and vision_config: shrunk too
        if isinstance(sub, dict) and "model_type" in sub:
            out[k] = _shrunk(sub, set())
    return out


def _build_tiny(arch: str, folder: Path) -> Path:
    config = transformers.AutoConfig.for_model(
        find_weights_map(arch).model_type, **_tiny_kwargs(arch)
    )
    config.architectures = [arch]
    torch.manual_seed(0)
    model = getattr(transformers, arch)(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # every tensor distinct from its init
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder)
    _add_base_tensors(arch, config, model, folder / "model.safetensors")
    return folder


def _add_base_tensors(arch: str, config, model, file: Path) -> None:
    """A task model built by transformers may lack base-model tensors that hub checkpoints
    of it carry and its map reads (BertForMaskedLM's pooler): add those, as the base has
    them under the task model's prefix."""
    from safetensors.torch import save_file

    from linnet.weights.planning import plan_checkpoint

    missing = {p.tensor for p in plan_checkpoint(file.parent)[0].problems}
    tensors = load_file(file)
    base = transformers.AutoModel.from_config(config)
    prefix = model.base_model_prefix + "."
    extra = {
        prefix + k: v.contiguous() for k, v in base.state_dict().items() if prefix + k in missing
    }
    if extra:
        save_file({**tensors, **extra}, str(file), metadata={"format": "pt"})


@pytest.mark.parametrize("arch", ARCHS)
def test_export_without_source_config(arch, tmp_path):
    import linnet.hf
    import linnet.torch as lt

    src = _build_tiny(arch, tmp_path / "src")
    model = lt.load(src)
    model.hf_config = {}
    out = linnet.hf.export(model, tmp_path / "out", architecture=arch, progress=False)
    got = _reload(json.loads((out / "config.json").read_text()), tmp_path / "reloaded")
    assert got["architectures"] == [arch]
    assert lt.load(out).config == model.config  # the rebuilt config gives the same model
    original = load_file(src / "model.safetensors")
    exported = load_file(out / "model.safetensors")
    assert exported and set(exported) <= set(original)
    for name, t in exported.items():
        assert torch.equal(t, original[name]), name
