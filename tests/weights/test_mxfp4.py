"""MXFP4 (issue 16): Linnet's dequantizer and quantizer against transformers' dequantizer,
GPT-OSS checkpoints whose experts are `_blocks`/`_scales` pairs planned from headers and
loaded exactly (every backend against transformers on the same file), and HF exports that
write the pairs back bit-exact, even blocks that re-quantizing would store differently.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import linnet.hf
import linnet.jax
import linnet.onnx
import linnet.torch as lt
from linnet.weights import mxfp4
from linnet.weights.planning import plan_checkpoint
from tests.numeric import assert_close
from tests.tiny_decoders import load_reference, probe_ids, reference_logits
from tests.tiny_gpt_oss import build_gpt_oss, to_mxfp4


def hf_dequantize(blocks, scales, dtype=torch.float32) -> np.ndarray:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    out = convert_moe_packed_tensors(
        torch.from_numpy(blocks), torch.from_numpy(scales), dtype=dtype
    )
    return out.float().numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_equals_transformers_on_every_code_and_scale(dtype):
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (2, 256, 3, 16), dtype=np.uint8)
    blocks[0, :, 0] = np.arange(256, dtype=np.uint8)[:, None]  # every byte: both nibbles
    scales = np.broadcast_to(np.arange(256, dtype=np.uint8)[:, None], (2, 256, 3)).copy()
    want = hf_dequantize(blocks, scales, dtype)
    got = torch.from_numpy(mxfp4.dequantize(blocks, scales)).to(dtype).float().numpy()
    np.testing.assert_array_equal(got, want)  # inf where 2^128 overflows, on both sides
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))  # -0.0 too


def test_quantize_picks_the_nearest_code_at_the_ocp_scale():
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((3, 64, 5)) * np.exp(rng.uniform(-6, 6, (3, 1, 5)))).astype(np.float32)
    w[0, :32, 0] = 0.0  # an all-zero block
    blocks, scales = mxfp4.quantize(w)
    got = hf_dequantize(blocks, scales)  # transformers reads what Linnet wrote
    rows = np.swapaxes(w, -1, -2).reshape(3, 5, 2, 32)
    amax = np.abs(rows).max(-1)
    want_scale = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, -127)
    np.testing.assert_array_equal(scales.astype(int) - 127, want_scale.astype(int))
    grid = np.ldexp(
        mxfp4.CODES[None, None, None, :], want_scale[..., None].astype(np.int32)
    )  # (3, 5, 2, 16)
    best = np.abs(rows[..., None] - grid[..., None, :]).min(-1)  # nearest representable
    err = np.abs(np.swapaxes(got, -1, -2).reshape(3, 5, 2, 32) - rows)
    assert (err <= best).all(), f"not the nearest code: worst excess {(err - best).max()}"


def test_quantize_round_trips_what_it_wrote():
    rng = np.random.default_rng(2)
    blocks, scales = mxfp4.quantize(rng.standard_normal((2, 96, 7)).astype(np.float32))
    again = mxfp4.quantize(mxfp4.dequantize(blocks, scales))
    np.testing.assert_array_equal(again[0], blocks)
    np.testing.assert_array_equal(again[1], scales)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The f32 tiny checkpoint, its MXFP4 copy, and that copy with one block stored the way
    quantize would not (all zero codes at scale 2^3): re-quantizing would change its bytes."""
    root = tmp_path_factory.mktemp("mxfp4")
    dense = build_gpt_oss("spread", root)
    packed = to_mxfp4(dense, root / "mxfp4")
    tensors = load_file(packed / "model.safetensors")
    name = "model.layers.1.mlp.experts.down_proj"
    tensors[name + "_blocks"][2, 5, 0] = 0
    tensors[name + "_scales"][2, 5, 0] = 130
    save_file(tensors, packed / "model.safetensors", metadata={"format": "pt"})
    return dense, packed


def test_the_plan_reads_headers_only_and_names_each_pair(folders):
    _, packed = folders
    plan, _, config, hf_config = plan_checkpoint(packed)
    plan.check()
    rows = {r.hf: r for r in plan.rows}
    assert "model.layers.0.mlp.experts.gate_up_proj" in rows
    assert not [n for n in rows if n.endswith(("_blocks", "_scales"))]
    assert rows["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 64, 64)
    assert hf_config["quantization_config"]["quant_method"] == "mxfp4"


def test_loaded_experts_equal_transformers_dequantized(folders):
    _, packed = folders
    params = lt.load(packed, dtype="f32").params
    ref = load_reference(packed)
    for i, layer in enumerate(ref.model.layers):
        for ours, theirs in (("experts_in", "gate_up_proj"), ("experts_out", "down_proj")):
            want = getattr(layer.mlp.experts, theirs).detach()
            assert torch.equal(params[f"layers.{i}.{ours}"], want), f"layer {i} {theirs}"


@pytest.mark.parametrize("backend", ["torch", "jax", "onnx"])
def test_mxfp4_checkpoint_matches_transformers(folders, tmp_path, backend):
    dense, packed = folders
    ids = probe_ids(256)
    want = reference_logits(packed, ids)
    assert float((want - reference_logits(dense, ids)).abs().max()) > 1e-1  # not vacuous
    if backend == "torch":
        got = lt.load(packed, dtype="f32").forward(ids)
    elif backend == "jax":
        got = torch.from_numpy(
            np.asarray(linnet.jax.load(packed, dtype="f32").forward(ids.numpy()))
        )
    else:
        model = linnet.onnx.load(linnet.onnx.export(packed, tmp_path / "onnx", progress=False))
        got = torch.from_numpy(np.asarray(model.forward(ids.numpy())))
    assert_close(got, want, atol=1e-4, what=f"{backend} logits on the MXFP4 checkpoint")


def test_hf_export_writes_the_pairs_back_bit_exact(folders, tmp_path):
    _, packed = folders
    original = load_file(packed / "model.safetensors")
    name = "model.layers.1.mlp.experts.down_proj"
    requantized = mxfp4.quantize(
        mxfp4.dequantize(original[name + "_blocks"], original[name + "_scales"])
    )
    assert not np.array_equal(requantized[1], original[name + "_scales"])  # would differ
    out = linnet.hf.export(packed, tmp_path / "export", progress=False)
    written = load_file(out / "model.safetensors")
    assert sorted(written) == sorted(original)
    for key, value in original.items():
        assert written[key].dtype == value.dtype and np.array_equal(written[key], value), key
    config = json.loads((out / "config.json").read_text())
    assert (
        config["quantization_config"]
        == json.loads((packed / "config.json").read_text())["quantization_config"]
    )
    ids = probe_ids(256)
    torch.testing.assert_close(
        reference_logits(out, ids), reference_logits(packed, ids), rtol=0, atol=0
    )


def test_plan_of_a_20b_shaped_header_only_checkpoint(tmp_path, monkeypatch):
    """The zoo entry's real shapes, MXFP4 experts, no data: `linnet plan` maps every tensor
    (about 20.9B params, as the entry says) with every read of tensor data refused."""
    from click.testing import CliRunner
    from linnet.zoo.registry import registry

    from linnet.cli import main
    from linnet.weights.safetensors_io import Checkpoint
    from tests.tiny_gpt_oss import MXFP4_CONFIG, write_header_only

    entry = registry().get("gpt-oss-20b")
    hf = dict(entry.config, architectures=["GptOssForCausalLM"], model_type="gpt_oss")
    hf["quantization_config"] = MXFP4_CONFIG
    folder = write_header_only(tmp_path / "gpt-oss-20b", hf)

    def refuse(self, name):
        raise AssertionError(f"tensor data read: {name}")

    monkeypatch.setattr(Checkpoint, "read", refuse)
    monkeypatch.setattr(Checkpoint, "read_numpy", refuse)
    result = CliRunner().invoke(main, ["plan", str(folder)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "model.layers.23.mlp.experts.gate_up_proj  " in out
    assert "[32, 2880, 5760]" in out and "[32, 2880, 2880]" in out
    plan, *_ = plan_checkpoint(folder)
    total = sum(int(np.prod(r.shape)) for r in plan.rows)
    assert abs(total / 20.9e9 - 1) < 0.03, total


def test_quantize_rounds_like_ml_dtypes_float4_e2m1():
    """Each element, at its block's scale, is rounded as ml_dtypes casts to float4_e2m1fn
    (round half to even): exact midpoints between codes decide it, which random data misses."""
    import ml_dtypes

    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    rng = np.random.default_rng(3)
    rows = np.concatenate([ties, -ties, rng.uniform(-6, 6, 17).astype(np.float32), [4.0]])
    w = np.stack([rows * 2.0**k for k in (-3, 0, 5)])[:, :, None]  # 3 blocks of 32, amax 6
    blocks, scales = mxfp4.quantize(w)
    np.testing.assert_array_equal(scales, 127 + np.array([-3, 0, 5]).reshape(3, 1, 1))
    want = np.stack([(rows.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)) * 2.0**k
                     for k in (-3, 0, 5)])[:, :, None]  # fmt: skip
    np.testing.assert_array_equal(mxfp4.dequantize(blocks, scales), want)
