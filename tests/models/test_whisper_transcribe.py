"""Whisper's decoding rules (linnet/speech.py) and `linnet transcribe`, against transformers.

Tiny random checkpoints of both configurations (tests/tiny_whisper.py) carry a
generation_config.json like the Hub's (three language tokens, both tasks, no-timestamps,
suppressed and begin-suppressed ids) and a preprocessor_config.json with a 1 s window. A
batch of two clips through WhisperFeatureExtractor and transformers' `generate` (language
given, detected, with a task, and the Hub's old forced_decoder_ids) gives exactly the tokens
Linnet's rules give; `model.transcribe` of a file equals `generate` window by window; the
command line prints them, and refuses bad audio with exit 1 and an error line.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
soundfile = pytest.importorskip("soundfile")

import linnet.torch as lt  # noqa: E402
from linnet.errors import AudioError, LinnetError  # noqa: E402
from linnet.speech import WhisperRules, transcribe_features  # noqa: E402
from tests.audio.test_features import wav_claiming  # noqa: E402
from tests.tiny_whisper import WHISPER_CONFIGS, build_tiny_whisper, reference_model  # noqa: E402

RATE = 16000
CASES = {
    "language given": dict(language="de"),
    "language detected": dict(),
    "translate": dict(language="fr", task="translate"),
    "task only": dict(task="translate"),
}


@pytest.fixture(scope="module")
def whisper_root(tmp_path_factory):
    return tmp_path_factory.mktemp("whisper-rules")


@pytest.fixture(scope="module", params=sorted(WHISPER_CONFIGS))
def tiny(request, whisper_root):
    folder = build_tiny_whisper(request.param, whisper_root)
    return folder, reference_model(folder), lt.load(folder)


def clips(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) * s for n, s in ((12000, 0.1), (RATE, 0.3))]


def features(folder, audio):
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(folder, trust_remote_code=False)
    return extractor(audio, sampling_rate=RATE, return_tensors="pt").input_features


def hf_tokens(hf, feats, **kw) -> list[list[int]]:
    """transformers' generated tokens per item, cut after the first end token (it pads the
    rest of a finished row)."""
    with torch.no_grad():
        out = hf.generate(input_features=feats, **kw).tolist()
    eos = hf.generation_config.eos_token_id
    return [row[: row.index(eos) + 1] if eos in row else row for row in out]


@pytest.mark.parametrize("case", list(CASES))
def test_rules_match_generate(tiny, case):
    folder, hf, model = tiny
    feats = features(folder, clips())
    rules = WhisperRules.from_folder(folder)
    ours, prompt = transcribe_features(model, feats.numpy(), rules, **CASES[case])
    assert ours == hf_tokens(hf, feats, **CASES[case]), f"{case}: prompt {prompt.tolist()}"


def test_forced_decoder_ids_of_hub_configs(tiny, tmp_path):
    """The Hub's checkpoints keep forced_decoder_ids [[1, null], [2, transcribe]]: detect the
    language, then transcribe (transformers ignores them once a language or task is given)."""
    folder, hf, model = tiny
    rules = WhisperRules.from_folder(folder)
    forced = [[1, None], [2, rules.task_to_id["transcribe"]]]
    config = json.loads((folder / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(
        json.dumps(dict(config, forced_decoder_ids=forced))
    )
    rules = WhisperRules.from_folder(tmp_path)
    hf.generation_config.forced_decoder_ids = forced
    try:
        feats = features(folder, clips(1))
        for kw in (dict(), dict(language="en")):
            ours, prompt = transcribe_features(model, feats.numpy(), rules, **kw)
            assert ours == hf_tokens(hf, feats, **kw), f"{kw}: prompt {prompt.tolist()}"
            assert prompt[0, 2] == rules.task_to_id["transcribe"]
    finally:
        hf.generation_config.forced_decoder_ids = None


def test_begin_suppress_holds_off_the_first_token(tiny, tmp_path):
    """The token greedy decoding would pick first, begin-suppressed: another comes first
    (as in transformers), and the suppressed one may come later."""
    folder, hf, model = tiny
    feats = features(folder, clips())
    first = hf_tokens(hf, feats, language="de")[0][0]
    config = json.loads((folder / "generation_config.json").read_text())
    begin = config["begin_suppress_tokens"] + [first]
    (tmp_path / "generation_config.json").write_text(
        json.dumps(dict(config, begin_suppress_tokens=begin))
    )
    rules = WhisperRules.from_folder(tmp_path)
    hf.generation_config.begin_suppress_tokens = begin
    try:
        ours, _ = transcribe_features(model, feats.numpy(), rules, language="de")
        assert ours == hf_tokens(hf, feats, language="de")
        assert ours[0][0] != first
    finally:
        hf.generation_config.begin_suppress_tokens = config["begin_suppress_tokens"]


def test_transcribe_a_file_window_by_window(tiny, tmp_path):
    """2.5 s at 44.1 kHz: resampled, three 1 s windows, each transformers' tokens."""
    folder, hf, model = tiny
    rng = np.random.default_rng(2)
    audio = np.clip(rng.standard_normal(int(2.5 * 44100)) * 0.2, -1, 1)
    path = tmp_path / "clip.flac"
    soundfile.write(path, audio, 44100)
    result = model.transcribe(path, language="en")
    from linnet.audio import read_audio

    samples = read_audio(path).astype(np.float32)
    windows = [samples[k * RATE : (k + 1) * RATE] for k in range(3)]
    want = [hf_tokens(hf, features(folder, [w]), language="en")[0] for w in windows]
    assert result.tokens == want
    assert result.languages == [WhisperRules.from_folder(folder).language_id("en")] * 3


def test_rules_refuse_what_the_checkpoint_lacks(tiny):
    folder, hf, model = tiny
    feats = features(folder, clips()).numpy()
    rules = WhisperRules.from_folder(folder)
    with pytest.raises(LinnetError, match="language 'xx' is not in this checkpoint"):
        transcribe_features(model, feats, rules, language="xx")
    with pytest.raises(LinnetError, match="choose transcribe or translate"):
        transcribe_features(model, feats, rules, task="summarize")


def run_cli(*args):
    cmd = [sys.executable, "-m", "linnet", "transcribe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_command_line(tiny, tmp_path):
    folder, hf, model = tiny
    path = tmp_path / "clip.wav"
    soundfile.write(path, clips()[1], RATE)
    done = run_cli(folder, path, "--language", "de", "--mode", "interpret")
    assert done.returncode == 0, done.stderr
    want = hf_tokens(hf, features(folder, [clips()[1]]), language="de")[0]
    assert done.stdout.split() == [str(t) for t in want]  # no tokenizer: the token ids
    assert "s of audio in" in done.stderr


def _bad_audio(kind: str, path):
    """Write the bad file of `kind` at `path`; return what its error line must say."""
    if kind == "not audio":
        path.write_text("RIFF? no, just text")
    elif kind == "binary junk":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "empty file":
        path.write_bytes(b"")
    elif kind == "no samples":
        soundfile.write(path, np.zeros(0), RATE)
    elif kind == "NaN samples":
        soundfile.write(path, np.array([0.1, np.nan, 0.2] * 100), RATE, subtype="FLOAT")
    elif kind.startswith("header rate"):
        rate = int(kind.split()[-1])
        wav_claiming(path, rate)
        return f"{rate} Hz is not one audio is recorded at"
    elif kind == "a folder":
        path.mkdir()
        return "a folder, not a sound file"
    return dict(missing="no such file", **{"no samples": "0-length", "NaN samples": "NaN"}).get(
        kind, "not a sound file"
    )


BAD_AUDIO = ["not audio", "binary junk", "empty file", "no samples", "NaN samples", "missing",
             "a folder", "header rate 1", "header rate 2147483647"]  # fmt: skip


@pytest.mark.parametrize("kind", BAD_AUDIO)
def test_command_line_refuses_bad_audio(tiny, tmp_path, kind):
    """Exit 1 and one line `error: FILE: why` (no traceback), before the model loads."""
    folder = tiny[0]
    path = tmp_path / "bad.wav"
    why = _bad_audio(kind, path)
    done = run_cli(folder, path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"error: {path}: ") and why in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_transcribe_refuses_bad_samples_and_rates(tiny, tmp_path):
    """The Python API: 0-length samples, rates that are no rates or none audio is recorded
    at, and a rate given beside a file (which says its own)."""
    model = tiny[2]
    clip = clips()[1]
    cases = [
        (dict(audio=np.zeros(0)), AudioError, "0-length"),
        (dict(audio=clip, sampling_rate=0), AudioError, "positive integer"),
        (dict(audio=clip, sampling_rate=-16000), AudioError, "positive integer"),
        (dict(audio=clip, sampling_rate=16000.5), AudioError, "positive integer"),
        (dict(audio=clip, sampling_rate=10**7), AudioError, "not one audio is recorded at"),
        (dict(audio=clip, sampling_rate=100), AudioError, "not one audio is recorded at"),
    ]
    path = tmp_path / "clip.wav"
    soundfile.write(path, clip, RATE)
    cases.append((dict(audio=path, sampling_rate=RATE), LinnetError, "a file says its own"))
    for kw, error, why in cases:
        with pytest.raises(error, match=why):
            model.transcribe(**kw)
