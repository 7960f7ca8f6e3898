"""ResNet (zoo/resnet.linnet) against transformers, on tiny random checkpoints.

ResNetModel with basic layers (ResNet-18's shape, stage 0 without a projection) and
ResNetForImageClassification with bottleneck layers (ResNet-50's shape), both with depths
[2, 1, 2, 1] (tests/checkpoints.py, VISION_CONFIGS; batch-norm statistics redrawn). For a
batch of 2 images at 224 x 224, f32: the last hidden state, the pooled features and the
logits within 1e-4 of transformers in interpret and generated modes (fast: 1e-3) and on
JAX; HF exports round-trip bit-exactly (num_batches_tracked included) and transformers
reads them back to the same outputs; a checkpoint with a layer too many in a stage fails
at the plan, naming the tensor.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import linnet.hf  # noqa: E402
import linnet.torch as lt  # noqa: E402
from linnet.check.elaborate import check_source  # noqa: E402
from linnet.errors import CheckpointError  # noqa: E402
from linnet.source import Source  # noqa: E402
from linnet.weights.planning import plan_checkpoint  # noqa: E402
from tests.checkpoints import build_tiny_vision, vision_pixels  # noqa: E402
from tests.converters.test_export_hf import assert_bit_exact  # noqa: E402
from tests.models.test_vision import check  # noqa: E402

F32_TOL = 1e-4
FAST_TOL = 1e-3
ARCHS = ["ResNetModel", "ResNetForImageClassification"]
ENTRIES = {
    "ResNetModel": ["forward", "pool"],
    "ResNetForImageClassification": ["forward", "pool", "classify"],
}


@torch.no_grad()
def reference(folder, pixels) -> dict[str, torch.Tensor]:
    """transformers' outputs per entry: last hidden state, pooled [B, C], logits."""
    import transformers

    arch = json.loads((folder / "config.json").read_text())["architectures"][0]
    model = (
        getattr(transformers, arch)
        .from_pretrained(folder, dtype=torch.float32, trust_remote_code=False)
        .eval()
    )
    base = getattr(model, "resnet", model)
    out = base(pixel_values=pixels)
    refs = {"forward": out.last_hidden_state, "pool": out.pooler_output.flatten(1)}
    if arch == "ResNetForImageClassification":
        refs["classify"] = model(pixel_values=pixels).logits
    return refs


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("resnet")
    cache = {}

    def get(arch):
        if arch not in cache:
            folder = build_tiny_vision(arch, root)
            pixels = vision_pixels(folder)
            cache[arch] = (folder, pixels, reference(folder, pixels))
        return cache[arch]

    return get


@pytest.mark.parametrize(
    "mode, numerics",
    [("interpret", "equivalent"), ("generated", "equivalent"), ("generated", "fast")],
)
@pytest.mark.parametrize("arch", ARCHS)
def test_matches_transformers(built, arch, mode, numerics):
    folder, pixels, refs = built(arch)
    model = lt.load(folder, mode=mode, numerics=numerics)
    tol = F32_TOL if numerics == "equivalent" else FAST_TOL
    for entry, want in refs.items():
        check(f"{arch} {mode}/{numerics} {entry}", model.run(entry, pixels), want, tol)


@pytest.mark.parametrize("arch", ARCHS)
def test_jax_matches_transformers(built, arch):
    import linnet.jax as lj

    folder, pixels, refs = built(arch)
    model = lj.load(folder)
    for entry, want in refs.items():
        got = torch.from_numpy(np.array(model.run(entry, pixels.numpy())))
        check(f"{arch} jax {entry}", got, want, F32_TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_entries_follow_the_class(built, arch):
    _, source, config, _ = plan_checkpoint(built(arch)[0])
    assert source.entries_for(config) == ENTRIES[arch]


def test_the_source_checks_clean():
    assert check_source(Source.load("zoo/resnet.linnet").module) == []


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_export_round_trips_bit_exactly(built, tmp_path, arch):
    import transformers

    src, pixels, refs = built(arch)
    for how, what in (("path", src), ("model", lt.load(src))):
        out = linnet.hf.export(what, tmp_path / how, progress=False)
        assert_bit_exact(src, out)  # every tensor, num_batches_tracked (int64) included
        config = json.loads((out / "config.json").read_text())
        assert config == json.loads((src / "config.json").read_text())
    model = (
        getattr(transformers, arch)
        .from_pretrained(out, dtype=torch.float32, trust_remote_code=False)
        .eval()
    )
    with torch.no_grad():
        out_ = model(pixel_values=pixels)
    want = refs["classify"] if arch == "ResNetForImageClassification" else refs["forward"]
    got = out_.logits if arch == "ResNetForImageClassification" else out_.last_hidden_state
    assert torch.equal(got, want)


def test_a_layer_too_many_fails_at_the_plan(built, tmp_path):
    from safetensors.torch import load_file, save_file

    src = built("ResNetModel")[0]
    tensors = load_file(src / "model.safetensors")
    extra = "encoder.stages.1.layers.1.layer.0.convolution.weight"  # stage 1 has one layer
    tensors[extra] = tensors["encoder.stages.1.layers.0.layer.1.convolution.weight"].clone()
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    (bad / "config.json").write_text((src / "config.json").read_text())
    plan, *_ = plan_checkpoint(bad)
    with pytest.raises(CheckpointError, match=extra.replace(".", r"\.")):
        plan.check()
