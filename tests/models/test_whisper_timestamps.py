"""Timestamps (linnet/speech_timestamps.py) against transformers' generate(return_timestamps=True).

A tiny random checkpoint laid out as the real vocabularies are (timestamp tokens after
no-timestamps, to the end of the vocabulary; tests/tiny_whisper.build_timestamp_whisper),
with the timestamp rows of its tied embedding shifted so timestamps win at different places
(two shifts). Short audio (one padded 1 s window, which transformers also re-enters from the
last timestamp) and long audio (2.5 s: sequential long-form over the whole audio's features)
give the same segments (tokens, start and end seconds) as transformers' `generate(...,
return_timestamps=True, return_segments=True)`, on PyTorch and ONNX Runtime; the command
line prints them.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
soundfile = pytest.importorskip("soundfile")

import linnet.torch as lt  # noqa: E402
from linnet.speech import WhisperRules, transcribe  # noqa: E402
from tests.tiny_whisper import build_timestamp_whisper, reference_model  # noqa: E402

RATE = 16000
#: Shifts of the timestamp rows: 0 (pairs close on the last timestamp), -6 (segments of
#: one text token between timestamps, windows re-entered mid-way).
SHIFTS = (0.0, -6.0)


@pytest.fixture(scope="module", params=SHIFTS, ids=lambda b: f"shift{b:g}")
def stamped(request, tmp_path_factory):
    folder = build_timestamp_whisper(tmp_path_factory.mktemp("stamps"), request.param)
    return folder, reference_model(folder), lt.load(folder, mode="interpret")


def audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * RATE)) * 0.3).astype(np.float32)


def hf_segments(folder, hf, samples, **kw) -> list[tuple]:
    """transformers' segments as (start, end, tokens); long audio through the extractor as
    its long-form path wants it (the whole audio, not cut to the window)."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(folder, trust_remote_code=False)
    long = samples.size > extractor.n_samples
    extra = dict(truncation=False, padding="longest") if long else {}
    feats = extractor(samples, sampling_rate=RATE, return_tensors="pt", **extra).input_features
    with torch.no_grad():
        out = hf.generate(input_features=feats, return_timestamps=True, return_segments=True, **kw)
    return [(float(s["start"]), float(s["end"]), s["tokens"].tolist()) for s in out["segments"][0]]


def ours(model, samples, **kw) -> list[tuple]:
    result = transcribe(model, samples, timestamps=True, **kw)
    return [(s.start, s.end, s.tokens) for s in result.segments]


def assert_same_segments(got, want):
    assert [s[2] for s in got] == [s[2] for s in want]
    np.testing.assert_allclose([s[:2] for s in got], [s[:2] for s in want], rtol=0, atol=1e-9)


@pytest.mark.parametrize("seconds, seed", [(0.6, 1), (1.0, 2)])
def test_short_audio_segments_equal_generate(stamped, seconds, seed):
    folder, hf, model = stamped
    samples = audio(seconds, seed)
    want = hf_segments(folder, hf, samples, language="de")
    assert len(want) >= 2  # the rules were exercised: more than one timestamped segment
    assert_same_segments(ours(model, samples, language="de"), want)


@pytest.mark.parametrize("kw", [dict(language="fr"), dict(), dict(task="translate")])
def test_long_audio_seeks_as_generate(stamped, kw):
    """2.5 s on 1 s windows: each window starts at the previous one's last timestamp."""
    folder, hf, model = stamped
    samples = audio(2.5, 3)
    want = hf_segments(folder, hf, samples, **kw)
    assert want[-1][1] > 1.0  # segments beyond the first window
    assert_same_segments(ours(model, samples, **kw), want)


def test_onnx_segments_equal_generate(stamped, tmp_path):
    import linnet.onnx as lo

    folder, hf, _ = stamped
    model = lo.load(folder)
    samples = audio(2.5, 4)
    got = ours(model, samples, language="en", folder=folder)  # the ONNX folder has no rules
    assert_same_segments(got, hf_segments(folder, hf, samples, language="en"))


@pytest.mark.parametrize("kw", [dict(language="en"), dict()])
def test_jax_segments_equal_generate(stamped, kw):
    """JAX: long audio (seeking, language given and detected) gives transformers' segments."""
    import linnet.jax as lj

    folder, hf, _ = stamped
    model = lj.load(folder)
    samples = audio(2.5, 8)
    assert_same_segments(ours(model, samples, **kw), hf_segments(folder, hf, samples, **kw))


def test_first_token_is_an_early_timestamp(stamped):
    """The first generated token is a timestamp no later than max_initial_timestamp_index,
    and the prompt holds no no-timestamps token."""
    folder, _, model = stamped
    rules = WhisperRules.from_folder(folder)
    result = model.transcribe(audio(1.0, 5), language="de", timestamps=True)
    first = result.tokens[0][0]
    assert rules.timestamp_begin <= first <= rules.timestamp_begin + 10
    assert all(s.tokens[0] >= rules.timestamp_begin for s in result.segments)


def test_command_line_prints_segments(stamped, tmp_path):
    folder, hf, _ = stamped
    samples = audio(2.5, 6)
    path = tmp_path / "clip.wav"
    soundfile.write(path, samples, RATE, subtype="FLOAT")
    cmd = [sys.executable, "-m", "linnet", "transcribe", str(folder), str(path),
           "--language", "de", "--timestamps", "--mode", "interpret"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    want = hf_segments(folder, hf, samples, language="de")
    lines = [f"[{a:.2f} -> {b:.2f}] {' '.join(map(str, t))}" for a, b, t in want]
    assert done.stdout.splitlines() == lines


def test_long_form_windows_are_slices_of_the_whole_audios_features(stamped, monkeypatch):
    """Each window the encoder gets is transformers' long-form features (the whole audio at
    once: one log floor for all) from some frame on, zero-padded: a quiet first second and a
    loud rest make per-window features differ from them."""
    from transformers import WhisperFeatureExtractor

    folder, _, model = stamped
    samples = audio(2.5, 7)
    samples[:RATE] *= 1e-3
    seen, encode = [], model.encode
    monkeypatch.setattr(model, "encode", lambda f: (seen.append(np.array(f[0])), encode(f))[1])
    transcribe(model, samples, timestamps=True, language="de")
    extractor = WhisperFeatureExtractor.from_pretrained(folder, trust_remote_code=False)
    whole = extractor(samples, sampling_rate=RATE, truncation=False, padding="longest",
                      return_tensors="np").input_features[0]  # fmt: skip
    total, width = whole.shape[-1], seen[0].shape[-1]

    def matches(window, s):
        n = min(total - s, width)
        return np.array_equal(window[:, :n], whole[:, s : s + n]) and not window[:, n:].any()

    assert len(seen) >= 2 and matches(seen[0], 0)
    for window in seen[1:]:
        assert any(matches(window, s) for s in range(2, total, 2))
