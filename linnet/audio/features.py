"""Whisper's log-mel features, as WhisperFeatureExtractor computes them.

A 30 s window of 16 kHz samples (cut or padded with zeros at the end), a centred STFT
(reflect padding of n_fft // 2, a periodic Hann window, hop 160), the power spectrum
through Slaney-normalised mel filters (0 to 8 kHz on the Slaney scale), the last frame
dropped, then log10 clamped at 1e-10, floored 8 below the window's maximum, and scaled as
(x + 4) / 4.

Two paths, as WhisperFeatureExtractor has: with PyTorch installed, the same f32 `torch.stft`
and matmul it runs (bit-identical features); without, numpy in float64 (its numpy path,
within 1.2e-7). The two differ from each other by up to 3.5e-5 on real speech: float32
rounding in bins 8 orders of magnitude below the window's peak, near the floor.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linnet.audio.io import check_samples

_MEL_BREAK_HZ = 1000.0  # the Slaney scale is linear below, logarithmic above
_MEL_LINEAR_STEP = 200.0 / 3  # Hz per mel below the break
_MEL_LOG_STEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / _MEL_LINEAR_STEP
    above = (
        _MEL_BREAK_HZ / _MEL_LINEAR_STEP
        + np.log(np.maximum(hz, 1e-30) / _MEL_BREAK_HZ) / _MEL_LOG_STEP
    )
    return np.where(hz >= _MEL_BREAK_HZ, above, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    brk = _MEL_BREAK_HZ / _MEL_LINEAR_STEP
    return np.where(
        mel >= brk, _MEL_BREAK_HZ * np.exp(_MEL_LOG_STEP * (mel - brk)), mel * _MEL_LINEAR_STEP
    )


def mel_filters(n_mels: int, n_fft: int = 400, sampling_rate: int = 16000) -> np.ndarray:
    """Triangular filters [n_fft // 2 + 1, n_mels] evenly spaced on the Slaney mel scale from
    0 to 8 kHz, each scaled by 2 / its width in Hz (Slaney's area normalisation)."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), n_mels + 2))
    bins = np.linspace(0, sampling_rate // 2, n_fft // 2 + 1)
    rise = (bins[:, None] - edges[None, :-2]) / np.diff(edges)[:-1]
    fall = (edges[None, 2:] - bins[:, None]) / np.diff(edges)[1:]
    weights = np.maximum(0.0, np.minimum(rise, fall))
    return weights * (2.0 / (edges[2:] - edges[:-2]))


def _power_spectrum(samples: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """|STFT|^2 [n_fft // 2 + 1, frames]: centred frames (reflect padding), periodic Hann."""
    padded = np.pad(samples, n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    spectrum = np.fft.rfft(frames * window, axis=-1)
    return (spectrum.real**2 + spectrum.imag**2).T


def log_mel(
    samples,
    n_mels: int = 80,
    *,
    sampling_rate: int = 16000,
    n_fft: int = 400,
    hop_length: int = 160,
    chunk_length: int | None = 30,
) -> np.ndarray:
    """f32 [n_mels, chunk_length * sampling_rate // hop_length] for one window of mono samples
    (cut to the window, or padded with zeros); `chunk_length=None`: the whole audio, as the
    extractor computes it for long-form generation (`padding="longest", truncation=False`:
    samples // hop_length frames, one floor for all)."""
    samples = check_samples(samples)
    n = chunk_length * sampling_rate if chunk_length is not None else samples.size
    window = np.zeros(n, dtype=np.float32)
    window[: min(n, samples.size)] = samples[:n]  # the extractor pads and cuts in f32
    filters = mel_filters(n_mels, n_fft, sampling_rate)
    try:
        import torch
    except ImportError:
        power = _power_spectrum(window.astype(np.float64), n_fft, hop_length)[:, :-1]
        log = np.log10(np.maximum(filters.T @ power, 1e-10))
    else:
        log = _torch_log10_mel(torch, window, filters.astype(np.float32), n_fft, hop_length)
    log = np.maximum(log, log.max() - np.float32(8.0))
    return ((log + 4.0) / 4.0).astype(np.float32)


def _torch_log10_mel(torch, window: np.ndarray, filters: np.ndarray, n_fft: int, hop: int):
    """log10 of the mel power in f32 through torch.stft (centred, reflect, periodic Hann)."""
    with torch.inference_mode():
        x = torch.from_numpy(window)
        stft = torch.stft(x, n_fft, hop, window=torch.hann_window(n_fft), return_complex=True)
        power = (stft[..., :-1].abs() ** 2).contiguous()
        return torch.clamp(torch.from_numpy(filters).T @ power, min=1e-10).log10().numpy()


@dataclass(frozen=True)
class FrontEnd:
    """The numbers of a checkpoint's preprocessor_config.json (WhisperFeatureExtractor)."""

    n_mels: int = 80
    sampling_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160
    chunk_length: int = 30

    @classmethod
    def from_folder(cls, folder, n_mels: int | None = None) -> FrontEnd:
        """From `preprocessor_config.json` when the folder has one, else Whisper's defaults
        with `n_mels` (the model's `num_mel_bins`)."""
        path = Path(folder) / "preprocessor_config.json"
        raw = json.loads(path.read_text()) if path.is_file() else {}
        keys = dict(n_mels="feature_size", sampling_rate="sampling_rate", n_fft="n_fft")
        keys.update(hop_length="hop_length", chunk_length="chunk_length")
        values = {ours: int(raw[theirs]) for ours, theirs in keys.items() if theirs in raw}
        if n_mels is not None and "n_mels" not in values:
            values["n_mels"] = n_mels
        return cls(**values)

    @property
    def window_samples(self) -> int:
        return self.chunk_length * self.sampling_rate

    def features(self, samples) -> np.ndarray:
        """One window: f32 [n_mels, frames] (the first 30 s)."""
        return log_mel(samples, self.n_mels, sampling_rate=self.sampling_rate,
                       n_fft=self.n_fft, hop_length=self.hop_length,
                       chunk_length=self.chunk_length)  # fmt: skip

    @property
    def window_frames(self) -> int:
        return self.window_samples // self.hop_length

    def all_features(self, samples) -> np.ndarray:
        """The whole audio at once: f32 [n_mels, samples // hop_length] (long-form)."""
        return log_mel(samples, self.n_mels, sampling_rate=self.sampling_rate,
                       n_fft=self.n_fft, hop_length=self.hop_length,
                       chunk_length=None)  # fmt: skip

    def windows(self, samples) -> np.ndarray:
        """Every 30 s window in turn: f32 [k, n_mels, frames], k >= 1."""
        samples = check_samples(samples)
        n = self.window_samples
        starts = range(0, max(samples.size, 1), n)
        return np.stack([self.features(samples[s : s + n]) for s in starts])
