"""Whisper transcription: the checkpoint's decoding rules over a `Seq2Seq` model's entries.

    model = linnet.torch.load("whisper-tiny")           # any backend's Seq2Seq model
    result = model.transcribe("speech.flac", language="en")
    result.text, result.tokens, result.languages

The rules come from the folder's `generation_config.json`, as transformers' `generate`
applies them without timestamps. The prompt: `decoder_start_token_id`; with neither language
nor task given, the old `forced_decoder_ids` after it (the Hub's checkpoints: a language to
detect, then transcribe); the language token, given (`de` or `<|de|>`) or detected (the
decoder's most likely language token after the start token alone); the task token when a
task is given, or transcribe when only a language is; then `no_timestamps_token_id`.
`suppress_tokens` never come out, `begin_suppress_tokens` not as the first token; decoding
is greedy and stops at `eos_token_id`. Longer audio: 30 s windows one after another.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from linnet.audio import FrontEnd, check_samples, read_audio, resample
from linnet.errors import LinnetError
from linnet.speech_timestamps import (
    INPUT_STRIDE,
    TIME_PRECISION,
    Segment,
    split_segments,
    timestamp_rule,
)

TASKS = ("transcribe", "translate")


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


@dataclass(frozen=True)
class WhisperRules:
    """What generation_config.json says about decoding."""

    start: int
    eos: list[int]
    no_timestamps: int | None = None
    lang_to_id: dict = field(default_factory=dict)
    task_to_id: dict = field(default_factory=dict)
    suppress: list[int] = field(default_factory=list)
    begin_suppress: list[int] = field(default_factory=list)
    multilingual: bool = False
    max_length: int = 448
    forced: list = field(default_factory=list)  # forced_decoder_ids: [[index, id or None]]
    max_initial_timestamp_index: int | None = None

    @property
    def timestamp_begin(self) -> int:
        """The first timestamp token (<|0.00|>), right after no_timestamps."""
        if self.no_timestamps is None:
            raise LinnetError("no no_timestamps_token_id in generation_config.json: no timestamps")
        return int(self.no_timestamps) + 1

    @classmethod
    def from_folder(cls, folder, hf_config: dict | None = None) -> WhisperRules:
        """generation_config.json, falling back on config.json's fields."""
        config = dict(hf_config or {})
        path = Path(folder) / "generation_config.json" if folder else None
        if path is not None and path.is_file():
            config.update(json.loads(path.read_text()))
        if config.get("decoder_start_token_id") is None:
            raise LinnetError("no decoder_start_token_id in generation_config.json or config.json")
        lang_to_id = {k: int(v) for k, v in (config.get("lang_to_id") or {}).items()}
        return cls(
            start=int(config["decoder_start_token_id"]),
            eos=_ids(config.get("eos_token_id")),
            no_timestamps=config.get("no_timestamps_token_id"),
            lang_to_id=lang_to_id,
            task_to_id={k: int(v) for k, v in (config.get("task_to_id") or {}).items()},
            suppress=_ids(config.get("suppress_tokens")),
            begin_suppress=_ids(config.get("begin_suppress_tokens")),
            multilingual=bool(config.get("is_multilingual", bool(lang_to_id))),
            max_length=int(config.get("max_length") or config.get("max_target_positions") or 448),
            forced=[list(pair) for pair in config.get("forced_decoder_ids") or []],
            max_initial_timestamp_index=config.get("max_initial_timestamp_index"),
        )

    def head(self, language, task) -> list:
        """The start token, then forced_decoder_ids' run from index 1 when neither a language
        nor a task is given (None where the language is to be detected)."""
        head = [self.start]
        if language is None and task is None:
            for index, token in sorted(self.forced, key=lambda pair: pair[0]):
                if index != len(head):
                    break
                head.append(None if token is None else int(token))
        return head

    def language_id(self, language: str) -> int:
        """`de`, `<|de|>` (or a name transformers' table knows as the token's text)."""
        token = language if language.startswith("<|") else f"<|{language.lower()}|>"
        if token not in self.lang_to_id:
            known = ", ".join(sorted(k.strip("<|>") for k in self.lang_to_id)) or "none"
            raise LinnetError(f"language {language!r} is not in this checkpoint (known: {known})")
        return self.lang_to_id[token]

    def task_id(self, task: str) -> int:
        if task not in TASKS or task not in self.task_to_id:
            raise LinnetError(f"task {task!r}: choose transcribe or translate")
        return self.task_to_id[task]


@dataclass
class Transcription:
    tokens: list[list[int]]  # per window: the generated tokens (prompt excluded, eos kept)
    languages: list[int | None]  # per window: the language token used
    text: str | None = None  # with a tokenizer
    segments: list[Segment] | None = None  # with timestamps


def _host(x) -> np.ndarray:
    return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, dtype=np.float32)


def detect_language(model, rules: WhisperRules, batch: int) -> list[int]:
    """The decoder's most likely language token after the start token, per item (after
    `model.encode`)."""
    logits = _host(model.decode(np.full((batch, 1), rules.start, dtype=np.int64), 0))
    ids = np.array(sorted(rules.lang_to_id.values()))
    return [int(ids[i]) for i in logits[:, ids].argmax(-1)]


def prompts(model, rules: WhisperRules, batch: int, language, task, timestamps=False) -> np.ndarray:
    """The start tokens for each item [B, P] (after `model.encode`); with `timestamps`,
    no no_timestamps token (transformers drops one forced_decoder_ids put last)."""
    if not rules.multilingual and (language is not None or task is not None):
        raise LinnetError("this checkpoint is English-only: it takes no language or task")
    head = rules.head(language, task)
    langs = None
    if language is not None:
        langs = [rules.language_id(language)] * batch
    elif rules.lang_to_id and (len(head) <= 1 or head[1] is None):
        langs = detect_language(model, rules, batch)
    rows = []
    for i in range(batch):
        row = list(head)
        if langs is not None:
            row[1:2] = [langs[i]]  # replaces the slot to detect, or appends
        row = _with_task(row, rules, language, task)
        if timestamps:
            rules.timestamp_begin  # noqa: B018 (refuses a checkpoint without timestamps)
            row = row[:-1] if row[-1] == rules.no_timestamps else row
        elif rules.no_timestamps is not None and row[-1] != rules.no_timestamps:
            row.append(int(rules.no_timestamps))
        rows.append([t for t in row if t is not None])
    return np.array(rows, dtype=np.int64)


def _with_task(row: list, rules: WhisperRules, language, task) -> list:
    tasks = set(rules.task_to_id.values())
    if task is not None:
        tid = rules.task_id(task)
        return [tid if t in tasks else t for t in row] if tasks & set(row) else row + [tid]
    if language is not None and rules.task_to_id and not tasks & set(row):
        return row + [rules.task_id("transcribe")]
    return row


def greedy(model, prompt: np.ndarray, rules: WhisperRules, max_new_tokens: int,
           timestamps: bool = False) -> list[list[int]]:  # fmt: skip
    """Greedy tokens after `prompt` (after `model.encode`), with the suppression rules (and
    the timestamp rules), in transformers' order: begin-suppress, suppress, timestamps."""
    batch = prompt.shape[0]
    decode, bounded = _step(model, timestamps)
    logits = decode(prompt, 0)
    out: list[list[int]] = [[] for _ in range(batch)]
    done = np.zeros(batch, dtype=bool)
    for step in range(max_new_tokens):
        scores = rule_scores(_host(logits.logits if bounded else logits), rules, out, timestamps)
        token = logits.argmax(scores) if bounded else scores.argmax(-1)
        for i in np.flatnonzero(~done):
            out[i].append(int(token[i]))
        done |= np.isin(token, rules.eos)
        if done.all() or step + 1 == max_new_tokens:
            break
        logits = decode(token[:, None].astype(np.int64), prompt.shape[1] + step)
    return out


def _step(model, timestamps: bool):
    """(the decode call, whether it gives `BoundedLogits`): numerics="fast" ONNX projects to
    the vocabulary in int8 and makes the argmax exact (linnet/onnx_vocab.py); the timestamp
    rule reads whole rows' probabilities, so there the f32 row."""
    if not timestamps and getattr(model, "vocab", None) is not None:
        return model.decode_bounded, True
    return model.decode, False


def rule_scores(logits: np.ndarray, rules: WhisperRules, out: list[list[int]], timestamps):
    """One step's scores [B, V] after the rules; `out`: each row's tokens so far."""
    scores = logits.copy()
    if not any(out):
        scores[:, rules.begin_suppress] = -np.inf
    scores[:, rules.suppress] = -np.inf
    if timestamps:
        timestamp_rule(scores, out, rules, first=not any(out))
    return scores


def transcribe_features(
    model, features: np.ndarray, rules: WhisperRules, *, language=None, task=None,
    max_new_tokens: int | None = None, timestamps: bool = False, prompt=None,
) -> tuple[list, np.ndarray]:  # fmt: skip
    """Tokens for a batch of log-mel windows [B, n_mels, frames], and the prompts used
    (`prompt`: these start tokens rather than new ones, as a long-form window takes the
    first window's)."""
    model.encode(features)
    if prompt is None:
        prompt = prompts(model, rules, features.shape[0], language, task, timestamps)
    room = model.max_positions - prompt.shape[1]
    limit = min(room, rules.max_length - prompt.shape[1], max_new_tokens or room)
    return greedy(model, prompt, rules, limit, timestamps), prompt


def load_samples(audio, sampling_rate: int | None, target: int) -> np.ndarray:
    """A path (read and resampled) or samples at `sampling_rate` (default: the model's)."""
    if isinstance(audio, (str, Path)):
        if sampling_rate is not None:
            raise LinnetError("sampling_rate is for arrays of samples; a file says its own")
        return read_audio(audio, target)
    samples = check_samples(audio)
    return resample(samples, target if sampling_rate is None else sampling_rate, target)


def transcribe(model, audio, *, language=None, task=None, sampling_rate=None,
               max_new_tokens=None, folder=None, tokenizer=None,
               timestamps=False) -> Transcription:  # fmt: skip
    """Audio (a file or samples) through the model, one 30 s window at a time (with
    `timestamps`, windows that start at the last timestamp, and segments)."""
    folder = folder if folder is not None else getattr(model, "folder", None)
    rules = WhisperRules.from_folder(folder, getattr(model, "hf_config", None))
    front = FrontEnd.from_folder(folder or ".", n_mels=model.config["n_mels"])
    samples = load_samples(audio, sampling_rate, front.sampling_rate)
    options = dict(language=language, task=task, max_new_tokens=max_new_tokens)
    if timestamps:
        result = _sequential(model, samples, front, rules, options)
    else:
        result = Transcription(tokens=[], languages=[])
        for window in front.windows(samples):
            tokens, prompt = transcribe_features(model, window[None], rules, **options)
            result.tokens.append(tokens[0])
            result.languages.append(_language_of(prompt[0], rules))
    if tokenizer is not None:
        _decode_text(result, tokenizer, rules, timestamps)
    return result


def _language_of(prompt: np.ndarray, rules: WhisperRules) -> int | None:
    langs = set(rules.lang_to_id.values()) & set(prompt.tolist())
    return langs.pop() if langs else None


def _sequential(model, samples, front: FrontEnd, rules: WhisperRules, options) -> Transcription:
    """transformers' sequential long-form decoding with timestamps: up to 30 s of the whole
    audio's features (zero-padded to the window), the start tokens of the first window for
    all, the next window from the last timestamp (or the window's end). Audio of one window
    or less is one padded window (short-form)."""
    window = front.window_frames
    if samples.size <= front.window_samples:
        mel = front.features(samples)  # short-form: seek over the whole padded window
    else:
        mel = front.all_features(samples)
    result = Transcription(tokens=[], languages=[], segments=[])
    seek, prompt = 0, None
    while seek < mel.shape[-1]:
        frames = min(mel.shape[-1] - seek, window)
        chunk = np.zeros((1, mel.shape[0], window), dtype=np.float32)
        chunk[0, :, :frames] = mel[:, seek : seek + frames]
        tokens, prompt = transcribe_features(
            model, chunk, rules, timestamps=True, prompt=prompt, **options
        )
        result.tokens.append(tokens[0])
        result.languages.append(_language_of(prompt[0], rules))
        seq = tokens[0][:-1] if tokens[0] and tokens[0][-1] in rules.eos else tokens[0]
        offset = seek * TIME_PRECISION / INPUT_STRIDE
        found, advance = split_segments(seq, rules.timestamp_begin, offset, frames)
        result.segments.extend(found)
        seek += advance
    return result


def _decode_text(result: Transcription, tokenizer, rules: WhisperRules, timestamps) -> None:
    """Text without special or timestamp tokens, per segment and in all."""
    begin = rules.timestamp_begin if timestamps else None

    def text(tokens):
        kept = [t for t in tokens if begin is None or t < begin]
        return tokenizer.decode(kept, skip_special_tokens=True)

    if result.segments is not None:
        for segment in result.segments:
            segment.text = text(segment.tokens).strip()
        result.text = "".join(text(s.tokens) for s in result.segments).strip()
    else:
        result.text = "".join(text(t) for t in result.tokens).strip()
