"""ModernBERT (zoo/modernbert.linnet) against transformers on tiny random checkpoints:
global and local layers, rope thetas per layer kind, GeGLU, padded batches of mixed lengths
compared at the real tokens only (transformers with eager attention).

forward ≤ 1e-4 of transformers in every mode (1e-3 fast), `embed` is mean pooling, the
window and the per-kind theta each change the output (so the parity above checks them),
JAX runs the same source, HF exports round-trip bit for bit, misfit checkpoints fail the plan.
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
    TINY_MODERNBERT_CONFIGS,
    build_tiny_modernbert,
    mean_pooling,
    padded_batch,
    reference_modernbert,
    valid_delta,
)
from tests.converters.test_export_hf import assert_bit_exact

VARIANTS = list(TINY_MODERNBERT_CONFIGS)
F32_TOL = 1e-4
FAST_TOL = 1e-3


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("modernbert")
    return lambda variant, masked_lm=False: build_tiny_modernbert(variant, root, masked_lm)


def _batch():
    """Lengths 12, 7, 1, 9: longer than the local window (6 keys), pad id 0."""
    return padded_batch(128, 0)


@pytest.mark.parametrize(
    "mode,numerics,tol",
    [("interpret", "equivalent", F32_TOL), ("generated", "equivalent", F32_TOL),
     ("generated", "fast", FAST_TOL)],
)  # fmt: skip
@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_matches_transformers_on_a_padded_batch(built, variant, mode, numerics, tol):
    path = built(variant)
    model = lt.load(path, mode=mode, numerics=numerics)
    ids, mask = _batch()
    delta = valid_delta(model.forward(ids, mask), reference_modernbert(path, ids, mask), mask)
    print(f"ModernBertModel/{variant} {mode}/{numerics}: max |Δ| = {delta:.3g}")
    assert delta <= tol, f"max |Δ| {delta:.3g} > {tol}"


def test_padding_does_not_reach_real_tokens(built):
    """A pad query whose local window holds only padding gets a zero row, never NaN."""
    model = lt.load(built("base"))
    ids, mask = _batch()
    batched = model.forward(ids, mask)
    assert torch.isfinite(batched).all()
    for row in range(ids.shape[0]):
        n = int(mask[row].sum())
        alone = model.forward(ids[row : row + 1, :n])
        assert (batched[row, :n] - alone[0]).abs().max().item() <= 1e-5


def test_embed_is_mean_pooling_over_transformers(built):
    path = built("base")
    model = lt.load(path)
    ids, mask = _batch()
    want = mean_pooling(reference_modernbert(path, ids, mask), mask)
    got = model.embed(ids, mask)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got - want).abs().max().item() <= F32_TOL
    assert torch.nn.functional.cosine_similarity(got, want).min().item() >= 0.99999


def _edited(src, dst, **changes):
    """A copy of `src` whose config.json has `changes` (dotted keys reach into dicts)."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        *path, leaf = key.split(".")
        node = config
        for part in path:
            node = node[part]
        if value is None:
            node.pop(leaf)
        else:
            node[leaf] = value
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(
    "changes",
    [
        {"local_attention": 4},  # ±2 instead of ±3
        {"local_attention": 64},  # wider than the batch: local layers would be global
        {"rope_parameters.sliding_attention.rope_theta": 1000.0},  # the global theta
        {"rope_parameters.full_attention.rope_theta": 20.0},  # the local theta
        {"layer_types": None, "global_attn_every_n_layers": 2},  # layer 2 global
    ],
    ids=["narrower-window", "no-window", "local-theta", "global-theta", "layer-kinds"],
)
def test_window_theta_and_layer_kinds_each_change_the_output(built, tmp_path, changes):
    """The parity above would fail on a wrong window, theta or layer pattern: each of these
    misreadings of the config moves the real tokens well past the tolerance."""
    path = built("base")
    ids, mask = _batch()
    want = reference_modernbert(path, ids, mask)
    wrong = lt.load(_edited(path, tmp_path / "wrong", **changes))
    delta = valid_delta(wrong.forward(ids, mask), want, mask)
    assert delta > 100 * F32_TOL, f"{changes}: max |Δ| only {delta:.3g}"


def test_jax_matches_transformers(built):
    import linnet.jax as lj

    path = built("biases")
    model = lj.load(path)
    ids, mask = _batch()
    want = reference_modernbert(path, ids, mask)
    got = torch.from_numpy(np.array(model.forward(ids.numpy(), mask.numpy())))
    assert valid_delta(got, want, mask) <= F32_TOL
    pooled = torch.from_numpy(np.array(model.embed(ids.numpy(), mask.numpy())))
    assert (pooled - mean_pooling(want, mask)).abs().max().item() <= F32_TOL


@pytest.mark.parametrize("masked_lm", [False, True], ids=["model", "masked-lm"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_hf_export_round_trips_bit_exactly(built, tmp_path, variant, masked_lm):
    src = built(variant, masked_lm)
    out = linnet.hf.export(lt.load(src), tmp_path / "out", progress=False)
    assert_bit_exact(src, out)  # the masked-LM head too (the `mlm` entry's params)
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (src / "config.json").read_text()
    )
    ids, mask = _batch()
    assert torch.equal(reference_modernbert(src, ids, mask), reference_modernbert(out, ids, mask))


def test_a_masked_lm_checkpoint_loads_its_encoder(built):
    path = built("base", masked_lm=True)
    model = lt.load(path)
    ids, mask = _batch()
    assert valid_delta(model.forward(ids, mask), reference_modernbert(path, ids, mask), mask) <= (
        F32_TOL
    )


@pytest.mark.parametrize(
    "edit, named",
    [
        ({"num_hidden_layers": 3, "layer_types": None}, "unexpected tensor layers.3."),
        ({"intermediate_size": 40}, "layers.0.mlp.Wi.weight"),
    ],
    ids=["extra-layer", "misshapen-wi"],
)
def test_a_misfit_checkpoint_fails_the_plan_naming_the_tensor(built, tmp_path, edit, named):
    bad = _edited(built("base"), tmp_path / "bad", **edit)
    done = CliRunner().invoke(main, ["plan", str(bad)])
    assert done.exit_code == 1, done.output
    assert named in done.output, done.output


def test_a_first_layer_attn_norm_is_unexpected(built, tmp_path):
    """transformers' layer 0 has no attention norm: a checkpoint with one does not fit."""
    from safetensors.torch import load_file, save_file

    bad = shutil.copytree(built("base"), tmp_path / "bad")
    tensors = load_file(bad / "model.safetensors")
    tensors["layers.0.attn_norm.weight"] = torch.ones(32)
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(linnet.errors.CheckpointError, match="layers.0.attn_norm.weight"):
        lt.load(bad)


def test_layer_types_outside_the_every_n_pattern_are_refused(built, tmp_path):
    kinds = ["full_attention", "full_attention", "sliding_attention", "sliding_attention"]
    bad = _edited(built("base"), tmp_path / "bad", layer_types=kinds)
    with pytest.raises(linnet.errors.ConfigError, match="layer_types"):
        lt.load(bad)
