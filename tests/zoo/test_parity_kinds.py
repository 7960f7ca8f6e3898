"""The parity gate's kinds whose inputs the gate makes: speech (Whisper), image-text (SigLIP),
image decoders (the SD VAE decoder) and UNets (SDXL's), on parity CI's own tiny random checkpoints
(scripts/parity_ci.py: build_tiny from zoo/scaled.py).

Each passes as built against transformers (diffusers for the VAE), writes a record of its
kind, and fails when one weight is scaled by 1.01, on the outputs that weight feeds (a
decoder-only weight leaves Whisper's encoder output passing). A folder without
generation_config.json or preprocessor_config.json is refused by `linnet parity` with exit 1
and a line naming the file; a local folder is gated as the kind its source has, and a
config.json of an entry's shape is recognised as that entry.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from click.testing import CliRunner
from linnet.zoo import get

import linnet.torch
from linnet.cli import main
from linnet.errors import CheckpointError, LinnetError
from linnet.parity import checkpoint_kind, format_table, run_gate, write_record
from tests.zoo.test_parity_gate import parity_ci, perturb

#: entry -> (kind, the outputs its gate compares)
KINDS = {
    "whisper-tiny": ("speech", ["encode", "first", "greedy"]),
    "whisper-large-v3": ("speech", ["encode", "first", "greedy"]),
    "siglip-base-16-224": ("image-text", ["embed_image", "embed_text", "logits"]),
    "sd-vae-ft-mse": ("image-decoder", ["decode", "encode", "encode_logvar"]),
    "sdxl-base-unet": ("unet", ["forward"]),
    "sam-vit-base": (
        "segmenter",
        ["embed_image", "predict_masks", "predict_iou", "point_masks", "point_iou"]
        + ["box_masks", "box_iou"],
    ),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """name -> parity CI's tiny random checkpoint of that entry (built once)."""
    root, ci, built = tmp_path_factory.mktemp("kinds"), parity_ci(), {}

    def get_folder(name):
        if name not in built:
            built[name] = ci.build_tiny(get(name), root)
        return built[name]

    return get_folder


@pytest.mark.parametrize("name", list(KINDS))
def test_gate_passes_on_parity_cis_tiny_checkpoint_and_writes_a_record(tiny, tmp_path, name):
    kind, outputs = KINDS[name]
    entry = get(name)
    report = run_gate(tiny(name), entry=entry, weights="tiny-random")
    assert report.passed, [f.why for f in report.figures]
    assert report.kind == kind and [f.output for f in report.figures] == outputs
    for f in report.figures:
        assert f.max_abs < 1e-4 and f.rel < 1e-5
        assert f.top1 is None or f.top1 == f.rows == 2
    if kind == "speech":  # the greedy row compared every step, in both rows
        (greedy,) = [f for f in report.figures if f.output == "greedy"]
        assert greedy.tokens == 32 and greedy.top1 == 2
    rec = json.loads(write_record(report, tmp_path).read_text())
    assert rec["kind"] == kind and rec["passed"] and rec["weights"] == "tiny-random"
    assert rec["tolerance"] == {"max_abs": 1e-4, "rel": 1e-5}
    assert [f["output"] for f in rec["figures"]] == outputs
    assert "parity PASS" in format_table(report) and "input: " in format_table(report)


#: (entry, param scaled by 1.01, outputs that must fail, outputs that must pass)
PERTURBED = [
    ("whisper-tiny", "enc.1.w_fc", ["encode", "first", "greedy"], []),
    ("whisper-large-v3", "dec.1.xq", ["first", "greedy"], ["encode"]),
    ("siglip-base-16-224", "text_blocks.1.w_fc", ["embed_text", "logits"], ["embed_image"]),
    ("siglip-base-16-224", "layers.1.w_fc", ["embed_image", "logits"], ["embed_text"]),
    ("sd-vae-ft-mse", "up.1.rest.0.conv1_w", ["decode"], ["encode", "encode_logvar"]),
    ("sd-vae-ft-mse", "down.1.first.0.conv1_w", ["encode", "encode_logvar"], ["decode"]),
    ("sdxl-base-unet", "down.2.attn.1.blocks.1.k2", ["forward"], []),
    ("sdxl-base-unet", "add_w1", ["forward"], []),
    # SAM: the prompt side runs on transformers' image embeddings, so each half fails alone
    ("sam-vit-base", "layers.1.w1", ["embed_image"], KINDS["sam-vit-base"][1][1:]),
    ("sam-vit-base", "dec.1.w1", KINDS["sam-vit-base"][1][1:], ["embed_image"]),
]


@pytest.mark.parametrize("name, param, fail, keep", PERTURBED)
def test_gate_fails_when_one_weight_is_off_by_one_percent(tiny, name, param, fail, keep):
    folder = tiny(name)
    model = linnet.torch.load(folder, dtype="f32")
    perturb(model.params, param, lambda w: w * 1.01)
    report = run_gate(folder, entry=get(name), model=model, weights="tiny-random")
    assert not report.passed and "parity FAIL" in format_table(report)
    verdict = {f.output: f for f in report.figures}
    for out in fail:
        assert not verdict[out].passed and "max|Δ|" in verdict[out].why, out
    for out in keep:
        assert verdict[out].passed, (out, verdict[out].why)


def test_greedy_tokens_that_differ_fail_the_speech_gate(tiny):
    """Token embeddings (tied to the output projection) shifted by one row: the picks move,
    and the greedy row says the tokens differ."""
    folder = tiny("whisper-tiny")
    model = linnet.torch.load(folder, dtype="f32")
    perturb(model.params, "embed", lambda w: w.roll(1, 0))
    report = run_gate(folder, entry=get("whisper-tiny"), model=model, weights="tiny-random")
    (greedy,) = [f for f in report.figures if f.output == "greedy"]
    assert greedy.top1 < greedy.rows and "the greedy tokens' sequence differs in" in greedy.why


@pytest.mark.parametrize(
    "backend, name",
    [
        ("onnx", "siglip-base-16-224"),
        ("onnx", "sd-vae-ft-mse"),
        pytest.param("onnx", "sam-vit-base", marks=pytest.mark.slow),
        pytest.param("onnx", "sdxl-base-unet", marks=pytest.mark.slow),
        pytest.param("jax", "sdxl-base-unet", marks=pytest.mark.slow),
        pytest.param("jax", "siglip-base-16-224", marks=pytest.mark.slow),
        pytest.param("jax", "sd-vae-ft-mse", marks=pytest.mark.slow),
        pytest.param("onnx", "whisper-tiny", marks=pytest.mark.slow),
        pytest.param("jax", "whisper-large-v3", marks=pytest.mark.slow),
    ],
)
def test_gates_on_the_other_backends(tiny, backend, name):
    report = run_gate(tiny(name), entry=get(name), backend=backend, weights="tiny-random")
    assert report.passed and report.backend == backend, [f.why for f in report.figures]
    assert [f.output for f in report.figures] == KINDS[name][1]


@pytest.mark.parametrize(
    "name",
    ["whisper-tiny", "siglip-base-16-224", "sd-vae-ft-mse", "sdxl-base-unet", "sam-vit-base"],
)
def test_a_folder_that_is_no_entry_is_gated_as_its_sources_kind(tiny, name):
    folder = tiny(name)
    assert checkpoint_kind(folder) == KINDS[name][0]
    report = run_gate(folder)  # no entry: the kind's defaults from zoo/entries.toml
    assert report.passed and report.kind == KINDS[name][0] and report.entry is None


def test_made_input_gates_take_no_prompts(tiny):
    with pytest.raises(LinnetError, match="makes its own inputs"):
        run_gate(tiny("sd-vae-ft-mse"), prompts=["a prompt"])


def test_a_vae_folder_diffusers_cannot_load_fails_closed(tiny, tmp_path):
    folder = tiny("sd-vae-ft-mse")
    model = linnet.torch.load(folder, dtype="f32")
    bare = tmp_path / "renamed"  # Linnet reads model.safetensors; diffusers finds no weights
    bare.mkdir()
    shutil.copy(folder / "config.json", bare / "config.json")
    shutil.copy(folder / "diffusion_pytorch_model.safetensors", bare / "model.safetensors")
    with pytest.raises(CheckpointError, match="cannot load the reference"):
        run_gate(bare, entry=get("sd-vae-ft-mse"), model=model)
    wrong = dataclasses.replace(get("sd-vae-ft-mse"), reference="diffusers.NoSuchModel")
    with pytest.raises(CheckpointError, match="no model class of diffusers"):
        run_gate(folder, entry=wrong, model=model)


def parity(*args):
    return CliRunner().invoke(main, ["parity", *args])


def test_parity_cli_gates_a_whisper_checkpoint_by_name_and_by_folder(tiny, tmp_path):
    folder = tiny("whisper-tiny")
    done = parity("whisper-tiny", "--checkpoint", str(folder), "--results", str(tmp_path))
    assert done.exit_code == 0, done.output
    assert "parity PASS: whisper-tiny, torch f32" in done.output
    rec = json.loads((tmp_path / "whisper-tiny.real.torch.f32.json").read_text())
    assert rec["kind"] == "speech" and rec["entry"] == "whisper-tiny" and rec["passed"]
    done = parity(str(folder), "--results", str(tmp_path))  # a folder: its source's kind
    assert done.exit_code == 0 and "matches no zoo entry" in done.output, done.output


@pytest.mark.parametrize("missing", ["preprocessor_config.json", "generation_config.json"])
def test_parity_cli_refuses_a_whisper_folder_without_a_hub_file(tiny, tmp_path, missing):
    copy = tmp_path / "whisper"
    shutil.copytree(tiny("whisper-tiny"), copy)
    (copy / missing).unlink()
    done = parity("whisper-tiny", "--checkpoint", str(copy), "--results", str(tmp_path))
    assert done.exit_code == 1 and "Traceback" not in done.output
    assert f"error: {copy}: no {missing}" in done.output
    assert not list(tmp_path.glob("*.json")), "no record for a gate that did not run"


@pytest.mark.parametrize("name", list(KINDS))
def test_a_folder_of_an_entrys_shape_is_recognised_as_it(tmp_path, name):
    """`linnet parity DIR`: config.json identifies the entry (diffusers' `_class_name`,
    SigLIP's nested towers); another shape is none."""
    from linnet.targets import locate

    entry = get(name)
    arch = {"_class_name": entry.architecture} if name == "sd-vae-ft-mse" else {
        "architectures": [entry.architecture]}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps({**entry.config, **arch}))
    assert locate(tmp_path).entry is entry
    other = json.loads(json.dumps(entry.config))
    if "text_config" in other:
        other["text_config"]["num_hidden_layers"] += 1
    elif "vision_config" in other:  # SAM: its towers are nested, no text tower
        other["vision_config"]["num_hidden_layers"] += 1
    else:
        key = "layers_per_block" if "layers_per_block" in other else "encoder_layers"
        other[key] += 1
    (tmp_path / "config.json").write_text(json.dumps({**other, **arch}))
    assert locate(tmp_path).entry is None


def test_kind_defaults_exist_for_a_folder_that_is_no_entry():
    from linnet.zoo.registry import registry

    for kind, _ in KINDS.values():
        tol = registry().kind_defaults[kind].tolerance("torch", "f32")
        assert tol.max_abs > 0 and tol.rel > 0 and not tol.top5 and not tol.cosine
