"""GPT-OSS (issue 16) on tiny random GptOssForCausalLM checkpoints (tests/tiny_gpt_oss.py)
against transformers (f32, eager), on PyTorch (interpreter and generated code), JAX and
ONNX Runtime: forward logits, prefill + decode steps, greedy tokens, chunks across the
window; two routers (tokens spread over the experts, every token to the same two).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from linnet.zoo import source_path
from safetensors.torch import load_file, save_file

import linnet.jax
import linnet.onnx
import linnet.torch as lt
from tests.numeric import assert_close
from tests.tiny_decoders import probe_ids, reference_greedy, reference_logits
from tests.tiny_gpt_oss import VARIANTS, build_gpt_oss

TOL = 1e-4
PREFILL = 10  # of the 24-token probe: decode steps run past the window of 4
BACKENDS = ("torch-interpret", "torch-generated", "jax", "onnx")


def _load(path, backend: str, tmp_path):
    if backend.startswith("torch"):
        return lt.load(path, dtype="f32", mode=backend.split("-")[1])
    if backend == "jax":
        return linnet.jax.load(path, dtype="f32")
    return linnet.onnx.load(linnet.onnx.export(path, tmp_path / "onnx", progress=False))


def _ids(backend: str, ids: torch.Tensor):
    return ids if backend.startswith("torch") else ids.numpy()


def _close(got, want, what: str) -> float:
    got = torch.as_tensor(np.asarray(got.detach() if hasattr(got, "detach") else got))
    return assert_close(got, torch.as_tensor(np.asarray(want)), atol=TOL, what=what)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt-oss")
    return {variant: build_gpt_oss(variant, root) for variant in VARIANTS}


@torch.no_grad()
def _router_choices(path) -> list[set[int]]:
    """Per layer, the experts transformers' router picks for the probe's tokens."""
    from tests.tiny_decoders import load_reference

    model = load_reference(path)
    out = model(input_ids=probe_ids(256), output_router_logits=True)
    k = model.config.num_experts_per_tok
    return [set(torch.topk(r, k, dim=-1).indices.flatten().tolist()) for r in out.router_logits]


def test_the_routers_route_as_claimed(folders):
    assert all(c == {0, 1} for c in _router_choices(folders["one_expert"]))
    assert all(c == {0, 1, 2, 3} for c in _router_choices(folders["spread"]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_and_decode_match_transformers(folders, tmp_path, variant, backend):
    path = folders[variant]
    model = _load(path, backend, tmp_path)
    ids = probe_ids(256)
    want = reference_logits(path, ids)
    _close(model.forward(_ids(backend, ids)), want, f"{backend} forward")
    model.reset()
    last = model.decode(_ids(backend, ids[:, :PREFILL]), 0)
    _close(last, want[:, PREFILL - 1], f"{backend} prefill")
    for pos in range(PREFILL, ids.shape[1]):
        last = model.decode(_ids(backend, ids[:, pos : pos + 1]), pos)
        _close(last, want[:, pos], f"{backend} decode at {pos}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_match_transformers(folders, tmp_path, variant, backend):
    path = folders[variant]
    ids = probe_ids(256, (1, 12), seed=3)
    want = reference_greedy(path, ids, 8)
    got = _load(path, backend, tmp_path).generate(_ids(backend, ids), 8)
    assert np.asarray(got).tolist() == want.tolist()


def test_decode_chunks_equal_forward(folders):
    """Prefill in uneven chunks (S > 1 at P > 0) across the window of the sliding layers."""
    model = lt.load(folders["spread"], dtype="f32")
    ids = probe_ids(256)
    full = model.forward(ids)
    model.reset()
    bounds = [0, 5, 6, 13, ids.shape[1]]
    for lo, hi in zip(bounds, bounds[1:]):
        _close(model.decode(ids[:, lo:hi], lo), full[:, hi - 1], f"chunk {lo}:{hi}")


@pytest.mark.parametrize(
    "change",
    [{"window": 0}, {"full_every": 1}, {"full_every": 4}, {"rope_scaling": "default"}, "sinks"],
    ids=["no-window", "all-full", "all-sliding", "no-yarn", "no-sinks"],
)
def test_each_feature_changes_the_logits(folders, change):
    """Windows, the alternation, YaRN and the sinks each move the logits by far more than
    the tolerance, so the parity tests above exercise them."""
    model = lt.load(folders["spread"], dtype="f32")
    params, config = dict(model.params), dict(model.config)
    if change == "sinks":
        params.update({k: torch.zeros_like(v) for k, v in params.items() if k.endswith("sinks")})
    else:
        config.update(change)
    other = lt.load_source(source_path("gpt_oss"), config, params)
    ids = probe_ids(256)
    assert float((other.forward(ids) - model.forward(ids)).abs().max()) > 1e-2


@pytest.fixture(scope="module")
def poisoned(folders, tmp_path_factory):
    """The one_expert checkpoint with NaN in experts 2 and 3, which its router never picks."""
    path = tmp_path_factory.mktemp("poisoned") / "one_expert"
    shutil.copytree(folders["one_expert"], path)
    tensors = load_file(path / "model.safetensors")
    for name, t in tensors.items():
        if ".mlp.experts." in name:
            t[2:] = float("nan")
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_reads_only_the_chosen_experts(folders, poisoned, tmp_path, backend):
    """Every backend's decode, and the prefill but on JAX (which runs many tokens through
    every expert, static shapes), gives transformers' logits with the unchosen experts NaN."""
    model = _load(poisoned, backend, tmp_path)
    ids = probe_ids(256)
    want = reference_logits(folders["one_expert"], ids)
    if backend != "jax":
        _close(model.forward(_ids(backend, ids)), want, f"{backend} forward")
    model.reset()
    model.decode(_ids(backend, ids[:, :1]), 0)
    for pos in range(1, 8):
        last = model.decode(_ids(backend, ids[:, pos : pos + 1]), pos)
        _close(last, want[:, pos], f"{backend} decode at {pos}")
