"""Encoders (zoo/bert.linnet) against transformers on tiny random BertModel and RobertaModel
checkpoints: padded batches of mixed lengths, compared at the real tokens only.

forward is the last hidden state (f32 ≤ 1e-4 of transformers, every mode), padding never
reaches a real token, `embed` is sentence-transformers' mean pooling, `pooler` is
BertModel's pooler_output; JAX runs the same source at parity. HF exports round-trip bit
for bit and transformers reads them back; a checkpoint with an extra layer fails the plan.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import linnet.errors
import linnet.hf
import linnet.torch as lt
from linnet.cli import main
from tests.checkpoints import (
    TINY_ENCODER_CONFIGS,
    build_tiny_encoder,
    encoder_variants,
    mean_pooling,
    padded_batch,
    reference_hidden,
    tiny_config,
    valid_delta,
)
from tests.converters.test_export_hf import assert_bit_exact

VARIANTS = encoder_variants()
IDS = [f"{a}-{v}" for a, v in VARIANTS]
F32_TOL = 1e-4
FAST_TOL = 1e-3


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    return lambda arch, variant: build_tiny_encoder(arch, variant, root)


def _batch(model):
    return padded_batch(model.config["vocab"], model.config["pad_id"])


@pytest.mark.parametrize(
    "mode,numerics,tol",
    [("interpret", "equivalent", F32_TOL), ("generated", "equivalent", F32_TOL),
     ("generated", "fast", FAST_TOL)],
)  # fmt: skip
@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_forward_matches_transformers_on_a_padded_batch(built, arch, variant, mode, numerics, tol):
    path = built(arch, variant)
    model = lt.load(path, mode=mode, numerics=numerics)
    ids, mask = _batch(model)
    want, _ = reference_hidden(path, ids, mask)
    delta = valid_delta(model.forward(ids, mask), want, mask)
    print(f"{arch}/{variant} {mode}/{numerics}: max |Δ| = {delta:.3g}")
    assert delta <= tol, f"max |Δ| {delta:.3g} > {tol}"


@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_padding_does_not_reach_real_tokens(built, arch, variant):
    model = lt.load(built(arch, variant))
    ids, mask = _batch(model)
    batched = model.forward(ids, mask)
    for row in range(ids.shape[0]):  # each sequence alone, unpadded
        n = int(mask[row].sum())
        alone = model.forward(ids[row : row + 1, :n])  # no mask: all valid
        assert (batched[row, :n] - alone[0]).abs().max().item() <= 1e-5
    other = ids.masked_fill(mask == 0, 3)  # other ids at the pads (3 is no pad id here)
    assert model.config["pad_id"] != 3
    changed = model.forward(other, mask)
    assert valid_delta(changed, batched, mask) <= 1e-5


@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_embed_is_mean_pooling_over_transformers(built, arch, variant):
    path = built(arch, variant)
    model = lt.load(path)
    ids, mask = _batch(model)
    want = mean_pooling(reference_hidden(path, ids, mask)[0], mask)
    got = model.embed(ids, mask)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got - want).abs().max().item() <= F32_TOL
    cosine = torch.nn.functional.cosine_similarity(got, want).min().item()
    assert cosine >= 0.99999, cosine
    unit = model.embed(ids, mask, normalize=True)
    torch.testing.assert_close(unit.norm(dim=-1), torch.ones(len(ids)))
    torch.testing.assert_close(unit, torch.nn.functional.normalize(want), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_pooler_matches_transformers(built, arch, variant):
    path = built(arch, variant)
    model = lt.load(path)
    ids, mask = _batch(model)
    got = model.run("pooler", ids, mask)
    assert (got - reference_hidden(path, ids, mask)[1]).abs().max().item() <= F32_TOL


def test_an_encoder_exposes_its_entries_only(built):
    model = lt.load(built("BertModel", "base"))
    # the entries this config has: `mlm` needs mlm_head (test_bert_mlm.py)
    assert model.entries == ["forward", "embed", "pooler"]
    assert hasattr(model, "embed") and not hasattr(model, "decode")
    with pytest.raises(linnet.errors.LinnetError, match="no entry `decode`"):
        model.run("decode", torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(linnet.errors.LinnetError, match="`mlm` exists only `if mlm_head`"):
        model.run("mlm", torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long))


@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_jax_matches_transformers(built, arch, variant):
    import linnet.jax as lj

    path = built(arch, variant)
    model = lj.load(path)
    ids, mask = padded_batch(model.config["vocab"], model.config["pad_id"])
    want, _ = reference_hidden(path, ids, mask)
    got = torch.from_numpy(np.array(model.forward(ids.numpy(), mask.numpy())))
    assert valid_delta(got, want, mask) <= F32_TOL
    pooled = torch.from_numpy(np.array(model.embed(ids.numpy(), mask.numpy())))
    assert (pooled - mean_pooling(want, mask)).abs().max().item() <= F32_TOL


@pytest.mark.parametrize("how", ["path", "model"])
@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_hf_export_round_trips_and_transformers_reads_it(built, tmp_path, arch, variant, how):
    src = built(arch, variant)
    out = linnet.hf.export(src if how == "path" else lt.load(src), tmp_path / "out", progress=False)
    assert_bit_exact(src, out)
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (src / "config.json").read_text()
    )
    ids, mask = padded_batch(128, TINY_ENCODER_CONFIGS[arch, variant]["pad_id"])
    for a, b in zip(reference_hidden(src, ids, mask), reference_hidden(out, ids, mask)):
        assert torch.equal(a, b)


def test_a_checkpoint_with_an_extra_layer_fails_the_plan(built, tmp_path):
    bad = tmp_path / "bert-extra-layer"
    shutil.copytree(built("BertModel", "base"), bad)
    config = json.loads((bad / "config.json").read_text())
    config["num_hidden_layers"] = 1  # the weights hold two layers
    (bad / "config.json").write_text(json.dumps(config))
    done = CliRunner().invoke(main, ["plan", str(bad)])
    assert done.exit_code == 1, done.output
    assert "unexpected tensor encoder.layer.1." in done.output


@pytest.mark.parametrize("arch", ["BertForMaskedLM", "RobertaForMaskedLM"])
def test_a_masked_lm_checkpoint_loads_its_encoder(tmp_path, arch):
    """Task models hold the encoder under `bert.` / `roberta.` (base_prefix); the MLM
    head loads too (tests/models/test_bert_mlm.py).
    The pooler is added as bert-base-uncased and roberta-base (pretraining checkpoints)
    have it: the bert source needs one (a checkpoint without fails the plan, naming it)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForMaskedLM

    base = "BertModel" if arch.startswith("Bert") else "RobertaModel"
    config = tiny_config(arch, TINY_ENCODER_CONFIGS[base, "base"], "encoder")
    torch.manual_seed(0)
    mlm = AutoModelForMaskedLM.from_config(config, attn_implementation="eager").eval()
    mlm.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    prefix = "bert." if base == "BertModel" else "roberta."
    tensors[prefix + "pooler.dense.weight"] = torch.randn(32, 32)
    tensors[prefix + "pooler.dense.bias"] = torch.randn(32)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = lt.load(tmp_path)
    ids, mask = _batch(model)
    with torch.no_grad():
        want = mlm.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert valid_delta(model.forward(ids, mask), want, mask) <= F32_TOL
