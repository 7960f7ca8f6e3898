"""The zoo registry: every entry is listed, ready entries fit their source (the config they
state gives the parameter count they claim), pins, lookups, and the CLI."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from linnet.zoo.registry import (
    PROMPTLESS,
    SHAPE_FIELDS,
    UnknownEntry,
    read_revisions,
    registry,
    write_revision,
)
from linnet.zoo.scaled import POSITIONS, scaled_config

from linnet.cli import main
from linnet.weights.planning import source_for

# The models the project promises, by kind; the zoo may hold more (a new entry needs no
# change here: docs/adding-a-model.md).
DECODERS = """llama-3.1-8b qwen3-8b qwen3-4b mistral-7b-instruct-v0.3 phi-3-mini-4k-instruct
smollm2-1.7b-instruct smollm2-135m-instruct tinyllama-1.1b-chat qwen2.5-0.5b-instruct
gpt2 gpt-oss-20b""".split()
ENCODERS = ["all-minilm-l6-v2", "bert-base-uncased", "roberta-base", "modernbert-base"]
VISION = ["resnet-18", "resnet-50", "vit-base-16-224", "dinov2-base"]
#: kind -> entries of the kinds whose gates make their own inputs (audio, pixels and ids, latents)
MADE_INPUTS = {
    "speech": ["whisper-tiny", "whisper-large-v3"],
    "image-text": ["siglip-base-16-224"],
    "image-decoder": ["sd-vae-ft-mse"],
    "unet": ["sdxl-base-unet"],
    "segmenter": ["sam-vit-base"],
}
PLANNED: list[str] = []
PROMISED = DECODERS + ENCODERS + VISION + sum(MADE_INPUTS.values(), []) + PLANNED

READY = registry().ready()


def test_every_promised_entry_is_listed_with_its_status():
    reg = registry()
    assert set(PROMISED) <= {e.name for e in reg}
    assert {e.name for e in READY} >= set(DECODERS + ENCODERS + VISION)
    assert set(DECODERS) <= {e.name for e in reg.decoders()}
    assert set(ENCODERS) <= {e.name for e in reg.of_kind("encoder")}
    assert set(VISION) <= {e.name for e in reg.of_kind("vision")}
    for kind, names in MADE_INPUTS.items():
        assert set(names) <= {e.name for e in reg.of_kind(kind)}, kind
    assert set(PLANNED) <= {e.name for e in reg.planned()}
    assert all(e.needs for e in reg.planned())
    assert reg.get("llama-3.1-8b-instruct").name == "llama-3.1-8b"


def _source_config(entry):
    manifest = entry.weights_map()
    hf = {**entry.config, "architectures": [entry.architecture]}
    fields = manifest.translate_config(hf)
    source = source_for(manifest)
    fields.update(act="bf16")
    if "max_positions" in source.fields:  # decoders: a small cache
        fields.update(max_positions=64)
    return source, source.config(fields)


@pytest.mark.parametrize("entry", READY, ids=lambda e: e.name)
def test_ready_entry_fits_its_source_and_claims_the_right_size(entry):
    import importlib

    source, config = _source_config(entry)
    layout = source.params(config)
    count = sum(math.prod(d.value for d in t.shape) for t in layout.shapes.values())
    if entry.architecture == "GPT2LMHeadModel":
        count += 1024 * 768 - 64 * 768  # learned positions: the source holds max_positions rows
    claimed = float(entry.params[:-1]) * {"M": 1e6, "B": 1e9}[entry.params[-1]]
    assert abs(count - claimed) / claimed < 0.03, f"{entry.name}: {count:,} params"
    module = importlib.import_module(entry.reference.rpartition(".")[0])  # transformers, diffusers
    assert getattr(module, entry.reference_class).__name__ == entry.reference_class
    assert entry.license and entry.backends == ("torch", "jax", "onnx")
    assert bool(entry.prompts) == (entry.kind not in PROMPTLESS)  # the others make their inputs
    if entry.kind != "decoder":  # measured in f32 on every backend
        for backend in entry.backends:
            tol = entry.tolerance(backend, "f32")
            assert tol.max_abs > 0 and tol.rel > 0 and not tol.top5
            assert 0.9999 <= tol.cosine < 1 if entry.kind == "encoder" else not tol.cosine
        return
    for dtype in ("f32", "bf16"):
        tol = entry.tolerance("torch", dtype)
        assert tol.max_abs > 0 and tol.rel > 0 and 1 <= tol.top5 <= 5


def test_pins_are_full_hashes_of_zoo_repos():
    """zoo/revisions.toml is the project's own record: each pin is a full commit of a repo
    the zoo names."""
    pins = read_revisions()
    assert pins, "no pins"
    for repo, rev in pins.items():
        entry = registry().by_repo(repo)
        assert entry is not None and entry.revision == rev and len(rev) == 40, repo
    for e in registry():
        assert e.revision == pins.get(e.repo)


def test_a_config_is_recognised_as_its_entry_only():
    for e in READY:
        found = registry().match_config({**e.config, "architectures": [e.architecture]})
        assert found is e
    tiny = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64}
    assert registry().match_config(tiny) is None
    assert all(k in SHAPE_FIELDS for k in ("hidden_size", "n_embd"))


@pytest.mark.parametrize("entry", registry().decoders(), ids=lambda e: e.name)
def test_scaled_config_keeps_the_code_path(entry):
    from transformers import AutoConfig

    small = scaled_config(entry)
    cfg = AutoConfig.for_model(small["model_type"], **{k: v for k, v in small.items()
                                                         if k != "model_type"})  # fmt: skip
    assert cfg.vocab_size == 256 and small["tie_word_embeddings"] == bool(
        entry.config.get("tie_word_embeddings")
    )
    big = entry.config
    if "num_attention_heads" in big:
        ratio = big["num_attention_heads"] // big["num_key_value_heads"]
        assert small["num_attention_heads"] // small["num_key_value_heads"] == ratio
        explicit = big.get("head_dim", big["hidden_size"] // big["num_attention_heads"])
        implied = big["hidden_size"] // big["num_attention_heads"]
        small_hd = small.get("head_dim", small["hidden_size"] // small["num_attention_heads"])
        small_implied = small["hidden_size"] // small["num_attention_heads"]
        assert (explicit != implied) == (small_hd != small_implied)
        assert small["rope_parameters"]["rope_type"] == big["rope_parameters"]["rope_type"]
        assert bool(small.get("sliding_window")) == bool(big.get("sliding_window"))


@pytest.mark.parametrize("entry", [e for e in READY if e.kind != "decoder"], ids=lambda e: e.name)
def test_scaled_config_keeps_the_structure(entry):
    """Encoders and vision: what decides the code path survives the scaling."""
    small, big = scaled_config(entry), entry.config
    assert (small.get("architectures") or [small.get("_class_name")]) == [entry.architecture]
    for key in ("layer_norm_eps", "type_vocab_size", "qkv_bias", "hidden_act",
                "mlp_ratio", "layerscale_value", "layer_type", "use_swiglu_ffn",
                "downsample_in_first_stage"):  # fmt: skip
        if key in big:
            assert small[key] == big[key], key
    if entry.architecture.startswith("Roberta"):  # positions count past the pad id
        assert small["pad_token_id"] == big["pad_token_id"]
        assert small["max_position_embeddings"] == POSITIONS + big["pad_token_id"] + 1
    if "image_size" in big:  # a 4 x 4 grid of patches
        assert small["image_size"] == 4 * small["patch_size"]
    if "hidden_sizes" in big:  # four stages; stage 0 projects iff the real one does
        assert len(small["hidden_sizes"]) == len(small["depths"]) == 4
        assert all(d >= min(2, b) for d, b in zip(small["depths"], big["depths"]))
        real_shortcut = big["embedding_size"] != big["hidden_sizes"][0]
        assert (small["embedding_size"] != small["hidden_sizes"][0]) == real_shortcut
    assert ("num_labels" in small) == ("num_labels" in big)
    if "global_attn_every_n_layers" in big:  # ModernBERT: global and local layers both
        every = small["global_attn_every_n_layers"]
        assert every == big["global_attn_every_n_layers"] < small["num_hidden_layers"]
        assert small["local_attention"] < 12  # shorter than parity CI's longest sentence
        for key in ("global_rope_theta", "local_rope_theta", "norm_eps"):
            assert small[key] == big[key]


def test_scaled_configs_of_the_made_input_kinds_fit_their_references():
    """Whisper: mel bins kept, a whole-second window, special ids in the vocab; SigLIP: the
    towers' widths equal (logits need it); the VAE: four blocks, widths the groups divide.
    Each is what transformers or diffusers builds."""
    import diffusers
    from linnet.zoo.scaled import speech_rules
    from transformers import AutoConfig

    for name in MADE_INPUTS["speech"]:
        small, big = scaled_config(registry().get(name)), registry().get(name).config
        assert small["num_mel_bins"] == big["num_mel_bins"] and small["encoder_layers"] == 2
        assert 2 * small["max_source_positions"] * 160 % 16000 == 0  # hop 160 at 16 kHz
        rules = speech_rules()
        ids = [*rules["lang_to_id"].values(), *rules["task_to_id"].values()]
        ids += [rules["no_timestamps_token_id"], small["decoder_start_token_id"]]
        assert all(0 <= i < small["vocab_size"] for i in ids + small["begin_suppress_tokens"])
        AutoConfig.for_model(small.pop("model_type"), **small)
    small = scaled_config(registry().get("siglip-base-16-224"))
    assert small["text_config"]["hidden_size"] == small["vision_config"]["hidden_size"]
    assert small["vision_config"]["image_size"] == 4 * small["vision_config"]["patch_size"]
    small = scaled_config(registry().get("sd-vae-ft-mse"))
    widths = small["block_out_channels"]
    assert len(widths) == 4 and all(w % small["norm_num_groups"] == 0 for w in widths)
    diffusers.AutoencoderKL(**{k: v for k, v in small.items() if not k.startswith("_")})
    small = scaled_config(registry().get("sdxl-base-unet"))  # SDXL's levels, heads of 8
    assert small["down_block_types"][0] == "DownBlock2D" and small["layers_per_block"] == 2
    heads, widths = small["attention_head_dim"], small["block_out_channels"]
    assert [w // h for w, h in zip(widths, heads)] == [8, 8, 8]
    assert all(w % small["norm_num_groups"] == 0 for w in widths)
    diffusers.UNet2DConditionModel(**{k: v for k, v in small.items() if not k.startswith("_")})


def test_unknown_names_suggest_close_ones():
    with pytest.raises(UnknownEntry, match="did you mean qwen3-8b"):
        registry().get("qwen3-8")


def test_write_revision_keeps_comments_and_replaces_a_pin(tmp_path):
    path = tmp_path / "revisions.toml"
    path.write_text('# pins\n"a/b" = "' + "1" * 40 + '"\n')
    write_revision("a/b", "2" * 40, path)
    write_revision("c/d", "3" * 40, path)
    assert path.read_text() == f'# pins\n"a/b" = "{"2" * 40}"\n"c/d" = "{"3" * 40}"\n'
    with pytest.raises(Exception, match="not a full commit hash"):
        write_revision("a/b", "main", path)


# -- the command line -----------------------------------------------------------------------


def test_zoo_list_shows_every_entry_its_status_and_parity(tmp_path):
    record = {"entry": "gpt2", "weights": "tiny-random", "dtype": "f32", "passed": True}
    (tmp_path / "gpt2.tiny.torch.f32.json").write_text(json.dumps(record))
    record = {"entry": "gpt2", "weights": "real", "dtype": "bf16", "passed": False}
    (tmp_path / "gpt2.real.torch.bf16.json").write_text(json.dumps(record))
    done = CliRunner().invoke(main, ["zoo", "list", "--results", str(tmp_path)])
    assert done.exit_code == 0, done.output
    lines = {line.split()[0]: line for line in done.output.splitlines() if line.strip()}
    assert all(e.name in lines for e in registry())
    assert "real: bf16 ✕; tiny: f32 ✓" in lines["gpt2"] and "unpinned" not in lines["gpt2"]
    assert "unpinned" in lines["seed-oss-36b-instruct"]  # no known revision
    assert "a91318be21ae" in lines["smollm2-135m-instruct"]
    for entry in registry().planned():  # none left since SAM became ready (issue 15)
        assert "planned: needs" in lines[entry.name]
    assert lines["whisper-tiny"].split()[1] == "speech" and "planned" not in lines["whisper-tiny"]
    ready, planned = len(READY), len(registry().planned())
    assert f"{ready} ready" in done.output and f"{planned} planned" in done.output
    assert lines["resnet-50"].split()[1] == "vision" and lines["gpt2"].split()[1] == "decoder"
    assert lines["all-minilm-l6-v2"].split()[1] == "encoder"


@pytest.mark.parametrize(
    "name",
    ["smollm2-135m-instruct", "gpt2", "llama-3.1-8b-instruct", "all-minilm-l6-v2", "resnet-18"],
)
def test_zoo_show(name):
    done = CliRunner().invoke(main, ["zoo", "show", name])
    assert done.exit_code == 0, done.output
    for field in ("repo", "revision", "source", "weights map", "reference", "tolerances",
                  "license", "prompts"):  # fmt: skip
        assert f"\n{field}" in "\n" + done.output
    entry = registry().get(name)
    assert entry.repo in done.output and f"zoo/{entry.weights_map().source}.linnet" in done.output


def test_zoo_show_unknown():
    done = CliRunner().invoke(main, ["zoo", "show", "smollm2"])
    assert (
        done.exit_code == 1
        and "did you mean smollm2-135m-instruct or smollm2-1.7b-instruct?" in done.output
    )


def test_an_entry_may_state_its_own_tiny_tolerances():
    """gpt-oss-20b's [tiny.tolerances] replaces the tiny bf16 default for it alone; its f32
    and every other entry keep the defaults."""
    reg = registry()
    moe, dense = reg.get("gpt-oss-20b"), reg.get("llama-3.1-8b")
    own, default = (e.tolerance("torch", "bf16", "tiny-random") for e in (moe, dense))
    assert own != default and own.rel > default.rel
    assert moe.tolerance("torch", "f32", "tiny-random") == dense.tolerance(
        "torch", "f32", "tiny-random"
    )
