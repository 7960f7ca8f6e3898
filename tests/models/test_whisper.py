"""Whisper (zoo/whisper.linnet) against transformers, on tiny random checkpoints.

Both configurations (`tiny`: 80 mel bins; `large-v3`: 128, tests/tiny_whisper.py), built by
transformers and loaded like any checkpoint, on PyTorch (interpret and generated), JAX and
ONNX Runtime: the encoder output, every position's logits of `forward`, the last-position
logits of `decode` after `encode`, all within 1e-4 of transformers f32 on a batch of 2; 32
greedy tokens identical to transformers' `generate` (Whisper's rules off: the plain greedy
loop; the rules are tested in tests/models/test_whisper_transcribe.py).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import linnet.torch as lt  # noqa: E402
from linnet.errors import LinnetError  # noqa: E402
from tests.numeric import assert_close  # noqa: E402
from tests.tiny_whisper import WHISPER_CONFIGS, build_tiny_whisper, greedy_reference  # noqa: E402

F32_TOL = 1e-4
STEPS = 32


@pytest.fixture(scope="module")
def whisper_root(tmp_path_factory):
    return tmp_path_factory.mktemp("whisper")


@pytest.fixture(scope="module", params=sorted(WHISPER_CONFIGS))
def case(request, whisper_root):
    """(folder, mel, prompt, transformers' outputs) for one configuration."""
    name = request.param
    folder = build_tiny_whisper(name, whisper_root)
    hf, mel, prompt, encoder, tokens = greedy_reference(folder, name, STEPS)
    with torch.no_grad():
        ref = dict(
            encoder=encoder,
            logits=hf(input_features=mel, decoder_input_ids=prompt).logits,
            first=hf(input_features=mel, decoder_input_ids=prompt[:, :1]).logits[:, -1],
            tokens=tokens,
        )
    return name, folder, mel, prompt, ref


def _np(x):
    return np.asarray(x.cpu() if hasattr(x, "cpu") else x)


def check_model(model, mel, prompt, ref, what: str) -> None:
    """Every output of one loaded model against transformers' on the same inputs."""
    mel_in, prompt_in = _np(mel), _np(prompt)
    if isinstance(model, lt.TorchModel):
        mel_in, prompt_in = mel, prompt
    enc = model.encode(mel_in)
    assert_close(_np(enc), _np(ref["encoder"]), atol=F32_TOL, what=f"{what} encoder")
    first = model.decode(prompt_in[:, :1], 0)
    assert_close(_np(first), _np(ref["first"]), atol=F32_TOL, what=f"{what} first token")
    logits = model.forward(mel_in, prompt_in)
    assert_close(_np(logits), _np(ref["logits"]), atol=F32_TOL, what=f"{what} forward")
    out = _np(model.generate(mel_in, prompt_in, STEPS))[:, prompt.shape[1] :]
    np.testing.assert_array_equal(out, _np(ref["tokens"]), err_msg=f"{what} greedy tokens")


@pytest.mark.parametrize("mode", ["interpret", "generated"])
def test_torch_matches_transformers(case, mode):
    name, folder, mel, prompt, ref = case
    model = lt.load(folder, mode=mode)
    assert type(model).__name__ == "Seq2SeqModel"
    check_model(model, mel, prompt, ref, f"{name} torch {mode}")


def test_decode_steps_equal_forward(case):
    """A prompt decoded one token at a time gives forward's logits at each position."""
    name, folder, mel, prompt, ref = case
    model = lt.load(folder)
    model.encode(mel)
    for pos in range(prompt.shape[1]):
        step = model.decode(prompt[:, pos : pos + 1], pos)
        assert_close(step, ref["logits"][:, pos], atol=F32_TOL, what=f"{name} decode at {pos}")


def test_jax_matches_transformers(case):
    pytest.importorskip("jax")
    import linnet.jax

    name, folder, mel, prompt, ref = case
    check_model(linnet.jax.load(folder), mel, prompt, ref, f"{name} jax")


def test_onnx_matches_transformers(case, tmp_path):
    pytest.importorskip("onnxruntime")
    import linnet.onnx

    name, folder, mel, prompt, ref = case
    linnet.onnx.export(folder, tmp_path / "onnx", progress=False)
    check_model(linnet.onnx.load(tmp_path / "onnx"), mel, prompt, ref, f"{name} onnx")


def test_decode_needs_encode(case):
    name, folder, mel, prompt, ref = case
    model = lt.load(folder)
    with pytest.raises(LinnetError, match="call encode"):
        model.decode(prompt, 0)
    model.encode(mel[:1])
    with pytest.raises(LinnetError, match="another batch"):
        model.decode(prompt, 0)


def test_wrong_mel_shape_names_the_expected_one(case):
    name, folder, mel, prompt, ref = case
    with pytest.raises(LinnetError, match=r"`mel` must be f32\[B, "):
        lt.load(folder).encode(mel[:, :, :-2])
