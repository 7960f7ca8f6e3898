"""Reading audio files (WAV, FLAC, OGG: soundfile over libsndfile) and resampling to the
model's rate (scipy's polyphase filter). Every refusal is an `AudioError` naming the file."""

from __future__ import annotations

from math import gcd
from pathlib import Path

import numpy as np

from linnet.errors import AudioError

# Rates audio is recorded at lie between these (4 kHz holds nothing of speech above 2 kHz;
# 768 kHz is the highest rate audio interfaces record). A rate outside them is a broken
# header or a wrong argument, and resampling from it would make 16000 / rate times the
# samples: a header claiming 1 Hz turns 1 s of samples into 4.4 hours (2 GB).
MIN_RATE, MAX_RATE = 4000, 768000


def check_samples(samples, what: str = "audio") -> np.ndarray:
    """Mono samples as float64 [n]: finite, not empty; a [n, channels] array is averaged."""
    try:
        x = np.asarray(samples, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise AudioError(f"{what}: not an array of samples ({e})") from None
    if x.ndim == 2:
        x = x.mean(axis=1)
    if x.ndim != 1:
        raise AudioError(f"{what}: samples must be [n] or [n, channels], got shape {x.shape}")
    if x.size == 0:
        raise AudioError(f"{what}: no samples (0-length audio)")
    if not np.isfinite(x).all():
        raise AudioError(f"{what}: samples hold NaN or infinity")
    return x


def resample(samples, rate: int, target: int = 16000, what: str = "audio") -> np.ndarray:
    """Samples at `rate` Hz as `target` Hz (scipy.signal.resample_poly; unchanged when equal)."""
    if not isinstance(rate, (int, np.integer)) or isinstance(rate, bool) or rate <= 0:
        raise AudioError(f"{what}: the sample rate must be a positive integer, got {rate!r}")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(
            f"{what}: a sample rate of {rate} Hz is not one audio is recorded at "
            f"({MIN_RATE} to {MAX_RATE} Hz); is the file's header (or the rate given) right?"
        )
    x = check_samples(samples, what)
    if rate == target:
        return x
    from scipy.signal import resample_poly

    g = gcd(int(rate), int(target))
    return resample_poly(x, target // g, int(rate) // g)


def read_audio(path, target: int = 16000) -> np.ndarray:
    """A sound file as float64 mono samples at `target` Hz."""
    try:
        import soundfile
    except ImportError:
        raise AudioError(
            "reading audio files needs soundfile: pip install 'linnet[audio]'"
        ) from None
    path = Path(path)
    if path.is_dir():
        raise AudioError(f"{path}: a folder, not a sound file")
    if not path.is_file():
        raise AudioError(f"{path}: no such file")
    try:
        data, rate = soundfile.read(str(path), dtype="float64", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise AudioError(f"{path}: not a sound file soundfile can read ({e})") from None
    return resample(data, rate, target, what=str(path))
