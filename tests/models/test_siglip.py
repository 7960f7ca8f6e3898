"""SigLIP's full SiglipModel (zoo/siglip.linnet) against transformers, on tiny random checkpoints.

A SiglipModel built by transformers from a small config (both towers 2 layers, width 32, 4
heads; 32 x 32 images in 8 x 8 patches; 99 tokens, 16 positions), its weights perturbed off
the initialization and its logit scale and bias set to SigLIP-like values (scale 10, bias
-2.5) so the logits are not near zero. For 2 images and 3 texts of 16 tokens, f32: the image
and text embeddings (`get_image_features`, `get_text_features`) and the logits per image
within 1e-4 of transformers in interpret and generated modes (fast: 1e-3), on JAX and on
onnxruntime; HF exports round-trip bit-exactly and transformers reads them back to identical
logits; a text head narrower than the image width fails at the plan, naming the tensor.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import linnet.hf  # noqa: E402
import linnet.torch as lt  # noqa: E402
from linnet.check.elaborate import check_source  # noqa: E402
from linnet.errors import CheckpointError  # noqa: E402
from linnet.source import Source  # noqa: E402
from linnet.weights.planning import plan_checkpoint  # noqa: E402
from tests.converters.test_export_hf import assert_bit_exact  # noqa: E402
from tests.numeric import assert_close  # noqa: E402

TOL = 1e-4
FAST_TOL = 1e-3
TEXT = dict(
    vocab_size=99,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=16,
)
VISION = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=32,
    patch_size=8,
)


def build(folder, text=TEXT):
    torch.manual_seed(0)
    config = transformers.SiglipConfig(text_config=text, vision_config=VISION)
    model = transformers.SiglipModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.logit_scale.fill_(math.log(10.0))
        model.logit_bias.fill_(-2.5)
    model.save_pretrained(folder)
    return folder


@torch.no_grad()
def reference(folder, pixels, ids) -> dict:
    model = transformers.SiglipModel.from_pretrained(
        folder, dtype=torch.float32, trust_remote_code=False
    ).eval()

    def pooled(out):
        return getattr(out, "pooler_output", out)

    return {
        "embed_image": pooled(model.get_image_features(pixel_values=pixels)),
        "embed_text": pooled(model.get_text_features(input_ids=ids)),
        "logits": model(input_ids=ids, pixel_values=pixels).logits_per_image,
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = build(tmp_path_factory.mktemp("siglip") / "tiny")
    g = torch.Generator().manual_seed(3)
    pixels = torch.randn(2, 3, 32, 32, generator=g)
    ids = torch.randint(0, 99, (3, 16), generator=g)
    return folder, pixels, ids, reference(folder, pixels, ids)


def inputs(entry, pixels, ids) -> list:
    return {"embed_image": [pixels], "embed_text": [ids], "logits": [pixels, ids]}[entry]


def check(name, got, want, tol) -> None:
    got = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.array(got))
    delta = assert_close(got, want, atol=tol, what=name, dtype=True)  # NaN fails
    print(f"{name}: max |Δ| = {delta:.2e} (|ref| up to {want.abs().max():.2f})")


@pytest.mark.parametrize(
    "mode, numerics",
    [("interpret", "equivalent"), ("generated", "equivalent"), ("generated", "fast")],
)
def test_matches_transformers(built, mode, numerics):
    folder, pixels, ids, refs = built
    model = lt.load(folder, mode=mode, numerics=numerics)
    assert model.entries == ["embed_image", "embed_text", "logits"]
    for entry, want in refs.items():
        got = model.run(entry, *inputs(entry, pixels, ids))
        check(
            f"{mode}/{numerics} {entry}", got, want, TOL if numerics == "equivalent" else FAST_TOL
        )


def test_jax_matches_transformers(built):
    import linnet.jax as lj

    folder, pixels, ids, refs = built
    model = lj.load(folder)
    for entry, want in refs.items():
        got = model.run(entry, *[x.numpy() for x in inputs(entry, pixels, ids)])
        check(f"jax {entry}", got, want, TOL)


def test_onnx_matches_transformers(built, tmp_path):
    import linnet.onnx

    folder, pixels, ids, refs = built
    model = linnet.onnx.load(linnet.onnx.export(folder, tmp_path / "onnx", progress=False))
    for entry, want in refs.items():
        got = model.run(entry, *[x.numpy() for x in inputs(entry, pixels, ids)])
        check(f"onnx {entry}", got, want, TOL)


def test_the_source_checks_clean():
    assert check_source(Source.load("zoo/siglip.linnet").module) == []


def test_hf_export_round_trips_bit_exactly(built, tmp_path):
    src, pixels, ids, refs = built
    for how, what in (("path", src), ("model", lt.load(src))):
        out = linnet.hf.export(what, tmp_path / how, progress=False)
        assert_bit_exact(src, out)
        config = json.loads((out / "config.json").read_text())
        assert config == json.loads((src / "config.json").read_text())
        assert torch.equal(reference(out, pixels, ids)["logits"], refs["logits"])


def test_a_narrow_text_head_fails_at_the_plan(tmp_path):
    folder = build(tmp_path / "narrow", dict(TEXT, projection_size=16))
    plan, *_ = plan_checkpoint(folder)
    with pytest.raises(CheckpointError, match=r"text_model\.head\.(weight|bias) has shape \[16\]"):
        plan.check()
