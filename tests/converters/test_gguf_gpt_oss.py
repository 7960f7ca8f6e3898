"""GPT-OSS GGUF export and import (issue 16), against llama.cpp, the gguf package and
transformers.

* The MXFP4 block layout: Linnet's ggml bytes (`mxfp4.to_ggml`) read by the gguf package's
  MXFP4 dequantizer give transformers' dequantized values on every code and every finite
  scale; the gguf package's own MXFP4 blocks read back through `from_ggml`.
* llama.cpp (llama-cpp-python, its `gpt-oss` architecture) on f32 exports of the tiny
  checkpoints (both routers; 24 positions over a window of 4, so sliding and full layers
  both matter): transformers' logits at every position and its greedy tokens. The tiny
  checkpoints here set YaRN's `truncate = true`: llama.cpp always rounds the ramp's bounds
  (ggml_rope_yarn_corr_dims), which transformers does only then (see docs/gpt-oss.md).
* An MXFP4 checkpoint: its experts go out as GGUF MXFP4 (type 39) from the stored blocks,
  the gguf package dequantizes them to exactly transformers' experts (gate and up taken
  apart, [out, in]), and llama.cpp gives transformers' greedy tokens, its logits within
  `MXFP4_LLAMA_CPP_TOL` (ggml multiplies MXFP4 by activations rounded to q8_0 blocks).
* Import: HF -> Linnet GGUF -> Linnet gives the params (bit for bit), config and logits of
  loading the HF folder, for the f32 and the MXFP4 checkpoint; GGUF -> HF is the f32 folder
  again.
"""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch

import linnet.gguf
import linnet.hf
import linnet.torch as lt
from linnet.backends.torch.mxfp4_experts import Mxfp4Experts
from linnet.weights import mxfp4
from tests.converters.test_export_hf import assert_bit_exact
from tests.numeric import assert_close
from tests.tiny_decoders import load_reference, probe_ids, reference_greedy, reference_logits
from tests.tiny_gpt_oss import GPT_OSS, VARIANTS, build_gpt_oss, to_mxfp4
from tests.weights.test_mxfp4 import hf_dequantize

LLAMA_CPP_TOL = 5e-4  # f32 weights and KV cache, as tests/converters/test_gguf.py
# llama.cpp's CPU MXFP4 matmul rounds the activations to q8_0 blocks; measured 0.86 on the
# "spread" tiny checkpoint (|logits| up to 60; q8_0 exports measured 1.32 there).
MXFP4_LLAMA_CPP_TOL = 1.3
TRUNCATED = dict(GPT_OSS, rope_truncate=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{variant: f32 folder} with llama.cpp's YaRN rounding, the MXFP4 copy of "spread",
    and the default tiny checkpoint (truncate = false)."""
    root = tmp_path_factory.mktemp("gpt-oss-gguf")
    out = {v: build_gpt_oss(v, root / "truncated", TRUNCATED) for v in VARIANTS}
    out["mxfp4"] = to_mxfp4(out["spread"], root / "truncated" / "mxfp4")
    out["untruncated"] = build_gpt_oss("spread", root)
    return out


@pytest.fixture(scope="module")
def ggufs(folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt-oss-gguf-files")
    return {
        name: linnet.gguf.export(src, root / f"{name}.gguf", dtype="f32", progress=False)
        for name, src in folders.items()
    }


def _llama(path):
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=64,
        logits_all=True,
        verbose=False,
        n_threads=torch.get_num_threads(),  # one per pytest worker under scripts/test.sh
        type_k=0,  # f32 KV cache
        type_v=0,
    )


def _llama_logits(path, ids: torch.Tensor) -> torch.Tensor:
    llm = _llama(path)
    llm.eval(ids.tolist())
    return torch.tensor(np.array(llm.scores[: len(ids)]))


def test_mxfp4_ggml_blocks_read_by_the_gguf_package_as_transformers_does():
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (2, 255, 3, 16), dtype=np.uint8)
    blocks[0, :, 0] = np.arange(256, dtype=np.uint8)[:255, None]  # both nibbles of each byte
    blocks[1, :, 0] = np.arange(1, 256, dtype=np.uint8)[:, None]
    # every scale byte but 255 (2^128: transformers gives inf, ggml's half-scale 2^127 * 2)
    scales = np.broadcast_to(np.arange(255, dtype=np.uint8)[:, None], (2, 255, 3)).copy()
    raw = mxfp4.to_ggml(blocks, scales)
    got = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType.MXFP4)
    want = np.swapaxes(hf_dequantize(blocks, scales), -1, -2)  # transformers' [.., R, G*32]
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    back = mxfp4.from_ggml(raw, 3 * 32)
    np.testing.assert_array_equal(back[0].reshape(blocks.shape), blocks)
    np.testing.assert_array_equal(back[1].reshape(scales.shape), scales)


def test_the_gguf_packages_mxfp4_blocks_read_back_exactly():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 128)) * np.exp(rng.uniform(-4, 4, (6, 1)))).astype(np.float32)
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4)
    blocks, scales = mxfp4.from_ggml(raw, 128)
    np.testing.assert_array_equal(mxfp4.dequantize_rows(blocks, scales).reshape(6, 128), want)


@pytest.mark.parametrize("variant", VARIANTS)
def test_llama_cpp_matches_transformers(folders, ggufs, variant):
    ids = probe_ids(256, (1, 24))[0]
    want = reference_logits(folders[variant], ids[None])[0]
    got = _llama_logits(ggufs[variant], ids)
    delta = float((got - want).abs().max())
    print(f"gpt-oss/{variant}: llama.cpp max |Δ| {delta:.3g} over {len(ids)} positions")
    assert_close(got, want, atol=LLAMA_CPP_TOL, what=f"llama.cpp logits, {variant}")
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def _gguf_tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def test_mxfp4_experts_are_written_as_stored_and_read_by_llama_cpp(folders, ggufs):
    tensors = _gguf_tensors(ggufs["mxfp4"])
    ref = load_reference(folders["mxfp4"])
    for i, layer in enumerate(ref.model.layers):
        gate_up = layer.mlp.experts.gate_up_proj.detach().transpose(1, 2)  # [E, 2F, D]
        want = {
            "gate": gate_up[:, 0::2],
            "up": gate_up[:, 1::2],
            "down": layer.mlp.experts.down_proj.detach().transpose(1, 2),
        }
        for part, w in want.items():
            t = tensors[f"blk.{i}.ffn_{part}_exps.weight"]
            assert t.tensor_type == gguf.GGMLQuantizationType.MXFP4
            got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(w.shape)
            np.testing.assert_array_equal(got, w.numpy(), err_msg=f"layer {i} {part}")
        assert tensors[f"blk.{i}.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    ids = probe_ids(256, (1, 24))[0]
    want = reference_logits(folders["mxfp4"], ids[None])[0]
    got = _llama_logits(ggufs["mxfp4"], ids)
    print(f"gpt-oss/mxfp4: llama.cpp max |Δ| {float((got - want).abs().max()):.3g}")
    assert_close(got, want, atol=MXFP4_LLAMA_CPP_TOL, what="llama.cpp logits, MXFP4 experts")
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_metadata_is_what_llama_cpp_reads(folders, ggufs):
    fields = gguf.GGUFReader(ggufs["mxfp4"]).fields
    hf = json.loads((folders["mxfp4"] / "config.json").read_text())
    rope = hf["rope_parameters"]

    def value(key):
        return fields[key].contents()

    assert value("general.architecture") == "gpt-oss"
    for key, want in {
        "expert_count": hf["num_local_experts"],
        "expert_used_count": hf["num_experts_per_tok"],
        "expert_feed_forward_length": hf["intermediate_size"],
        "attention.sliding_window": hf["sliding_window"],
        "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
    }.items():
        assert value(f"gpt-oss.{key}") == want, key
    assert value("gpt-oss.rope.scaling.type") == rope["rope_type"] == "yarn"
    assert value("gpt-oss.rope.scaling.factor") == pytest.approx(rope["factor"])


@pytest.mark.parametrize("name", ["untruncated", "mxfp4"])
def test_linnet_reads_its_gguf_as_the_hf_folder(folders, ggufs, name):
    """The GGUF loads the folder's params bit for bit. Its MXFP4 experts stay packed, as
    `linnet.torch.load` keeps the folder's: the same blocks and scales as the folder's,
    which dequantize to the folder's dense experts, and the same logits as the folder
    loaded packed (the same kernel on the same bytes: exactly); the dense load (another
    summation order) within 1e-4."""
    src, path = folders[name], ggufs[name]
    original, back = _load_dequantized(src), linnet.gguf.load(path)
    packed = lt.load(src, dtype="f32")
    assert back.config == original.config
    assert sorted(back.params) == sorted(original.params)
    for p, t in original.params.items():
        got, want = back.params[p], packed.params[p]
        assert type(got) is type(want), p
        if isinstance(want, Mxfp4Experts):
            assert torch.equal(got.blocks, want.blocks) and torch.equal(got.scales, want.scales)
            got = got.dequantize()
        assert torch.equal(got, t), p
    assert any(isinstance(t, Mxfp4Experts) for t in back.params.values()) == (name == "mxfp4")
    ids = probe_ids(256)
    want = packed.forward(ids)
    assert_close(back.forward(ids), want, atol=0, what=f"{name} logits")
    assert_close(want, original.forward(ids), atol=1e-4, what="packed against dense")


def _load_dequantized(folder):
    """A folder with every param dense (MXFP4 pairs dequantized at load)."""
    from linnet.runtime import TorchModel
    from linnet.weights.checkpoint import open_checkpoint

    ck = open_checkpoint(folder, dtype="f32")
    return TorchModel(ck.source, ck.config, ck.torch_params(), hf_config=ck.hf_config)


def test_gguf_to_hf_is_the_original_folder(folders, ggufs, tmp_path):
    out = linnet.hf.export(ggufs["untruncated"], tmp_path / "hf", progress=False)
    assert_bit_exact(folders["untruncated"], out)
    ids = probe_ids(256)
    assert_close(reference_logits(out, ids), reference_logits(folders["untruncated"], ids), atol=0)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0"])
def test_typed_exports_keep_mxfp4_experts_and_the_first_token(folders, tmp_path, dtype):
    """Experts stay MXFP4 whatever the dtype; biases and the router stay f32 (as llama.cpp's
    converter writes them); llama.cpp picks transformers' next token after the probe."""
    path = linnet.gguf.export(
        folders["mxfp4"], tmp_path / f"{dtype}.gguf", dtype=dtype, progress=False
    )
    Q = gguf.GGMLQuantizationType
    for name, t in _gguf_tensors(path).items():
        if "_exps.weight" in name:
            want = Q.MXFP4
        elif name.endswith((".bias", "ffn_gate_inp.weight")) or len(t.shape) == 1:
            want = Q.F32
        else:
            want = Q[dtype.upper()]
        assert t.tensor_type == want, name
    ids = probe_ids(256, (1, 24))[0]
    want = reference_logits(folders["mxfp4"], ids[None])[0, -1]
    got = _llama_logits(path, ids)[-1]
    print(f"gpt-oss/mxfp4 {dtype}: llama.cpp last-position max |Δ| {(got - want).abs().max():.3g}")
    assert int(got.argmax()) == int(want.argmax())


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_gguf_reexport_copies_the_mxfp4_bytes(folders, tmp_path, dtype):
    """GGUF -> GGUF: the experts' MXFP4 bytes are written as the file holds them, even a
    block that re-quantizing would store differently (zero codes at scale 2^3)."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "odd"
    shutil.copytree(folders["mxfp4"], folder)
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.1.mlp.experts.down_proj"
    tensors[name + "_blocks"][2, 5, 0] = 0
    tensors[name + "_scales"][2, 5, 0] = 130
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    first = linnet.gguf.export(folder, tmp_path / "first.gguf", dtype="f32", progress=False)
    again = linnet.gguf.export(first, tmp_path / "again.gguf", dtype=dtype, progress=False)
    before, after = _gguf_tensors(first), _gguf_tensors(again)
    assert sorted(before) == sorted(after)
    experts = [n for n, t in before.items() if t.tensor_type == gguf.GGMLQuantizationType.MXFP4]
    assert len(experts) == 3 * GPT_OSS["n_layers"]
    for n in experts:
        assert after[n].tensor_type == before[n].tensor_type, n
        assert np.array_equal(np.asarray(after[n].data), np.asarray(before[n].data)), n
    blocks, scales = mxfp4.from_ggml(np.asarray(before["blk.1.ffn_down_exps.weight"].data), 32)
    assert scales.reshape(4, 64, 1)[2, 5, 0] == 130  # the odd block is there, kept
    requantized = mxfp4.quantize(mxfp4.dequantize(tensors[name + "_blocks"],
                                                  tensors[name + "_scales"]))  # fmt: skip
    assert not np.array_equal(requantized[1], tensors[name + "_scales"])


@pytest.mark.parametrize("backend", ["jax", "onnx"])
@pytest.mark.parametrize("name", ["spread", "mxfp4"])
def test_jax_and_onnx_run_the_gguf_as_transformers(folders, ggufs, tmp_path, backend, name):
    """A GPT-OSS GGUF (f32; MXFP4 experts) on JAX and ONNX Runtime: transformers' logits on
    the HF folder within 1e-4 and its greedy tokens."""
    import linnet.jax
    import linnet.onnx

    path = ggufs[name]
    if backend == "jax":
        model = linnet.jax.load(path, dtype="f32")
    else:
        model = linnet.onnx.load(linnet.onnx.export(path, tmp_path / "onnx", progress=False))
    probe = probe_ids(256)
    want = reference_logits(folders[name], probe)
    got = torch.from_numpy(np.array(model.forward(probe.numpy())))
    assert_close(got, want, atol=1e-4, what=f"{backend} logits of {name}.gguf")
    ids = probe_ids(256, (1, 12), seed=3)
    greedy = reference_greedy(folders[name], ids, 8)
    assert np.asarray(model.generate(ids.numpy(), 8)).tolist() == greedy.tolist()
