"""Audio in: files read and resampled to the model's rate, and Whisper's log-mel features.

    from linnet.audio import read_audio, log_mel, FrontEnd
    samples = read_audio("speech.flac")            # f32 mono at 16 kHz (soundfile, resampled)
    front = FrontEnd.from_folder("whisper-tiny")   # preprocessor_config.json's numbers
    mel = front.features(samples)                  # f32 [n_mels, 3000]: one 30 s window
    windows = front.windows(samples)               # [k, n_mels, 3000]: 30 s windows in turn

numpy only (soundfile and scipy for files and resampling): no transformers at run time.
"""

from linnet.audio.features import FrontEnd, log_mel, mel_filters
from linnet.audio.io import check_samples, read_audio, resample

__all__ = ["FrontEnd", "check_samples", "log_mel", "mel_filters", "read_audio", "resample"]
