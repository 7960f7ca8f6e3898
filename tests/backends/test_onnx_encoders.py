"""ONNX exports of encoders and vision models against transformers.

Tiny random BertModel / RobertaModel and ModernBertModel checkpoints (padded batches of
mixed lengths), the ViT family (ViT, its classifier, DINOv2, SigLIP's vision tower), ResNet
(basic layers; bottleneck layers with a classifier) and all-MiniLM-L6-v2's real weights:
every entry of the export, run by onnxruntime through `linnet.onnx.load`, within 1e-4 of
transformers (f32); MiniLM's `embed` has cosine >= 0.99999 with sentence-transformers-style
mean pooling over transformers' output.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from linnet.zoo.registry import registry

import linnet.onnx
from linnet.errors import LinnetError
from tests.checkpoints import (
    TINY_MODERNBERT_CONFIGS,
    VISION_CONFIGS,
    build_tiny_encoder,
    build_tiny_modernbert,
    build_tiny_vision,
    encoder_variants,
    mean_pooling,
    minilm_snapshot,
    padded_batch,
    reference_hidden,
    reference_modernbert,
    reference_vision,
    vision_pixels,
)
from tests.models.test_resnet import ENTRIES as RESNET_ENTRIES
from tests.models.test_resnet import reference as reference_resnet

TOL = 1e-4
VISION = [a for a in VISION_CONFIGS if not a.startswith("ResNet")]
SENTENCES = [
    "A man is eating food.",
    "The new movie is awesome, and everyone in the theatre loved every single minute of it.",
    "Hi",
    "Two dogs play in the snow near an old wooden fence.",
]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx-encoders")
    made = {}

    def get(build, *key):
        if key not in made:
            folder = build(*key, root)
            out = linnet.onnx.export(folder, root / f"onnx-{'-'.join(key)}", progress=False)
            made[key] = folder, linnet.onnx.load(out), out
        return made[key]

    return get


def delta(got: np.ndarray, want: torch.Tensor, mask=None) -> float:
    diff = np.abs(got - want.numpy())
    if mask is not None:  # padded rows are not compared (transformers fills them freely)
        diff = diff[mask.numpy().astype(bool)]
    return float(diff.max())


@pytest.mark.parametrize("arch,variant", encoder_variants(), ids="-".join)
def test_encoder_matches_transformers(export, arch, variant):
    folder, model, _ = export(build_tiny_encoder, arch, variant)
    assert model.entries == ["forward", "embed", "pooler"]
    ids, mask = padded_batch(model.config["vocab"], model.config["pad_id"])
    hidden, pooled = reference_hidden(folder, ids, mask)
    assert delta(model.forward(ids.numpy(), mask.numpy()), hidden, mask) <= TOL
    assert delta(model.run("pooler", ids.numpy(), mask.numpy()), pooled) <= TOL
    assert delta(model.embed(ids, mask), mean_pooling(hidden, mask)) <= TOL
    unit = model.embed(ids, mask, normalize=True)
    assert np.allclose(np.linalg.norm(unit, axis=-1), 1.0, atol=1e-6)


def test_encoder_batch_and_length_are_dynamic(export):
    folder, model, _ = export(build_tiny_encoder, "BertModel", "base")
    for lengths in ((3,), (5, 2, 9)):
        ids, mask = padded_batch(model.config["vocab"], 0, lengths=lengths, seed=len(lengths))
        hidden, _ = reference_hidden(folder, ids, mask)
        assert delta(model.forward(ids, mask), hidden, mask) <= TOL
    # a mask left out means every position is valid
    ids, _ = padded_batch(model.config["vocab"], 0, lengths=(6, 6))
    full = torch.ones_like(ids)
    assert delta(model.forward(ids), reference_hidden(folder, ids, full)[0]) <= TOL


def test_encoder_signature_and_errors(export):
    _, model, out = export(build_tiny_encoder, "BertModel", "base")
    forward = onnx.load(str(out / "forward.onnx"), load_external_data=False)
    dims = {
        i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in forward.graph.input
    }
    assert dims == {"ids": ["B", "S"], "mask": ["B", "S"]}  # batch and length symbolic
    with pytest.raises(LinnetError, match="no entry `decode`"):
        model.run("decode", [[1, 2]])
    with pytest.raises(LinnetError, match="integers"):
        model.forward(np.zeros((1, 3), np.float32))
    with pytest.raises(LinnetError, match="takes 2 inputs"):
        model.forward([[1]], [[1]], [[1]])


@pytest.mark.parametrize("arch", VISION)
def test_vision_matches_transformers(export, arch):
    folder, model, _ = export(build_tiny_vision, arch)
    pixels = vision_pixels(folder)
    refs = reference_vision(folder, pixels)
    entry_of = {"forward": "forward", "pool": "pool", "logits": "classify"}
    for key, want in refs.items():
        got = model.run(entry_of[key], pixels.numpy())
        assert got.shape == tuple(want.shape), key
        assert delta(got, want) <= TOL, key


@pytest.mark.parametrize("variant", list(TINY_MODERNBERT_CONFIGS))
def test_modernbert_matches_transformers(export, variant):
    """Global and local (symmetric window) layers, no attn_norm in layer 0; the batch is
    longer than the window, so a pad query of the 1-token row sees only padding."""
    folder, model, _ = export(build_tiny_modernbert, variant)
    assert model.entries == ["forward", "embed"]
    ids, mask = padded_batch(model.config["vocab"], 0)
    hidden = reference_modernbert(folder, ids, mask)
    got = model.forward(ids.numpy(), mask.numpy())
    assert np.isfinite(got).all()  # a fully masked query gives zeros, not NaN
    assert delta(got, hidden, mask) <= TOL
    assert delta(model.embed(ids, mask), mean_pooling(hidden, mask)) <= TOL


@pytest.mark.parametrize("arch", list(RESNET_ENTRIES))
def test_resnet_matches_transformers(export, arch):
    folder, model, _ = export(build_tiny_vision, arch)
    assert model.entries == RESNET_ENTRIES[arch]
    pixels = vision_pixels(folder)
    for entry, want in reference_resnet(folder, pixels).items():
        got = model.run(entry, pixels.numpy())
        assert got.shape == tuple(want.shape), entry
        assert delta(got, want) <= TOL, entry


def test_vision_checks_the_image_size(export):
    _, model, _ = export(build_tiny_vision, "ViTModel")
    with pytest.raises(LinnetError, match="pixel_values"):
        model.forward(np.zeros((1, 3, 16, 16), np.float32))


def test_minilm_real_weights(tmp_path):
    from transformers import AutoTokenizer

    snapshot = minilm_snapshot()
    model = linnet.onnx.load(linnet.onnx.export(snapshot, tmp_path / "minilm", progress=False))
    batch = AutoTokenizer.from_pretrained(snapshot, trust_remote_code=False)(
        SENTENCES, padding=True, return_tensors="pt"
    )
    ids, mask = batch["input_ids"], batch["attention_mask"]
    want = mean_pooling(reference_hidden(snapshot, ids, mask)[0], mask)
    got = torch.from_numpy(model.embed(ids.numpy(), mask.numpy()))
    cosine = torch.nn.functional.cosine_similarity(got, want).min().item()
    tol = registry().get("all-minilm-l6-v2").tolerance("torch", "f32")
    assert cosine >= tol.cosine >= 0.99999
    assert (got - want).abs().max().item() <= tol.max_abs
