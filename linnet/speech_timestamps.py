"""Whisper's timestamp tokens: the rules greedy decoding obeys, and the segments they mark.

Both follow transformers (5.x) exactly, since its `generate(return_timestamps=True)` is the
reference: `timestamp_rule` is WhisperTimeStampLogitsProcessor on one step's scores,
`split_segments` is `_retrieve_segment` (what a window's tokens say about its segments, and
how far the next window starts).

Timestamp tokens are the ids from `timestamp_begin` (no_timestamps + 1) on; token
`timestamp_begin + k` is k * 0.02 s into the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Seconds per timestamp token (transformers' `time_precision`: 2 mel frames of 10 ms).
TIME_PRECISION = 0.02
#: Mel frames per encoder position (Whisper's second conv has stride 2).
INPUT_STRIDE = 2
#: Seconds per mel frame, as transformers counts them (`time_precision_features`).
FRAME_S = TIME_PRECISION / INPUT_STRIDE


@dataclass
class Segment:
    start: float  # seconds from the start of the audio
    end: float
    tokens: list[int]  # timestamp tokens included, as transformers' segments hold them
    text: str | None = None


def _log_softmax(scores: np.ndarray) -> np.ndarray:
    scores = scores.astype(np.float64)
    top = scores.max(-1, keepdims=True)
    return scores - top - np.log(np.exp(scores - top).sum(-1, keepdims=True))


def _pairs_and_order(scores, seq: list[int], begin: int, eos: int) -> None:
    """One row: timestamps come in pairs (never three in a row, never text right after a
    lone one), and never go back (nor repeat, except to close a pair)."""
    last = len(seq) >= 1 and seq[-1] >= begin
    penultimate = len(seq) < 2 or seq[-2] >= begin
    if last:
        if penultimate:
            scores[begin:] = -np.inf  # a pair just closed: text (or eos) next
        else:
            scores[:eos] = -np.inf  # an open pair: a timestamp or eos next
    stamps = [t for t in seq if t >= begin]
    if stamps:
        floor = stamps[-1] if last and not penultimate else stamps[-1] + 1
        scores[begin:floor] = -np.inf


def timestamp_rule(scores: np.ndarray, generated: list[list[int]], rules, first: bool) -> None:
    """WhisperTimeStampLogitsProcessor on `scores` [B, V] in place; `generated`: each row's
    tokens after the prompt; `first`: the first generated step (it must be a timestamp, at
    most `max_initial_timestamp_index`)."""
    begin = rules.timestamp_begin
    scores[:, rules.no_timestamps] = -np.inf
    for k, seq in enumerate(generated):
        _pairs_and_order(scores[k], seq, begin, rules.eos[0])
    if first:
        scores[:, :begin] = -np.inf
        if rules.max_initial_timestamp_index is not None:
            scores[:, begin + rules.max_initial_timestamp_index + 1 :] = -np.inf
    # When all timestamps together are likelier than any one text token, a timestamp it is.
    logprobs = _log_softmax(scores)
    with np.errstate(divide="ignore"):
        stamp = np.log(np.exp(logprobs[:, begin:]).sum(-1))
    text = logprobs[:, :begin].max(-1)
    scores[stamp > text, :begin] = -np.inf


def split_segments(
    tokens: list[int], begin: int, offset_s: float, window_frames: int
) -> tuple[list[Segment], int]:
    """A window's tokens (eos removed) as segments, and how many mel frames the next window
    starts after this one's start (transformers' `_retrieve_segment`). `window_frames`: the
    frames this window holds of the audio."""
    is_stamp = [t >= begin for t in tokens]
    ends = [i + 1 for i in range(len(tokens) - 1) if is_stamp[i] and is_stamp[i + 1]]
    if not ends:
        return [_whole(tokens, is_stamp, begin, offset_s, window_frames)], window_frames
    single_ending = is_stamp[-2:] == [False, True]
    if single_ending:
        ends.append(len(tokens))
    else:
        ends[-1] += 1  # the last pair's closing timestamp stays in the last segment
    segments, last = [], 0
    for i, cut in enumerate(ends):
        piece = tokens[last:cut]
        closing = piece[-1] if i < len(ends) - 1 or single_ending else piece[-2]
        start = offset_s + (piece[0] - begin) * TIME_PRECISION
        segments.append(Segment(start, offset_s + (closing - begin) * TIME_PRECISION, piece))
        last = cut
    if single_ending:
        return segments, window_frames  # nothing spoken after the last timestamp
    return segments, (tokens[last - 2] - begin) * INPUT_STRIDE  # seek to the last timestamp


def _whole(tokens, is_stamp, begin, offset_s, window_frames) -> Segment:
    """No pair closed: the whole window is one segment, ending at its last timestamp (unless
    that is <|0.00|>) or at the window's end."""
    stamps = [t for t, s in zip(tokens, is_stamp) if s]
    # In f32, as transformers computes it on a tensor (f64 truncates 146 of 3000 counts lower).
    end_pos = int(np.float32(window_frames) * np.float32(FRAME_S) / np.float32(TIME_PRECISION))
    if stamps and stamps[-1] != begin:
        end_pos = stamps[-1] - begin
    return Segment(offset_s, offset_s + end_pos * TIME_PRECISION, list(tokens))
