"""Stable Diffusion's VAE (zoo/sd_vae.linnet) against diffusers' AutoencoderKL.

Tiny random AutoencoderKL checkpoints built by diffusers itself (`save_pretrained`: config.json
with `_class_name`, diffusion_pytorch_model.safetensors), four up blocks as every SD VAE has:
widths (16, 16, 32, 32) with 8 groups and one layer per block; (32, 32, 64, 64) with 32 groups
and two layers; and one without quant_conv, post_quant_conv and mid-block attention. Weights
are perturbed off diffusers' initialization (zero biases, unit norms) so none is trivial. For
a batch of 2 latents of 3 x 5 and 2 images of 24 x 40, f32: `decode`, `encode` and
`encode_logvar` within 1e-4 of diffusers' `AutoencoderKL.decode(...).sample`,
`encode(...).latent_dist.mean` and `.logvar` in interpret and generated modes, on JAX and on
onnxruntime (an ONNX export); the log-variance's clamp to [-30, 20] against diffusers' on
moments pushed past both ends; HF exports write the diffusers layout with every tensor
bit-exact, and diffusers reads them back to identical images and latents; a misshapen tensor
fails at the plan, named.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import linnet.hf  # noqa: E402
import linnet.torch as lt  # noqa: E402
from linnet.check.elaborate import check_source  # noqa: E402
from linnet.errors import CheckpointError  # noqa: E402
from linnet.model import Decoder  # noqa: E402
from linnet.source import Source  # noqa: E402
from linnet.weights.planning import plan_checkpoint  # noqa: E402
from tests.numeric import assert_close  # noqa: E402
from tests.onnx_fusions import sum_fused_convs  # noqa: E402

TOL = 1e-4
FAST_TOL = 1e-3
# name -> AutoencoderKL arguments beyond the four block types
VARIANTS = {
    "groups8": dict(block_out_channels=(16, 16, 32, 32), layers_per_block=1, norm_num_groups=8),
    "groups32": dict(block_out_channels=(32, 32, 64, 64), layers_per_block=2, norm_num_groups=32),
    "bare": dict(
        block_out_channels=(16, 32, 32, 32),
        layers_per_block=1,
        norm_num_groups=8,
        use_post_quant_conv=False,
        use_quant_conv=False,
        mid_block_add_attention=False,
    ),
}


def build(root, name: str):
    """A tiny AutoencoderKL saved by diffusers, its weights drawn off the initialization."""
    from diffusers import AutoencoderKL

    torch.manual_seed(sorted(VARIANTS).index(name))
    model = AutoencoderKL(
        latent_channels=4,
        sample_size=32,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        **VARIANTS[name],
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = root / name
    model.save_pretrained(folder)
    return folder


ENTRIES = ("encode", "encode_logvar", "decode")


def load_reference(folder):
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(folder, trust_remote_code=False).eval()


@torch.no_grad()
def reference(folder, latents) -> torch.Tensor:
    return load_reference(folder).decode(latents).sample


@torch.no_grad()
def reference_encode(model_or_folder, pixels) -> dict:
    """diffusers' latent distribution: {entry: tensor} for encode and encode_logvar."""
    model = model_or_folder
    if not hasattr(model, "encode"):
        model = load_reference(model_or_folder)
    dist = model.encode(pixels).latent_dist
    return {"encode": dist.mean, "encode_logvar": dist.logvar}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("sd-vae")
    cache = {}

    def get(name):
        if name not in cache:
            folder = build(root, name)
            latents = torch.randn(2, 4, 3, 5, generator=torch.Generator().manual_seed(7))
            cache[name] = folder, latents, reference(folder, latents)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def encoded(built):
    """(folder, pixels, {entry: diffusers' tensor}) per variant: 2 images of 24 x 40."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = built(name)[0]
            pixels = torch.randn(2, 3, 24, 40, generator=torch.Generator().manual_seed(8))
            cache[name] = folder, pixels, reference_encode(folder, pixels)
        return cache[name]

    return get


def check(name, got, want, tol) -> None:
    got = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.array(got))
    delta = assert_close(got, want, atol=tol, what=name, dtype=True)  # NaN fails
    print(f"{name}: max |Δ| = {delta:.2e} (|ref| up to {want.abs().max():.2f})")


@pytest.mark.parametrize(
    "mode, numerics",
    [("interpret", "equivalent"), ("generated", "equivalent"), ("generated", "fast")],
)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_decode_matches_diffusers(built, name, mode, numerics):
    folder, latents, want = built(name)
    model = lt.load(folder, mode=mode, numerics=numerics)
    assert sorted(model.entries) == sorted(ENTRIES)
    assert not isinstance(model, Decoder)  # a stateless `decode` is no text decoder
    tol = TOL if numerics == "equivalent" else FAST_TOL
    check(f"{name} {mode}/{numerics}", model.run("decode", latents), want, tol)


@pytest.mark.parametrize(
    "mode, numerics",
    [("interpret", "equivalent"), ("generated", "equivalent"), ("generated", "fast")],
)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_encode_matches_diffusers(encoded, name, mode, numerics):
    folder, pixels, wants = encoded(name)
    model = lt.load(folder, mode=mode, numerics=numerics)
    assert not isinstance(model, Decoder)  # a stateless `encode` is no seq2seq either
    tol = TOL if numerics == "equivalent" else FAST_TOL
    for entry, want in wants.items():
        check(f"{name} {entry} {mode}/{numerics}", model.run(entry, pixels), want, tol)


def test_logvar_is_clamped_as_diffusers_clamps(encoded, tmp_path):
    """quant_conv's log-variance biases pushed to +40 and -50 on two channels: the clamp to
    [-30, 20] decides those (unclamped, they miss by 20); the mean is untouched."""
    from safetensors.torch import save_file

    folder, pixels, _ = encoded("groups8")
    tensors = _tensors(folder)
    bias = tensors["quant_conv.bias"].clone()
    bias[4], bias[5] = 40.0, -50.0  # moments 4.. are the log-variance
    tensors["quant_conv.bias"] = bias
    pushed = tmp_path / "pushed"
    pushed.mkdir()
    save_file(tensors, pushed / "diffusion_pytorch_model.safetensors", metadata={"format": "pt"})
    (pushed / "config.json").write_text((folder / "config.json").read_text())
    wants = reference_encode(pushed, pixels)
    assert (
        wants["encode_logvar"][:, 0].min() == 20.0 and wants["encode_logvar"][:, 1].max() == -30.0
    )
    model = lt.load(pushed)
    for entry, want in wants.items():
        check(f"pushed {entry}", model.run(entry, pixels), want, TOL)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_jax_matches_diffusers(built, encoded, name):
    import linnet.jax as lj

    folder, latents, want = built(name)
    model = lj.load(folder)
    check(f"{name} jax", model.run("decode", latents.numpy()), want, TOL)
    _, pixels, wants = encoded(name)
    for entry, want in wants.items():
        check(f"{name} jax {entry}", model.run(entry, pixels.numpy()), want, TOL)


@pytest.mark.parametrize("name", ["groups8", "bare"])
def test_onnx_matches_diffusers(built, encoded, tmp_path, name):
    import linnet.onnx

    folder, latents, want = built(name)
    model = linnet.onnx.load(linnet.onnx.export(folder, tmp_path / "onnx", progress=False))
    assert not isinstance(model, Decoder)
    check(f"{name} onnx", model.run("decode", latents.numpy()), want, TOL)
    other = torch.randn(1, 4, 2, 4)  # any latent size: the image is 8x it
    check(f"{name} onnx 2x4", model.run("decode", other.numpy()), reference(folder, other), TOL)
    _, pixels, wants = encoded(name)
    for entry, want in wants.items():
        check(f"{name} onnx {entry}", model.run(entry, pixels.numpy()), want, TOL)
    image = torch.randn(1, 3, 16, 32)  # any image size a multiple of 8
    for entry, want in reference_encode(folder, image).items():
        check(f"{name} onnx {entry} 16x32", model.run(entry, image.numpy()), want, TOL)


def test_onnx_folds_residual_adds_as_diffusers_export_does(built, tmp_path):
    """onnxruntime folds a resnet's residual Add into the NCHWc convolution before it only
    where it proves both operands the same shape. Linnet's export has symbolic dims (any
    batch and latent size), which ONNX shape inference loses at each Conv and group norm, so
    the exporter names them on every intermediate value: as many folds as in diffusers' own
    torch.onnx export, whose shapes are all fixed."""
    import linnet.onnx

    folder, latents, _ = built("groups8")
    export = linnet.onnx.export(folder, tmp_path / "onnx", progress=False)
    vae = load_reference(folder)
    vae.forward = lambda x: vae.decode(x).sample
    with torch.no_grad():
        torch.onnx.export(
            vae, (latents,), str(tmp_path / "ref.onnx"), dynamo=False, opset_version=17
        )
    want = sum_fused_convs(tmp_path / "ref.onnx")
    print(f"residual Adds folded: {want} in diffusers' export")
    # None for both where the CPU has no NCHWc kernels
    assert sum_fused_convs(export / "decode.onnx") == want


def test_the_source_checks_clean():
    assert check_source(Source.load("zoo/sd_vae.linnet").module) == []


def _tensors(path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "diffusion_pytorch_model.safetensors")


@pytest.mark.parametrize("name", ["groups8", "bare"])
def test_hf_export_writes_the_diffusers_layout(built, encoded, tmp_path, name):
    from diffusers import AutoencoderKL

    src, latents, want = built(name)
    original = _tensors(src)
    _, pixels, wants = encoded(name)
    for how, what in (("path", src), ("model", lt.load(src))):
        out = linnet.hf.export(what, tmp_path / how, progress=False)
        assert sorted(p.name for p in out.iterdir()) == [
            "config.json",
            "diffusion_pytorch_model.safetensors",
        ]
        got = _tensors(out)
        assert set(got) == set(original)  # every tensor, the encoder's too
        for k in original:
            assert got[k].dtype == original[k].dtype and torch.equal(got[k], original[k]), k
        assert json.loads((out / "config.json").read_text()) == json.loads(
            (src / "config.json").read_text()
        )
        reloaded = AutoencoderKL.from_pretrained(out, trust_remote_code=False).eval()
        with torch.no_grad():
            assert torch.equal(reloaded.decode(latents).sample, want)
        for entry, tensor in reference_encode(reloaded, pixels).items():
            assert torch.equal(tensor, wants[entry]), entry


def test_config_round_trips_through_the_map(built):
    from diffusers import AutoencoderKL

    from linnet.weights.maps import find_weights_map

    folder = built("groups32")[0]
    hf = json.loads((folder / "config.json").read_text())
    wmap = find_weights_map("AutoencoderKL")
    config = wmap.translate_config(hf)
    assert config["channels"] == [64, 64, 64, 32, 32] and config["layers"] == 2
    written = wmap.config_to_hf(config)
    assert wmap.translate_config(written) == config
    rebuilt = AutoencoderKL.from_config(written)  # diffusers builds the same model
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
        k: v.shape for k, v in _tensors(folder).items()
    }
    bare = wmap.translate_config(json.loads((built("bare")[0] / "config.json").read_text()))
    assert (bare["quant"], bare["post_quant"], bare["in_channels"]) == (False, False, 3)
    assert wmap.translate_config(wmap.config_to_hf(bare)) == bare


@pytest.mark.parametrize(
    "name",
    [
        "decoder.up_blocks.1.resnets.0.conv1.weight",
        "encoder.down_blocks.2.resnets.0.conv1.weight",
        "encoder.down_blocks.0.downsamplers.0.conv.weight",
    ],
)
def test_a_misshapen_tensor_fails_at_the_plan(built, tmp_path, name):
    from safetensors.torch import save_file

    src = built("groups8")[0]
    tensors = _tensors(src)
    tensors[name] = tensors[name][:, :, :2].contiguous()
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(tensors, bad / "diffusion_pytorch_model.safetensors", metadata={"format": "pt"})
    (bad / "config.json").write_text((src / "config.json").read_text())
    plan, *_ = plan_checkpoint(bad)
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        plan.check()
