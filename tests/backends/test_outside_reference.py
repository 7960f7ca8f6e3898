"""Every fast path against an outside reference on the same weights and inputs.

The backend tests compare ONNX Runtime with Linnet's PyTorch interpreter, and the generated,
compiled and GGUF paths with the interpreter: a bug the interpreter shares would pass them.
Here each path meets transformers itself (issue 22):

* ONNX Runtime (`linnet.onnx`) on every tiny variant: forward logits, and prefill plus
  decode steps against transformers' logits at the same positions.
* PyTorch `mode="generated"` (both numerics) on every tiny variant, and `mode="compile"`
  on one (slow: the compile warm-up), the same way.
* A GGUF export loaded by Linnet (PyTorch generated, JAX, ONNX Runtime) against
  transformers' GGUF loader on the same file.

The JAX-only environment (no torch, so no transformers) compares with transformers' logits
written beforehand by the main environment: scripts/check_jax_only.sh.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import linnet.gguf
import linnet.jax
import linnet.onnx
import linnet.torch as lt
from tests.checkpoints import probe_ids, reference_logits, tiny_variants

F32_TOL = 1e-4  # f32 logits, every position
FAST_TOL = 1e-3  # numerics="fast": SDPA and fused norms reorder sums
# ONNX Runtime's sgemm sums in another order than torch's (tests/backends/test_onnx.py:
# measured 1.28e-4 on SmolLM2's forward); on the tiny variants the last position and the
# decode steps stay within F32_TOL.
ORT_FORWARD_TOL = 2e-4
PREFILL = 12  # of the probe's 24 tokens; the rest are decoded one at a time
VARIANTS = tiny_variants()
IDS = [f"{a}-{v}" for a, v in VARIANTS]


def max_delta(got, want) -> float:
    """max |got - want| as a float (NaN stays NaN, so `<=` fails on it)."""
    got = np.asarray(got.detach() if isinstance(got, torch.Tensor) else got, np.float32)
    return float(np.abs(got - np.asarray(want, np.float32)).max())


def assert_decoder_matches(model, want: np.ndarray, ids: np.ndarray, tol, as_input) -> None:
    """`model.forward(ids)` within `tol[0]` of transformers' logits `want` at every position,
    then a prefill of PREFILL tokens and one decode step per remaining token, each within
    `tol[1]` of `want` at its position. `as_input` turns numpy ids into the backend's input."""
    forward_tol, decode_tol = tol
    delta = max_delta(model.forward(as_input(ids)), want)
    assert delta <= forward_tol, f"forward max |Δ| {delta:.3g} > {forward_tol}"
    model.reset()
    last = model.decode(as_input(ids[:, :PREFILL]), 0)
    delta = max_delta(last, want[:, PREFILL - 1])
    assert delta <= decode_tol, f"prefill max |Δ| {delta:.3g} > {decode_tol}"
    for pos in range(PREFILL, ids.shape[1]):
        last = model.decode(as_input(ids[:, pos : pos + 1]), pos)
        delta = max_delta(last, want[:, pos])
        assert delta <= decode_tol, f"decode at {pos}: max |Δ| {delta:.3g} > {decode_tol}"


def _probe(path: Path, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    ids = probe_ids(vocab)
    return ids.numpy(), reference_logits(path, ids).numpy()


@pytest.mark.parametrize("arch,variant", VARIANTS, ids=IDS)
def test_onnx_runtime_matches_transformers(tiny_checkpoint, tmp_path, arch, variant):
    src = tiny_checkpoint(arch, variant)
    model = linnet.onnx.load(linnet.onnx.export(src, tmp_path / "onnx", progress=False))
    ids, want = _probe(src, model.config["vocab"])
    assert_decoder_matches(model, want, ids, (ORT_FORWARD_TOL, F32_TOL), lambda x: x)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("arch,variant", VARIANTS, ids=IDS)
def test_generated_mode_matches_transformers(tiny_checkpoint, arch, variant, numerics):
    src = tiny_checkpoint(arch, variant)
    model = lt.load(src, dtype="f32", mode="generated", numerics=numerics)
    ids, want = _probe(src, model.config["vocab"])
    tol = F32_TOL if numerics == "equivalent" else FAST_TOL
    with torch.no_grad():
        assert_decoder_matches(model, want, ids, (tol, tol), torch.from_numpy)


@pytest.mark.slow  # torch.compile's warm-up
def test_compile_mode_matches_transformers(tiny_checkpoint):
    src = tiny_checkpoint("LlamaForCausalLM", "base")
    model = lt.load(src, dtype="f32", mode="compile")
    ids, want = _probe(src, model.config["vocab"])
    with torch.no_grad():
        assert_decoder_matches(model, want, ids, (F32_TOL, F32_TOL), torch.from_numpy)


@pytest.fixture(scope="module")
def q8_gguf(tiny_checkpoint, tmp_path_factory):
    """A q8_0 GGUF of the tiny Llama (one of the variants transformers' GGUF loader reads),
    and transformers' logits on it."""
    from tests.converters.test_gguf import _transformers_gguf

    src = tiny_checkpoint("LlamaForCausalLM", "base")
    path = tmp_path_factory.mktemp("gguf") / "tiny.q8_0.gguf"
    linnet.gguf.export(src, path, dtype="q8_0", progress=False)
    ids = probe_ids(256)
    with torch.no_grad():
        want = _transformers_gguf(path)(input_ids=ids).logits
    return path, ids.numpy(), want.numpy()


@pytest.mark.parametrize("backend", ["torch-interpret", "torch-generated", "jax", "onnx"])
def test_gguf_loaded_model_matches_transformers_gguf(q8_gguf, tmp_path, monkeypatch, backend):
    """Linnet's GGUF import, on each backend, against transformers' GGUF loader on the same
    q8_0 file: both dequantize the same blocks, so f32 tolerances hold."""
    path, ids, want = q8_gguf
    monkeypatch.setenv("LINNET_CACHE", str(tmp_path / "cache"))  # the ONNX export's home
    tol = (F32_TOL, F32_TOL)
    if backend.startswith("torch"):
        model = lt.load(path, dtype="f32", mode=backend.split("-")[1])
        with torch.no_grad():
            assert_decoder_matches(model, want, ids, tol, torch.from_numpy)
    elif backend == "jax":
        assert_decoder_matches(linnet.jax.load(path, dtype="f32"), want, ids, tol, lambda x: x)
    else:
        model = linnet.onnx.load(path)
        assert_decoder_matches(model, want, ids, (ORT_FORWARD_TOL, F32_TOL), lambda x: x)
