"""BertForMaskedLM and RobertaForMaskedLM keep their head (issue 22): the `mlm` entry of
zoo/bert.linnet (BERT's cls.predictions, RoBERTa's lm_head: dense, gelu, layer norm, then
the decoder tied to the word embedding plus its bias) against transformers' masked-LM
logits on every backend that runs encoders, and an HF export re-loaded by transformers'
AutoModelForMaskedLM holds every head weight (none left to a random init) and gives the
original's logits.

Tiny random checkpoints built by transformers (tests/tiny_encoders.py's configs and init),
a padded batch of mixed lengths, compared at the real tokens only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import linnet.hf
import linnet.torch as lt
from linnet.errors import ConfigError, LinnetError
from tests.checkpoints import (
    TINY_ENCODER_CONFIGS,
    padded_batch,
    reference_mlm,
    tiny_config,
    valid_delta,
)
from tests.converters.test_export_hf import assert_bit_exact

F32_TOL = 1e-4
# (architecture, variant) -> source config fields. "gelu_tanh": hidden_act gelu_new, which
# BERT's head follows and RoBERTa's does not (transformers hard-codes an erf gelu there).
MLM_CONFIGS = {
    ("BertForMaskedLM", "base"): TINY_ENCODER_CONFIGS["BertModel", "base"],
    ("BertForMaskedLM", "gelu_tanh"): TINY_ENCODER_CONFIGS["BertModel", "gelu_tanh"],
    ("RobertaForMaskedLM", "base"): TINY_ENCODER_CONFIGS["RobertaModel", "base"],
    ("RobertaForMaskedLM", "gelu_tanh"): dict(
        TINY_ENCODER_CONFIGS["RobertaModel", "base"], gelu_approx="tanh"
    ),
}
VARIANTS = list(MLM_CONFIGS)
IDS = [f"{a}-{v}" for a, v in VARIANTS]
_SEED = 11


def _add_pooler(model, folder: Path, seed: int) -> None:
    """transformers' *ForMaskedLM has no pooler, but the hub's pretraining checkpoints
    (bert-base-uncased, roberta-base) carry one and the bert source reads it: add it."""
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    tensors = load_file(file)
    g = torch.Generator().manual_seed(seed)
    dim = model.config.hidden_size
    prefix = model.base_model_prefix + ".pooler.dense."
    tensors[prefix + "weight"] = 0.2 * torch.randn(dim, dim, generator=g)
    tensors[prefix + "bias"] = 0.1 * torch.randn(dim, generator=g)
    save_file(tensors, file, metadata={"format": "pt"})


def build_tiny_masked_lm(arch: str, variant: str, out_dir: Path, pooler: bool = True) -> Path:
    """``MLM_CONFIGS[arch, variant]`` as an f32 *ForMaskedLM checkpoint (tied decoder, as
    transformers saves it: no decoder tensors) plus a pooler unless `pooler` is false (a
    fine-tuned checkpoint as transformers saves it), in ``out_dir``."""
    from transformers import AutoModelForMaskedLM

    from tests.tiny_encoders import _init_encoder

    target = out_dir / f"{arch}-{variant}{'' if pooler else '-nopooler'}"
    if (target / "config.json").is_file():
        return target
    config = tiny_config(arch, MLM_CONFIGS[arch, variant], "encoder")
    model = AutoModelForMaskedLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    _init_encoder(model, _SEED)  # the head's norm and biases too
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=out_dir))
    model.save_pretrained(tmp)
    if pooler:
        _add_pooler(model, tmp, _SEED + 1)
    os.rename(tmp, target)
    return target


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert-mlm")
    return lambda arch, variant, pooler=True: build_tiny_masked_lm(arch, variant, root, pooler)


def _batch(arch: str, variant: str):
    return padded_batch(128, MLM_CONFIGS[arch, variant]["pad_id"])  # lengths 12, 7, 1, 9


def _run_mlm(path: Path, backend: str, tmp_path: Path, ids, mask) -> torch.Tensor:
    if backend in ("interpret", "generated"):
        return lt.load(path, mode=backend, numerics="equivalent").run("mlm", ids, mask)
    if backend == "jax":
        import linnet.jax as lj

        got = lj.load(path).run("mlm", ids.numpy(), mask.numpy())
    else:
        import linnet.onnx

        model = linnet.onnx.load(linnet.onnx.export(path, tmp_path / "onnx", progress=False))
        assert model.entries == ["forward", "embed", "pooler", "mlm"]
        got = model.run("mlm", ids.numpy(), mask.numpy())
    return torch.from_numpy(np.array(got))


@pytest.mark.parametrize("backend", ["interpret", "generated", "jax", "onnx"])
@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_mlm_entry_matches_transformers(masked_lm, tmp_path, arch, variant, backend):
    path = masked_lm(arch, variant)
    ids, mask = _batch(arch, variant)
    want = reference_mlm(path, ids, mask, check_loaded=True)
    delta = valid_delta(_run_mlm(path, backend, tmp_path, ids, mask), want, mask)
    print(f"{arch}/{variant} {backend}: mlm max |Δ| {delta:.3g}")
    assert delta <= F32_TOL, f"max |Δ| {delta:.3g} > {F32_TOL}"


@pytest.mark.parametrize("how", ["path", "model"])
@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_hf_export_keeps_the_head(masked_lm, tmp_path, arch, variant, how):
    src = masked_lm(arch, variant)
    out = linnet.hf.export(src if how == "path" else lt.load(src), tmp_path / "out", progress=False)
    assert_bit_exact(src, out)
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads((src / "config.json").read_text())
    ids, mask = _batch(arch, variant)
    want = reference_mlm(src, ids, mask)
    got = reference_mlm(out, ids, mask, check_loaded=True)
    assert torch.equal(got, want), f"re-loaded logits off by {valid_delta(got, want, mask):.3g}"


def test_a_bare_bert_model_has_no_mlm_entry(tmp_path):
    from tests.checkpoints import build_tiny_encoder

    model = lt.load(build_tiny_encoder("BertModel", "base", tmp_path))
    ids, mask = _batch("BertForMaskedLM", "base")
    with pytest.raises(LinnetError, match="`mlm` exists only `if mlm_head`"):
        model.run("mlm", ids, mask)


@pytest.mark.parametrize("arch", ["BertForMaskedLM", "RobertaForMaskedLM"])
def test_an_untied_decoder_is_refused(masked_lm, tmp_path, arch):
    """The source's decoder is the word embedding: a config that unties them (its own
    decoder weight and bias) cannot be expressed, so it is refused, naming the field."""
    bad = shutil.copytree(masked_lm(arch, "base"), tmp_path / "untied")
    config = json.loads((bad / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        lt.load(bad)


@pytest.mark.parametrize("arch", ["BertForMaskedLM", "RobertaForMaskedLM"])
def test_checkpoint_without_pooler_loads(masked_lm, tmp_path, arch):
    """A *ForMaskedLM as transformers saves it has no pooler: it loads without the
    `pooler` entry (the plan reads the pooler's presence from the headers), its masked-LM
    logits match, and the export writes no pooler back."""
    src = masked_lm(arch, "base", pooler=False)
    model = lt.load(src, mode="generated", numerics="equivalent")
    assert model.entries == ["forward", "embed", "mlm"]
    ids, mask = _batch(arch, "base")
    want = reference_mlm(src, ids, mask, check_loaded=True)
    delta = valid_delta(model.run("mlm", ids, mask), want, mask)
    assert delta <= F32_TOL, f"max |Δ| {delta:.3g} > {F32_TOL}"
    out = linnet.hf.export(model, tmp_path / "out", progress=False)
    assert_bit_exact(src, out)
