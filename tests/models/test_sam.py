"""SAM (zoo/sam.linnet, issue 15) against transformers' SamModel.

Tiny random SamModel checkpoints that transformers builds and saves (tests/tiny_sam.py):
"padded" has a 10 x 10 patch grid in windows of 4, so windowed layers pad it to 12 x 12 and
crop it back, with global attention at layer 2; "even" has an 8 x 8 grid (no padding),
globals at 1 and 3, no qkv bias, a 4-deep IoU head. Weights are drawn off transformers'
initialization (zero position tables, unit norms). f32, batch 2:
- `embed_image` within 1e-5 of SamModel.get_image_embeddings;
- masks and IoU scores within 1e-5 of SamModel(image_embeddings=..., multimask_output=True)
  for points with labels 1, 0, -1 and -10 (padding) plus boxes, points alone (SamModel's
  padding point) and boxes alone, 3 prompts per image;
on PyTorch (interpret, generated, generated with fast numerics), JAX and ONNX Runtime; the
HF export is bit-exact and transformers reads it back to the same masks; bad configs are
refused naming the key.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import linnet.hf  # noqa: E402
import linnet.torch as lt  # noqa: E402
from linnet.check.elaborate import check_source  # noqa: E402
from linnet.errors import ConfigError  # noqa: E402
from linnet.source import Source  # noqa: E402
from tests.numeric import assert_close  # noqa: E402
from tests.tiny_sam import VARIANTS, build_sam  # noqa: E402

TOL = 1e-5
B, Q, K = 2, 3, 2
LABELS = torch.tensor([[[1, 0], [1, -1], [0, -10]], [[1, 1], [-1, 0], [1, -10]]])
# prompt kind -> (masks entry, IoU entry, SamModel keywords, entry arguments)
KINDS = {
    "points+boxes": ("predict_masks", "predict_iou", ("points", "labels", "boxes")),
    "points": ("point_masks", "point_iou", ("points", "labels")),
    "boxes": ("box_masks", "box_iou", ("boxes",)),
}
HF_NAMES = {"points": "input_points", "labels": "input_labels", "boxes": "input_boxes"}


def inputs(config, seed: int = 3) -> dict:
    """Pixels, image embeddings and prompts in the input frame (image_size pixels)."""
    g = torch.Generator().manual_seed(seed)
    size = config.vision_config.image_size
    e = config.prompt_encoder_config.image_embedding_size
    corners = torch.sort(torch.rand(B, Q, 2, 2, generator=g) * size, dim=2).values
    return dict(
        pixels=torch.randn(B, 3, size, size, generator=g),
        embeddings=torch.randn(B, config.vision_config.output_channels, e, e, generator=g),
        points=torch.rand(B, Q, K, 2, generator=g) * size,
        labels=LABELS,
        boxes=corners.reshape(B, Q, 4),
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from transformers import SamModel

    root = tmp_path_factory.mktemp("sam")
    cache = {}

    def get(name):
        if name not in cache:
            folder = build_sam(root / name, name)
            ref = SamModel.from_pretrained(folder, trust_remote_code=False).eval()
            cache[name] = folder, ref, inputs(ref.config)
        return cache[name]

    return get


@torch.no_grad()
def expected(ref, data, kind):
    """(image embeddings, masks, IoU scores) from transformers for one prompt kind."""
    kw = {HF_NAMES[k]: data[k] for k in KINDS[kind][2]}
    out = ref(image_embeddings=data["embeddings"], multimask_output=True, **kw)
    return ref.get_image_embeddings(data["pixels"]), out.pred_masks, out.iou_scores


def check(what, got, want, tol=TOL) -> None:
    got = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.array(got))
    delta = assert_close(got, want, atol=tol, what=what, dtype=True)  # NaN fails
    print(f"{what}: max |Δ| = {delta:.2e} (|ref| up to {want.abs().max():.2f})")


def run_all(model, ref, data, label, convert=lambda t: t) -> None:
    """Every entry of `model` on `data`, against transformers' `ref`."""
    want_image, *_ = expected(ref, data, "boxes")
    check(f"{label} embed_image", model.run("embed_image", convert(data["pixels"])), want_image)
    for kind, (masks, iou, args) in KINDS.items():
        _, want_masks, want_iou = expected(ref, data, kind)
        ins = [convert(data["embeddings"])] + [convert(data[a]) for a in args]
        check(f"{label} {kind} masks", model.run(masks, *ins), want_masks)
        check(f"{label} {kind} iou", model.run(iou, *ins), want_iou)


@pytest.mark.parametrize(
    "mode, numerics",
    [("interpret", "equivalent"), ("generated", "equivalent"), ("generated", "fast")],
)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_torch_matches_transformers(built, name, mode, numerics):
    folder, ref, data = built(name)
    model = lt.load(folder, mode=mode, numerics=numerics)
    assert set(model.entries) >= {"embed_image", "predict_masks", "predict_iou"}
    run_all(model, ref, data, f"{name} {mode}/{numerics}")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_jax_matches_transformers(built, name):
    import linnet.jax as lj

    folder, ref, data = built(name)
    run_all(lj.load(folder), ref, data, f"{name} jax", convert=lambda t: t.numpy())


@pytest.mark.parametrize("name", list(VARIANTS))
def test_onnx_matches_transformers(built, tmp_path, name):
    import linnet.onnx

    folder, ref, data = built(name)
    model = linnet.onnx.load(linnet.onnx.export(folder, tmp_path / "onnx", progress=False))
    run_all(model, ref, data, f"{name} onnx", convert=lambda t: t.numpy())


def test_the_source_checks_clean():
    assert check_source(Source.load("zoo/sam.linnet").module) == []


def test_hf_export_round_trips_bit_exactly(built, tmp_path):
    from safetensors.torch import load_file
    from transformers import SamModel

    src, ref, data = built("padded")
    original = load_file(src / "model.safetensors")
    for how, what in (("path", src), ("model", lt.load(src))):
        out = linnet.hf.export(what, tmp_path / how, progress=False)
        got = load_file(out / "model.safetensors")
        assert set(got) == set(original)
        for k in original:
            assert got[k].dtype == original[k].dtype and torch.equal(got[k], original[k]), k
        back = SamModel.from_pretrained(out, trust_remote_code=False).eval()
        for kind in KINDS:
            _, want_masks, want_iou = expected(ref, data, kind)
            _, masks, iou = expected(back, data, kind)
            assert torch.equal(masks, want_masks) and torch.equal(iou, want_iou), kind


def test_config_round_trips_through_the_map(built):
    from transformers import SamConfig

    from linnet.weights.maps import find_weights_map

    folder = built("even")[0]
    hf = json.loads((folder / "config.json").read_text())
    wmap = find_weights_map("SamModel")
    config = wmap.translate_config(hf)
    assert config["global_every"] == 2 and config["window"] == 4 and config["qkv_bias"] is False
    written = wmap.config_to_hf(config)
    assert wmap.translate_config(written) == config
    rebuilt = SamConfig(**written)
    assert rebuilt.vision_config.global_attn_indexes == [1, 3]


@pytest.mark.parametrize(
    "section, key, value, named",
    [
        ("vision_config", "global_attn_indexes", [0, 2], "vision_config.global_attn_indexes"),
        ("mask_decoder_config", "num_multimask_outputs", 4, "num_multimask_outputs"),
        ("mask_decoder_config", "hidden_act", "gelu", "mask_decoder_config.hidden_act"),
        ("vision_config", "hidden_act", "gelu_new", "vision_config.hidden_act"),
        ("mask_decoder_config", "hidden_size", 24, "mask_decoder_config.hidden_size"),
        ("vision_config", "window_size", 0, "vision_config.window_size"),
        ("vision_config", "num_pos_feats", 8, "vision_config.num_pos_feats"),
    ],
)
def test_bad_configs_are_refused_naming_the_key(built, tmp_path, section, key, value, named):
    import shutil

    src = built("padded")[0]
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    hf = json.loads((bad / "config.json").read_text())
    hf[section][key] = value
    (bad / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError) as err:
        lt.load(bad)
    assert named in str(err.value)
