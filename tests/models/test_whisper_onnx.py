"""Whisper's ONNX export run by onnxruntime alone (issue 14): no Linnet runner in the loop.

`linnet.onnx.export` of the tiny random checkpoints (both configurations: 80 and 128 mel
bins, tests/tiny_whisper.py) writes `encode.onnx` (mel -> encoder output and every decoder
layer's cross-attention keys and values, `cross.L.k.next`) and `decode.onnx` (tokens, `at`,
the self-attention cache `kv.L.k` and the cross cache `cross.L.k` -> logits and
`kv.L.k.next`). The test calls those two graphs with plain `InferenceSession.run`, feeding
the outputs back as a user would: the encoder output and the first logits within 1e-4 of
transformers f32, and a 32-step greedy loop gives exactly transformers' `generate` tokens.
The graphs pass no cache through: encode reads no cross input, decode writes no cross output.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import linnet.onnx  # noqa: E402
from tests.numeric import assert_close  # noqa: E402
from tests.tiny_whisper import WHISPER_CONFIGS, build_tiny_whisper, greedy_reference  # noqa: E402

STEPS = 32
F32_TOL = 1e-4


@pytest.fixture(scope="module", params=sorted(WHISPER_CONFIGS))
def exported(request, tmp_path_factory):
    """(name, sessions, mel, prompt, transformers' outputs) for one configuration."""
    name = request.param
    root = tmp_path_factory.mktemp(f"whisper-onnx-{name}")
    folder = build_tiny_whisper(name, root)
    out = linnet.onnx.export(folder, root / "onnx", progress=False)
    sessions = {e: ort.InferenceSession(str(out / f"{e}.onnx")) for e in ("encode", "decode")}
    hf, mel, prompt, encoder, tokens = greedy_reference(folder, name, STEPS)
    with torch.no_grad():
        first = hf(input_features=mel, decoder_input_ids=prompt).logits[:, -1]
    ref = dict(encoder=encoder.numpy(), first=first.numpy(), tokens=tokens.numpy())
    return name, sessions, mel.numpy(), prompt.numpy(), ref


def _names(values) -> list[str]:
    return [v.name for v in values]


def test_graphs_take_and_give_the_caches(exported):
    name, sessions, *_ = exported
    layers = WHISPER_CONFIGS[name]["decoder_layers"]
    parts = [f"{layer}.{k}" for layer in range(layers) for k in (0, 1)]
    enc, dec = sessions["encode"], sessions["decode"]
    assert _names(enc.get_inputs()) == ["mel"]
    assert _names(enc.get_outputs()) == ["output"] + [f"cross.{p}.next" for p in parts]
    kv, cross = [f"kv.{p}" for p in parts], [f"cross.{p}" for p in parts]
    assert _names(dec.get_inputs()) == ["tokens", "at", *kv, *cross]
    assert _names(dec.get_outputs()) == ["output"] + [f"{k}.next" for k in kv]


def _empty_cache(session, batch: int) -> dict[str, np.ndarray]:
    """Zeros for every self-attention cache input, its dims read from the graph."""
    return {
        i.name: np.zeros([batch if isinstance(d, str) else d for d in i.shape], np.float32)
        for i in session.get_inputs()
        if i.name.startswith("kv.")
    }


def greedy_on_onnxruntime(sessions, mel: np.ndarray, prompt: np.ndarray, steps: int):
    """encode.onnx once, then decode.onnx: the prompt, then one token per call. Returns the
    encoder output, the prompt's last logits and the new tokens."""
    encoded = sessions["encode"].run(None, {"mel": mel})
    names = _names(sessions["encode"].get_outputs())
    cross = {n.removesuffix(".next"): v for n, v in zip(names[1:], encoded[1:])}
    kv = _empty_cache(sessions["decode"], mel.shape[0])
    kv_names = list(kv)
    tokens, at, first, out = prompt, 0, None, []
    for _ in range(steps):
        feed = {"tokens": tokens, "at": np.array(at, np.int64), **kv, **cross}
        logits, *kv_next = sessions["decode"].run(None, feed)
        kv = dict(zip(kv_names, kv_next))
        first = logits if first is None else first
        at += tokens.shape[1]
        tokens = logits.argmax(-1)[:, None].astype(np.int64)
        out.append(tokens)
    return encoded[0], first, np.concatenate(out, axis=1)


def test_encode_then_greedy_decode_gives_generate_tokens(exported):
    name, sessions, mel, prompt, ref = exported
    encoder, first, tokens = greedy_on_onnxruntime(sessions, mel, prompt, STEPS)
    assert_close(encoder, ref["encoder"], atol=F32_TOL, what=f"{name} encoder output")
    assert_close(first, ref["first"], atol=F32_TOL, what=f"{name} first logits")
    np.testing.assert_array_equal(tokens, ref["tokens"], err_msg=name)  # generate: new tokens
