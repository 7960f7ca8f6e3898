"""SDXL's UNet (zoo/unet.linnet) against diffusers' UNet2DConditionModel.

Tiny random UNet2DConditionModels built and saved by diffusers itself (config.json with
`_class_name`, diffusion_pytorch_model.safetensors), SDXL's structure scaled down: three
levels of two layers, linear transformer projections, the text/time added embedding.
"sdxl": SDXL's block types (no attention on the first level), transformer depths (1, 1, 2),
heads (2, 2, 4), widths (16, 32, 64); "attend_all": attention on every level, depths
(2, 1, 1), heads (1, 2, 2), widths (16, 32, 32) (so the last level keeps its width: no
shortcut conv there). Weights are perturbed off diffusers' initialization (zero biases, unit
norms, zero conv_out) so none is trivial. For a batch of 2 latents of 8 x 12, timesteps
999 and 17, 5 text tokens, f32: `forward` within 1e-4 absolute of diffusers (outputs up to
about 2, so that is also about 1e-4 relative to the largest value) in interpret and
generated modes (fast: 1e-3), on JAX and on onnxruntime (an ONNX export, also at another
latent size); HF exports write the diffusers layout bit-exact, and diffusers reads them
back to identical outputs; a misshapen tensor fails at the plan, named; a topology the
source does not have is refused with the config key that says so.
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
from linnet.errors import CheckpointError, ConfigError, LinnetError  # noqa: E402
from linnet.model import Decoder  # noqa: E402
from linnet.source import Source  # noqa: E402
from linnet.weights.planning import plan_checkpoint  # noqa: E402
from tests.numeric import assert_close  # noqa: E402
from tests.onnx_fusions import sum_fused_convs  # noqa: E402

TOL = 1e-4
FAST_TOL = 1e-3
CROSS_DOWN, PLAIN_DOWN = "CrossAttnDownBlock2D", "DownBlock2D"
CROSS_UP, PLAIN_UP = "CrossAttnUpBlock2D", "UpBlock2D"
# name -> (UNet2DConditionModel arguments, pooled text width)
VARIANTS = {
    "sdxl": (
        dict(
            block_out_channels=(16, 32, 64),
            down_block_types=(PLAIN_DOWN, CROSS_DOWN, CROSS_DOWN),
            up_block_types=(CROSS_UP, CROSS_UP, PLAIN_UP),
            transformer_layers_per_block=(1, 1, 2),
            attention_head_dim=(2, 2, 4),
            cross_attention_dim=32,
            addition_time_embed_dim=8,
        ),
        16,
    ),
    "attend_all": (
        dict(
            block_out_channels=(16, 32, 32),
            down_block_types=(CROSS_DOWN,) * 3,
            up_block_types=(CROSS_UP,) * 3,
            transformer_layers_per_block=(2, 1, 1),
            attention_head_dim=(1, 2, 2),
            cross_attention_dim=24,
            addition_time_embed_dim=4,
        ),
        8,
    ),
}


def unet(name: str, **overrides):
    from diffusers import UNet2DConditionModel

    args, text_dim = VARIANTS[name]
    args = dict(args, **overrides)
    return UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=2,
        norm_num_groups=8,
        addition_embed_type="text_time",
        projection_class_embeddings_input_dim=text_dim + 6 * args["addition_time_embed_dim"],
        use_linear_projection=True,
        **args,
    )


def build(root, name: str):
    """A tiny UNet2DConditionModel saved by diffusers, its weights drawn off the init."""
    torch.manual_seed(sorted(VARIANTS).index(name))
    model = unet(name).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = root / name
    model.save_pretrained(folder)
    return folder


def inputs(name: str, batch: int = 2, height: int = 8, width: int = 12, seed: int = 7):
    """sample, timestep, encoder_hidden_states, text_embeds, time_ids (SDXL-like ids)."""
    args, text_dim = VARIANTS[name]
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([[64.0, 64, 0, 0, 64, 64], [48, 80, 8, 4, 64, 64]])
    return (
        torch.randn(batch, 4, height, width, generator=g),
        torch.tensor([999.0, 17.0])[:batch],
        torch.randn(batch, 5, args["cross_attention_dim"], generator=g),
        torch.randn(batch, text_dim, generator=g),
        ids[:batch],
    )


@torch.no_grad()
def reference(folder, args) -> torch.Tensor:
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel.from_pretrained(folder, trust_remote_code=False).eval()
    return run_diffusers(model, args)


@torch.no_grad()
def run_diffusers(model, args) -> torch.Tensor:
    sample, t, states, text, ids = args
    extra = {"text_embeds": text, "time_ids": ids}
    return model(sample, t, states, added_cond_kwargs=extra).sample


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("unet")
    cache = {}

    def get(name):
        if name not in cache:
            folder = build(root, name)
            args = inputs(name)
            cache[name] = folder, args, reference(folder, args)
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
def test_forward_matches_diffusers(built, name, mode, numerics):
    folder, args, want = built(name)
    model = lt.load(folder, mode=mode, numerics=numerics)
    assert model.entries == ["forward"]
    assert not isinstance(model, Decoder)
    tol = TOL if numerics == "equivalent" else FAST_TOL
    check(f"{name} {mode}/{numerics}", model.run("forward", *args), want, tol)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_outlined_layers_match_diffusers(built, name):
    """The per-level methods `mode="compile"` compiles, run eagerly: each binds the latent's
    H and W from its input (`2 * H` at the second level) as the entry binds them from
    `4 * H` (it used them unbound: NameError), also at another latent size."""
    from linnet.backends.torch.runners import GeneratedRunner

    folder, args, want = built(name)
    model = lt.load(folder, mode="generated")
    program = model.source.program(model.config)
    model.runner = GeneratedRunner(program, dict(model.params), model.device, "equivalent",
                                   outlined=True)  # fmt: skip
    assert "_forward_layer1(" in model.runner.text
    check(f"{name} outlined", model.run("forward", *args), want, TOL)
    other = inputs(name, batch=1, height=4, width=8, seed=3)
    check(f"{name} outlined 1x4x8", model.run("forward", *other), reference(folder, other), TOL)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_jax_matches_diffusers(built, name):
    import linnet.jax as lj

    folder, args, want = built(name)
    got = lj.load(folder).run("forward", *[a.numpy() for a in args])
    check(f"{name} jax", got, want, TOL)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_onnx_matches_diffusers(built, tmp_path, name):
    import linnet.onnx

    folder, args, want = built(name)
    model = linnet.onnx.load(linnet.onnx.export(folder, tmp_path / "onnx", progress=False))
    check(f"{name} onnx", model.run("forward", *[a.numpy() for a in args]), want, TOL)
    other = inputs(name, batch=1, height=4, width=8, seed=3)  # another batch and latent size
    got = model.run("forward", *[a.numpy() for a in other])
    check(f"{name} onnx 1x4x8", got, reference(folder, other), TOL)


def test_onnx_folds_residual_adds_as_diffusers_export_does(built, tmp_path):
    """Each resnet's residual Add folded into the NCHWc convolution before it, as in
    diffusers' own (fixed-shape) torch.onnx export: the export names its symbolic dims on
    every intermediate value so onnxruntime proves the two operands the same shape."""
    from diffusers import UNet2DConditionModel

    import linnet.onnx

    folder, args, _ = built("sdxl")
    export = linnet.onnx.export(folder, tmp_path / "onnx", progress=False)

    class Step(torch.nn.Module):  # the UNet with the added embeddings as plain inputs
        def __init__(self):
            super().__init__()
            self.unet = UNet2DConditionModel.from_pretrained(folder, trust_remote_code=False)

        def forward(self, *xs):
            return run_diffusers(self.unet, xs)

    path = tmp_path / "ref.onnx"
    with torch.no_grad():
        torch.onnx.export(Step().eval(), args, str(path), dynamo=False, opset_version=17)
    want = sum_fused_convs(path)
    print(f"residual Adds folded: {want} in diffusers' export")
    # None for both where the CPU has no NCHWc kernels
    assert sum_fused_convs(export / "forward.onnx") == want


def test_a_latent_size_the_levels_do_not_halve_is_refused(built):
    """Two stride-2 levels: the latent's sides must be multiples of 4 (`4 * H`)."""
    folder, args, _ = built("sdxl")
    model = lt.load(folder)
    bad = (torch.randn(2, 4, 8, 10),) + args[1:]
    with pytest.raises(LinnetError, match="sample"):
        model.run("forward", *bad)


def test_the_source_checks_clean():
    assert check_source(Source.load("zoo/unet.linnet").module) == []


def _tensors(path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "diffusion_pytorch_model.safetensors")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_hf_export_writes_the_diffusers_layout(built, tmp_path, name):
    from diffusers import UNet2DConditionModel

    src, args, want = built(name)
    original = _tensors(src)
    for how, what in (("path", src), ("model", lt.load(src))):
        out = linnet.hf.export(what, tmp_path / how, progress=False)
        assert sorted(p.name for p in out.iterdir()) == [
            "config.json",
            "diffusion_pytorch_model.safetensors",
        ]
        got = _tensors(out)
        assert set(got) == set(original)
        for k in original:
            assert got[k].dtype == original[k].dtype and torch.equal(got[k], original[k]), k
        assert json.loads((out / "config.json").read_text()) == json.loads(
            (src / "config.json").read_text()
        )
        reloaded = UNet2DConditionModel.from_pretrained(out, trust_remote_code=False).eval()
        assert torch.equal(run_diffusers(reloaded, args), want)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_config_round_trips_through_the_map(built, name):
    from diffusers import UNet2DConditionModel

    from linnet.weights.maps import find_weights_map

    folder = built(name)[0]
    hf = json.loads((folder / "config.json").read_text())
    wmap = find_weights_map("UNet2DConditionModel")
    config = wmap.translate_config(hf)
    widths = list(hf["block_out_channels"])
    assert config["widths"] == [widths[0], *widths, widths[-1]]
    cross = [t == CROSS_DOWN for t in hf["down_block_types"]]
    assert config["depth"] == [
        n if c else 0 for n, c in zip(hf["transformer_layers_per_block"], cross)
    ]
    written = wmap.config_to_hf(config)
    assert wmap.translate_config(written) == config
    rebuilt = UNet2DConditionModel.from_config(written)  # diffusers builds the same UNet
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
        k: v.shape for k, v in _tensors(folder).items()
    }


@pytest.mark.parametrize(
    "change, key",
    [
        (dict(layers_per_block=1), "layers_per_block"),
        (dict(block_out_channels=[16, 32, 32, 64]), "block_out_channels"),
        (dict(up_block_types=[CROSS_UP, CROSS_UP, CROSS_UP]), "up_block_types"),
        (dict(addition_embed_type="text"), "addition_embed_type"),
        (dict(use_linear_projection=False), "use_linear_projection"),
        (dict(class_embed_type="timestep"), "class_embed_type"),
        (dict(only_cross_attention=True), "only_cross_attention"),
        (dict(resnet_time_scale_shift="scale_shift"), "resnet_time_scale_shift"),
        (dict(conv_in_kernel=5), "conv_in_kernel"),
    ],
)
def test_a_topology_the_source_lacks_is_refused(built, change, key):
    from linnet.weights.maps import find_weights_map

    hf = dict(json.loads((built("sdxl")[0] / "config.json").read_text()), **change)
    with pytest.raises(ConfigError, match=key):
        find_weights_map("UNet2DConditionModel").translate_config(hf)


def test_a_misshapen_tensor_fails_at_the_plan(built, tmp_path):
    from safetensors.torch import save_file

    src = built("sdxl")[0]
    tensors = _tensors(src)
    name = "up_blocks.1.attentions.2.transformer_blocks.0.attn2.to_k.weight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(tensors, bad / "diffusion_pytorch_model.safetensors", metadata={"format": "pt"})
    (bad / "config.json").write_text((src / "config.json").read_text())
    plan, *_ = plan_checkpoint(bad)
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        plan.check()


def test_sdxl_shapes_and_defaults():
    """The zoo entry's SDXL config: the map reads it to the source's own defaults, and the
    source's params at it are diffusers' (built on the meta device: no memory), tensor for
    tensor in count and size (2,567,463,684 elements)."""
    import math

    import tomllib
    from diffusers import UNet2DConditionModel

    from linnet.weights.maps import find_weights_map

    with open("zoo/entries.toml", "rb") as f:
        hf = tomllib.load(f)["entries"]["sdxl-base-unet"]["config"]
    with torch.device("meta"):
        model = UNet2DConditionModel(**hf)
    full = json.loads(json.dumps(dict(model.config), default=list))
    config = find_weights_map("UNet2DConditionModel").translate_config(full)
    source = Source.load("zoo/unet.linnet")
    defaults = source.config({})
    assert {k: defaults[k] for k in config} == config
    shapes = source.params(source.config(config)).shapes
    want = sorted(math.prod(p.shape) for p in model.state_dict().values())
    got = sorted(math.prod(int(d.value) for d in t.shape) for t in shapes.values())
    assert got == want and sum(got) == sum(want)
