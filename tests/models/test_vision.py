"""Vision models from the zoo's sources against transformers, on tiny random checkpoints.

ViTModel, ViTForImageClassification, Dinov2Model and SiglipVisionModel (zoo/vit.linnet),
built by transformers (tests/checkpoints.py, VISION_CONFIGS) and loaded with
`linnet.torch.load` like any checkpoint: every entry the class has (`forward`: the last
hidden state; `pool`: the pooled output; `classify`: logits) within 1e-4 of transformers
(f32, a batch of 2 images) in interpret and generated modes (fast: 1e-3). HF exports
round-trip bit-exactly; a misshapen tensor fails at the plan, naming it; an entry the
config lacks and a wrong image size fail with a message that says so.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import linnet.hf  # noqa: E402
import linnet.torch as lt  # noqa: E402
from linnet.errors import CheckpointError, LinnetError  # noqa: E402
from linnet.weights.planning import plan_checkpoint  # noqa: E402
from tests.checkpoints import (  # noqa: E402
    build_tiny_vision,
    reference_vision,
    vision_pixels,
)
from tests.converters.test_export_hf import assert_bit_exact  # noqa: E402
from tests.numeric import assert_close  # noqa: E402

F32_TOL = 1e-4
FAST_TOL = 1e-3
VIT_FAMILY = ["ViTModel", "ViTForImageClassification", "Dinov2Model", "SiglipVisionModel"]
ENTRY_OF = {"forward": "forward", "pool": "pool", "logits": "classify"}


@pytest.fixture(scope="module")
def vision_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    return lambda arch: build_tiny_vision(arch, root)


@pytest.fixture(scope="module")
def references(vision_checkpoint):
    cache = {}

    def get(arch):
        if arch not in cache:
            folder = vision_checkpoint(arch)
            pixels = vision_pixels(folder)
            cache[arch] = (folder, pixels, reference_vision(folder, pixels))
        return cache[arch]

    return get


def check(name: str, got, want, tol: float) -> float:
    delta = assert_close(got, want, atol=tol, what=name, dtype=True)  # NaN fails
    print(f"{name}: max |Δ| = {delta:.2e}")
    return delta


@pytest.mark.parametrize(
    "mode, numerics",
    [("interpret", "equivalent"), ("generated", "equivalent"), ("generated", "fast")],
)
@pytest.mark.parametrize("arch", VIT_FAMILY)
def test_matches_transformers(references, arch, mode, numerics):
    folder, pixels, refs = references(arch)
    model = lt.load(folder, mode=mode, numerics=numerics)
    tol = F32_TOL if numerics == "equivalent" else FAST_TOL
    for key, want in refs.items():
        got = model.run(ENTRY_OF[key], pixels)
        check(f"{arch} {mode}/{numerics} {ENTRY_OF[key]}", got, want, tol)


@pytest.mark.parametrize("arch", VIT_FAMILY)
def test_entries_follow_the_class(vision_checkpoint, arch):
    _, source, config, _ = plan_checkpoint(vision_checkpoint(arch))
    want = {
        "ViTModel": ["forward", "pool"],
        "ViTForImageClassification": ["forward", "classify"],
        "Dinov2Model": ["forward", "pool"],
        "SiglipVisionModel": ["forward", "pool"],
    }[arch]
    assert source.entries_for(config) == want


def test_an_entry_the_config_lacks_says_why(references):
    folder, pixels, _ = references("ViTModel")
    model = lt.load(folder)
    with pytest.raises(LinnetError, match=r"`classify` exists only `if head and cls_token`"):
        model.run("classify", pixels)


def test_a_wrong_image_size_names_the_expected_shape(references):
    folder, pixels, _ = references("Dinov2Model")
    with pytest.raises(LinnetError, match=r"pixel_values.*\[B, 3, 32, 32\]"):
        lt.load(folder).forward(pixels[:, :, :16, :16])


@pytest.mark.parametrize("arch", VIT_FAMILY)
def test_hf_export_round_trips_bit_exactly(vision_checkpoint, tmp_path, arch):
    src = vision_checkpoint(arch)
    for how, what in (("path", src), ("model", lt.load(src))):
        out = linnet.hf.export(what, tmp_path / how, progress=False)
        assert_bit_exact(src, out)
        config = json.loads((out / "config.json").read_text())
        assert config == json.loads((src / "config.json").read_text())


@pytest.mark.parametrize(
    "arch, tensor",
    [
        ("ViTModel", "embeddings.position_embeddings"),
        ("Dinov2Model", "encoder.layer.1.layer_scale2.lambda1"),
        ("SiglipVisionModel", "head.attention.in_proj_weight"),
    ],
)
def test_a_misshapen_tensor_fails_at_the_plan(vision_checkpoint, tmp_path, arch, tensor):
    from safetensors.torch import load_file, save_file

    src = vision_checkpoint(arch)
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = load_file(src / "model.safetensors")
    tensors[tensor] = tensors[tensor][..., :-1].contiguous()
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    (bad / "config.json").write_text((src / "config.json").read_text())
    plan, *_ = plan_checkpoint(bad)
    with pytest.raises(CheckpointError, match=tensor.replace(".", r"\.")):
        plan.check()
    with pytest.raises(CheckpointError, match=tensor.replace(".", r"\.")):
        lt.load(bad)
