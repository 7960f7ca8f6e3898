"""`linnet transcribe NAME_OR_PATH AUDIO`: speech to text with a Whisper checkpoint.

The audio (WAV, FLAC, OGG; any rate, resampled to the model's) is read and checked before the
model loads, so bad audio fails fast with `error: FILE: ...` and exit 1. The text goes to
stdout (the token ids when the checkpoint has no tokenizer), the time taken to stderr.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from linnet.commands.run import _CHECKPOINT, _REVISION, _TARGET, _check_checkpoint, _locate
from linnet.commands.session import BACKEND_OPTION, MODE_OPTION, load_model
from linnet.errors import CheckpointError, LinnetError


def _tokenizer_or_none(folder: Path):
    """The checkpoint's tokenizer, or None when it has none (token ids are printed then)."""
    from linnet.parity import load_tokenizer

    if not any((folder / name).is_file() for name in ("tokenizer.json", "vocab.json")):
        return None  # transformers would make an empty tokenizer that decodes to ""
    try:
        return load_tokenizer(folder)
    except CheckpointError:
        return None


@click.command()
@_TARGET
@click.argument("audio", type=click.Path(path_type=Path))
@click.option("--language", default=None, help="a language code (en, de, ...); default: detected")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default=None)
@click.option("--max-new-tokens", type=click.IntRange(1), default=None, help="per 30 s window")
@click.option("--timestamps", is_flag=True, help="segments with start and end seconds")
@BACKEND_OPTION
@MODE_OPTION
@_CHECKPOINT
@_REVISION
def transcribe(target, audio, language, task, max_new_tokens, timestamps, backend, mode,
               checkpoint, revision):  # fmt: skip
    """Transcribe (or translate) speech with a Whisper checkpoint."""
    from linnet.audio import FrontEnd, read_audio
    from linnet.speech import transcribe as run_transcribe

    found = _locate(target, checkpoint, revision)
    _check_checkpoint(found.checkpoint)
    rate = FrontEnd.from_folder(found.folder).sampling_rate
    samples = read_audio(audio, rate)  # bad audio fails before the model loads
    model, load_s = load_model(
        found.checkpoint, backend=backend, mode=mode, dtype=None, positions=None
    )
    if not hasattr(model, "transcribe"):
        raise LinnetError(f"{target} is no speech model (it has no `encode` entry)")
    tokenizer = _tokenizer_or_none(found.folder)
    t0 = time.perf_counter()
    result = run_transcribe(
        model, samples, language=language, task=task, max_new_tokens=max_new_tokens,
        folder=found.folder, tokenizer=tokenizer, timestamps=timestamps,
    )  # fmt: skip
    took = time.perf_counter() - t0
    if result.segments is not None:
        for s in result.segments:
            words = s.text if s.text is not None else " ".join(map(str, s.tokens))
            click.echo(f"[{s.start:.2f} -> {s.end:.2f}] {words}")
    elif result.text is not None:
        click.echo(result.text)
    else:
        for tokens in result.tokens:
            click.echo(" ".join(map(str, tokens)))
    click.echo(
        f"(load {load_s:.1f} s; {samples.size / rate:.1f} s of audio in {took:.2f} s, "
        f"{len(result.tokens)} window{'s' if len(result.tokens) > 1 else ''})",
        err=True,
    )
