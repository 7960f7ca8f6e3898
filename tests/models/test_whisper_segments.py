"""`split_segments` (linnet/speech_timestamps.py) against transformers' own
`WhisperGenerationMixin._retrieve_segment` on the same window tokens: the segments (tokens,
start, end) and how far the next window starts, for every branch: no closed pair (with and
without timestamps, a last timestamp of <|0.00|>), closed pairs ending on a pair, and a
single ending timestamp (no speech after it: the next window starts at this one's end), which
the end-to-end tests of test_whisper_timestamps.py never reach on their tiny checkpoints.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
generation = pytest.importorskip("transformers.models.whisper.generation_whisper")

from linnet.speech_timestamps import FRAME_S, INPUT_STRIDE, TIME_PRECISION, split_segments  # noqa: E402

BEGIN = 100  # the first timestamp token: ids below are text
FRAMES = 3000  # the window's frames of audio
OFFSET_S = 1.5  # this window's start in the audio


def theirs(tokens: list[int], frames: int = FRAMES):
    segments, seek = generation.WhisperGenerationMixin._retrieve_segment(
        seek_sequence=torch.tensor(tokens), seek_outputs=[None],
        time_offset=torch.tensor([OFFSET_S], dtype=torch.float64), timestamp_begin=BEGIN,
        seek_num_frames=torch.tensor([frames]), time_precision=TIME_PRECISION,
        time_precision_features=FRAME_S, input_stride=INPUT_STRIDE, prev_idx=0, idx=0,
        return_token_timestamps=False, decoder_input_ids=torch.zeros(1, 4, dtype=torch.long),
    )  # fmt: skip
    rows = [(float(s["start"]), float(s["end"]), s["tokens"].tolist()) for s in segments]
    return rows, int(seek)


def ours(tokens: list[int], frames: int = FRAMES):
    segments, seek = split_segments(tokens, BEGIN, OFFSET_S, frames)
    return [(s.start, s.end, s.tokens) for s in segments], int(seek)


def assert_same(tokens, frames=FRAMES):
    got, want = ours(tokens, frames), theirs(tokens, frames)
    assert got[1] == want[1], f"next window for {tokens}: {got[1]} != {want[1]}"
    assert [s[2] for s in got[0]] == [s[2] for s in want[0]], tokens
    np.testing.assert_allclose(
        [s[:2] for s in got[0]], [s[:2] for s in want[0]], rtol=0, atol=1e-9, err_msg=str(tokens)
    )


T = lambda k: BEGIN + k  # noqa: E731 (the timestamp token k * 0.02 s into the window)

CASES = {
    "single ending": [T(0), 5, 6, T(20), T(20), 7, 8, T(45)],
    "single ending, one pair": [T(3), 5, T(9), T(9), 6, T(30)],
    "ends on a pair": [T(0), 5, T(10), T(10), 6, 7, T(30), T(30)],
    "open pair at the end": [T(0), 5, T(10), T(12), 6, 7],
    "no pair, a last timestamp": [T(4), 5, 6, T(40), 7],
    "no pair, only <|0.00|>": [T(0), 5, 6, 7],
    "no timestamps": [5, 6, 7],
}


@pytest.mark.parametrize("tokens", CASES.values(), ids=CASES.keys())
def test_segments_and_seek_equal_transformers(tokens):
    assert_same(tokens)


def test_single_ending_starts_the_next_window_at_this_ones_end():
    """The branch itself: not the last timestamp (45 * 2 frames) but the window's frames."""
    _, seek = ours(CASES["single ending"], frames=1234)
    assert seek == 1234 == theirs(CASES["single ending"], frames=1234)[1]


def test_random_sequences_equal_transformers():
    """600 random windows: text and timestamp tokens in runs, timestamps never going back."""
    rng = np.random.default_rng(0)
    for _ in range(600):
        tokens, stamp = [], int(rng.integers(0, 5))
        for _ in range(int(rng.integers(1, 14))):
            if rng.random() < 0.45:
                stamp += int(rng.integers(0, 4))
                tokens.append(T(stamp))
            else:
                tokens.append(int(rng.integers(1, BEGIN)))
        assert_same(tokens, frames=int(rng.integers(50, FRAMES + 1)))
