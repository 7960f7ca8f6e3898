"""The audio front end (linnet/audio) against WhisperFeatureExtractor and plain math.

Log-mel features for 80 and 128 mel bins on real speech (made by espeak-ng, a Debian
package that scripts/setup.sh installs; missing, the speech tests fail), silence, clipped
noise, a single sample, 3 s and 40 s of audio: within 1e-5 of the extractor (measured: 0,
the same f32 torch.stft path); without torch, numpy's path against the extractor's own
numpy path (1e-6). Files: WAV and FLAC read back through soundfile, 44.1 kHz resampled to
16 kHz against the sine computed at 16 kHz. Bad audio: an `AudioError` naming the cause.
"""

from __future__ import annotations

import builtins
import shutil
import subprocess

import numpy as np
import pytest

from linnet.audio import FrontEnd, log_mel, mel_filters, read_audio, resample
from linnet.errors import AudioError
from tests.numeric import assert_close

transformers = pytest.importorskip("transformers")
soundfile = pytest.importorskip("soundfile")

TOL = 1e-5
RATE = 16000


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """Real speech: espeak-ng's voice (22.05 kHz WAV), read and resampled to 16 kHz."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing: apt-get install espeak-ng (scripts/setup.sh does)")
    path = tmp_path_factory.mktemp("speech") / "speech.wav"
    text = "The quick brown fox jumps over the lazy dog. Whisper turns speech into text."
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    return read_audio(path)


def _clipped(seconds):
    noise = np.random.default_rng(1).standard_normal(int(seconds * RATE)) * 3.0
    return np.clip(noise, -1.0, 1.0)


SIGNALS = {
    "silence": lambda: np.zeros(3 * RATE),
    "clipped noise": lambda: _clipped(5),
    "one sample": lambda: np.array([0.25]),
    "3 s tone": lambda: 0.3 * np.sin(2 * np.pi * 440 * np.arange(3 * RATE) / RATE),
    "40 s clipped (cut to 30 s)": lambda: _clipped(40),
}


def extractor(n_mels):
    return transformers.WhisperFeatureExtractor(feature_size=n_mels)


def reference(n_mels, samples):
    out = extractor(n_mels)(samples.astype(np.float32), sampling_rate=RATE, return_tensors="np")
    return out.input_features[0]


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_transformers(n_mels):
    assert_close(mel_filters(n_mels), extractor(n_mels).mel_filters, atol=1e-12, what="filters")


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("signal", list(SIGNALS))
def test_log_mel_matches_extractor(signal, n_mels):
    samples = SIGNALS[signal]()
    assert_close(log_mel(samples, n_mels), reference(n_mels, samples), atol=TOL, what=signal)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_on_speech(speech, n_mels):
    assert speech.size > RATE  # seconds of speech, not an empty file
    assert_close(log_mel(speech, n_mels), reference(n_mels, speech), atol=TOL, what="speech")


def test_numpy_path_matches_extractors_numpy_path(speech, monkeypatch):
    """Without torch: float64 numpy, against the extractor's own numpy path (speech, and
    noise loud from the first sample, where the reflect padding shows)."""
    signals = {"speech": speech, "clipped noise": _clipped(5)}
    want = {}
    for name, samples in signals.items():
        padded = np.zeros((1, 30 * RATE), np.float32)
        padded[0, : samples.size] = samples
        want[name] = extractor(80)._np_extract_fbank_features(padded, "cpu")[0]
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("no torch here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    for name, samples in signals.items():
        assert_close(log_mel(samples, 80), want[name], atol=1e-6, what=f"numpy path, {name}")


def test_windows_follow_each_other():
    """70 s: three 30 s windows, each the extractor's features of its own slice."""
    samples = _clipped(70)
    windows = FrontEnd(n_mels=80).windows(samples)
    assert windows.shape == (3, 80, 3000)
    for k in range(3):
        part = samples[k * 30 * RATE : (k + 1) * 30 * RATE]
        assert_close(windows[k], reference(80, part), atol=TOL, what=f"window {k}")


def test_front_end_reads_preprocessor_config(tmp_path):
    extractor(128).save_pretrained(tmp_path)
    front = FrontEnd.from_folder(tmp_path)
    assert (front.n_mels, front.hop_length, front.n_fft, front.chunk_length) == (128, 160, 400, 30)
    assert FrontEnd.from_folder(tmp_path / "none", n_mels=80).n_mels == 80


@pytest.mark.parametrize("fmt", ["WAV", "FLAC"])
def test_files_read_back(tmp_path, fmt):
    tone = 0.5 * np.sin(2 * np.pi * 300 * np.arange(RATE) / RATE)
    path = tmp_path / f"tone.{fmt.lower()}"
    soundfile.write(path, np.stack([tone, tone], axis=1), RATE, format=fmt, subtype="PCM_16")
    assert_close(read_audio(path), tone, atol=1.0 / 32768, what=f"{fmt} read back")


def test_resampling_to_16k_keeps_the_signal():
    """440 Hz at 44.1 kHz resampled to 16 kHz equals the sine computed at 16 kHz (away from
    the ends, where the filter sees zeros beyond the signal)."""
    seconds = 1.0
    at = lambda rate: np.sin(2 * np.pi * 440 * np.arange(int(seconds * rate)) / rate)  # noqa: E731
    got = resample(at(44100), 44100)
    assert got.shape == (int(seconds * RATE),)
    assert_close(got[800:-800], at(RATE)[800:-800], atol=2e-3, what="resampled sine")


def test_bad_audio_is_refused(tmp_path):
    text = tmp_path / "notes.wav"
    text.write_text("not audio at all")
    empty = tmp_path / "empty.flac"
    empty.write_bytes(b"")
    silent = tmp_path / "zero.wav"
    soundfile.write(silent, np.zeros(0), RATE)
    cases = [
        (lambda: read_audio(text), "not a sound file"),
        (lambda: read_audio(empty), "not a sound file"),
        (lambda: read_audio(silent), "0-length"),
        (lambda: read_audio(tmp_path / "missing.wav"), "no such file"),
        (lambda: log_mel(np.array([0.1, np.nan])), "NaN"),
        (lambda: log_mel(np.zeros((2, 3, 4))), "shape"),
        (lambda: resample(np.ones(10), 0), "positive integer"),
        (lambda: resample(np.ones(10), 44100.5), "positive integer"),
    ]
    for call, match in cases:
        with pytest.raises(AudioError, match=match):
            call()


def wav_claiming(path, rate: int, seconds: float = 1.0):
    """A 16 kHz PCM WAV whose header is patched to claim `rate` Hz (byte rate too)."""
    soundfile.write(path, np.zeros(int(seconds * RATE)) + 0.1, RATE, subtype="PCM_16")
    raw = bytearray(path.read_bytes())
    assert raw[24:28] == RATE.to_bytes(4, "little")  # the fmt chunk of a canonical WAV
    raw[24:28] = rate.to_bytes(4, "little")
    raw[28:32] = (2 * rate % 2**32).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("rate", [1, 3999, 768001, 2**31 - 1])
def test_rates_no_audio_is_recorded_at_are_refused(tmp_path, rate):
    """soundfile reads such headers; resampling 1 Hz to 16 kHz would make 16000 times the
    samples (2 GB for 1 s), 2**31 - 1 Hz nothing at all: refused, the rate named."""
    path = wav_claiming(tmp_path / "odd.wav", rate)
    assert soundfile.info(str(path)).samplerate == rate  # libsndfile takes the header
    with pytest.raises(AudioError, match=f"{rate} Hz is not one audio is recorded at"):
        read_audio(path)
    with pytest.raises(AudioError, match=f"{rate} Hz is not one audio is recorded at"):
        resample(np.ones(10), rate)


@pytest.mark.parametrize("rate", [4000, 768000])
def test_rates_at_the_bounds_are_read(tmp_path, rate):
    got = read_audio(wav_claiming(tmp_path / "edge.wav", rate, seconds=0.5))
    assert got.shape == (round(0.5 * RATE * RATE / rate),)


def test_a_folder_is_no_sound_file(tmp_path):
    with pytest.raises(AudioError, match="a folder, not a sound file"):
        read_audio(tmp_path)
