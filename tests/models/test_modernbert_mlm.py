"""ModernBertForMaskedLM keeps its head (issue 22): the `mlm` entry of zoo/modernbert.linnet
(prediction head, then the decoder tied to the token embedding) against transformers'
masked-LM logits, and every export carries it: an HF export re-loaded by transformers'
AutoModelForMaskedLM gives the original's logits (no head weight left to a random init), and
an ONNX export's `mlm` entry gives transformers' logits under ONNX Runtime.

Tiny random checkpoints (tests/tiny_encoders.py), a padded batch longer than the local
window, compared at the real tokens only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import linnet.hf
import linnet.onnx
import linnet.torch as lt
from linnet.errors import ConfigError, LinnetError
from tests.checkpoints import (
    TINY_MODERNBERT_CONFIGS,
    build_tiny_modernbert,
    padded_batch,
    reference_mlm,
    tiny_config,
    valid_delta,
)
from tests.converters.test_export_hf import assert_bit_exact

F32_TOL = 1e-4
FAST_TOL = 1e-3
# "biases": every bias, tanh gelu; "head": also the head's dense bias and a tanh gelu there
VARIANTS = [*TINY_MODERNBERT_CONFIGS, "head"]


def _build_with_head_bias(root):
    """The "biases" variant as ModernBertForMaskedLM with classifier_bias and a tanh gelu in
    the head (transformers' defaults leave them off)."""
    from transformers import AutoModelForMaskedLM

    from tests.tiny_encoders import _init_encoder

    target = root / "ModernBertForMaskedLM-head"
    if target.is_dir():
        return target
    fields = dict(TINY_MODERNBERT_CONFIGS["biases"], head_bias=True, head_gelu_approx="tanh")
    config = tiny_config("ModernBertForMaskedLM", fields, "encoder")
    assert config.classifier_bias and config.classifier_activation != "gelu"
    model = AutoModelForMaskedLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        _init_encoder(model, 7)
    model.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("modernbert-mlm")

    def get(variant):
        if variant == "head":
            return _build_with_head_bias(root)
        return build_tiny_modernbert(variant, root, masked_lm=True)

    return get


def _batch():
    return padded_batch(128, 0)  # lengths 12, 7, 1, 9; pad id 0


@pytest.mark.parametrize(
    "mode,numerics,tol",
    [("interpret", "equivalent", F32_TOL), ("generated", "fast", FAST_TOL)],
)
@pytest.mark.parametrize("variant", VARIANTS)
def test_mlm_entry_matches_transformers(masked_lm, variant, mode, numerics, tol):
    path = masked_lm(variant)
    model = lt.load(path, mode=mode, numerics=numerics)
    ids, mask = _batch()
    want = reference_mlm(path, ids, mask, check_loaded=True)
    delta = valid_delta(model.run("mlm", ids, mask), want, mask)
    print(f"ModernBertForMaskedLM/{variant} {mode}: mlm max |Δ| {delta:.3g}")
    assert delta <= tol, f"max |Δ| {delta:.3g} > {tol}"


@pytest.mark.parametrize("how", ["path", "model"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_hf_export_keeps_the_head(masked_lm, tmp_path, variant, how):
    src = masked_lm(variant)
    out = linnet.hf.export(src if how == "path" else lt.load(src), tmp_path / "out", progress=False)
    assert_bit_exact(src, out)
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads((src / "config.json").read_text())
    ids, mask = _batch()
    want = reference_mlm(src, ids, mask)
    got = reference_mlm(out, ids, mask, check_loaded=True)
    assert valid_delta(got, want, mask) == 0.0


@pytest.mark.parametrize("variant", VARIANTS)
def test_onnx_export_keeps_the_head(masked_lm, tmp_path, variant):
    src = masked_lm(variant)
    model = linnet.onnx.load(linnet.onnx.export(src, tmp_path / "onnx", progress=False))
    assert model.entries == ["forward", "embed", "mlm"]
    ids, mask = _batch()
    got = torch.from_numpy(np.asarray(model.run("mlm", ids.numpy(), mask.numpy())))
    delta = valid_delta(got, reference_mlm(src, ids, mask), mask)
    assert delta <= F32_TOL, f"ONNX Runtime mlm max |Δ| {delta:.3g}"


def test_a_bare_model_has_no_mlm_entry(tmp_path):
    model = lt.load(build_tiny_modernbert("base", tmp_path))
    ids, mask = _batch()
    with pytest.raises(LinnetError, match="`mlm` exists only `if mlm_head`"):
        model.run("mlm", ids, mask)


def test_an_untied_decoder_is_refused(masked_lm, tmp_path):
    """The source's decoder is the token embedding: a checkpoint whose config unties them
    would lose its own decoder weight, so it is refused, naming the field."""
    import shutil

    bad = shutil.copytree(masked_lm("base"), tmp_path / "untied")
    config = json.loads((bad / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        lt.load(bad)
