"""Speech (Whisper): audio the gate makes itself, through Linnet's own log-mel front end, into
Linnet's encoder-decoder and transformers' WhisperForConditionalGeneration.

    audio = made_audio(16000, 16000)                     # [2, samples], seed 0
    figures = measure_speech(model, reference, folder, hf_config, tolerance)

What a Hub repo holds is enough: config.json, generation_config.json (the start tokens and
the decoding rules), preprocessor_config.json (the front end's numbers) and the weights; the
tokenizer is not needed. Three outputs, each max |Δ| and rel:

* `encode`: the encoder's output against the reference encoder's last_hidden_state;
* `first`: the scores of the first generated step after the checkpoint's rules (Linnet's
  `decode` over the whole prompt through linnet.speech's suppress and begin-suppress rules,
  against the first step's processed scores of transformers' `generate`: the same tokens
  suppressed (-inf) on both sides, the others within the bounds), and the same top-1 token
  in every row;
* `greedy`: Linnet's greedy tokens under the checkpoint's rules (linnet.speech, what
  `transcribe` runs) equal transformers' `generate` over up to GREEDY_STEPS tokens in every
  row; its max |Δ| and rel are those of Linnet's decode steps, one token at a time along
  transformers' tokens, against transformers' logits over the same tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linnet.errors import CheckpointError
from linnet.parity.compare import compare
from linnet.parity.report import OutputFigures

#: Greedy tokens compared after the start tokens (issue 14: 32 steps).
GREEDY_STEPS = 32
#: The made audio: (tones in Hz, chirp from and to Hz, length as a share of the window).
SIGNALS = (((440.0, 1250.0), (200.0, 4000.0), 0.8), ((330.0, 2500.0), (3000.0, 300.0), 0.55))
#: generation_config.json and preprocessor_config.json: the gate needs both files.
NEEDED = {
    "generation_config.json": "the start tokens and decoding rules",
    "preprocessor_config.json": "the log-mel front end's numbers",
}


def made_audio(sampling_rate: int, window: int, seed: int = 0) -> list[np.ndarray]:
    """Deterministic audio, one clip per SIGNALS row (shorter than the window, so padding
    occurs): two tones, a linear chirp and white noise (std 0.01, `seed`), peak under 0.6."""
    rng = np.random.default_rng(seed)
    out = []
    for tones, (f0, f1), share in SIGNALS:
        n = int(window * share)
        t = np.arange(n) / sampling_rate
        sweep = 2 * np.pi * (f0 * t + (f1 - f0) * t**2 / (2 * max(t[-1], 1e-9)))
        clip = sum(0.15 * np.sin(2 * np.pi * f * t) for f in tones) + 0.2 * np.sin(sweep)
        out.append((clip + 0.01 * rng.standard_normal(n)).astype(np.float32))
    return out


def check_speech_folder(folder: Path) -> None:
    """Fail closed, naming the file, when a Whisper folder lacks what the gate reads."""
    for name, what in NEEDED.items():
        if not (Path(folder) / name).is_file():
            raise CheckpointError(
                f"{folder}: no {name} ({what}): the speech gate reads it as a Hub Whisper "
                "repo holds it",
                file=str(Path(folder) / name),
            )


def speech_features(folder: Path, config: dict) -> np.ndarray:
    """Linnet's log-mel features of the made audio, f32 [2, n_mels, frames], checked to be
    the window the encoder takes."""
    from linnet.audio import FrontEnd

    front = FrontEnd.from_folder(folder, n_mels=config["n_mels"])
    clips = made_audio(front.sampling_rate, front.window_samples)
    features = np.stack([front.features(c) for c in clips]).astype(np.float32)
    frames, want = features.shape[-1], 2 * config["source_positions"]
    if front.n_mels != config["n_mels"] or frames != want:
        raise CheckpointError(
            f"{folder}/preprocessor_config.json: {front.n_mels} mel bins x {frames} frames, "
            f"but the encoder takes {config['n_mels']} x {want}"
        )
    return features


def measure_speech(model, reference, folder, hf_config, config, tolerance) -> list[OutputFigures]:
    """encode, first and greedy (see the module) on the made audio."""
    import torch

    from linnet.speech import WhisperRules, greedy, prompts

    features = speech_features(folder, config)
    rules = WhisperRules.from_folder(folder, hf_config)
    mel = torch.from_numpy(features)
    label = f"made audio {list(features.shape)}, seed 0"
    with torch.no_grad():
        want = reference.get_encoder()(mel).last_hidden_state
    out = [compare(model.encode(features), want, label, "encode", tolerance, tokens=0)]
    prompt = prompts(model, rules, len(features), None, None)
    steps = min(GREEDY_STEPS, model.max_positions - prompt.shape[1])
    ours = greedy(model, prompt, rules, steps)
    theirs, first_scores = reference_greedy(reference, mel, steps, rules.eos)
    out.append(first_step(model, rules, prompt, first_scores, label, tolerance))
    out.append(teacher_forced(model, reference, mel, prompt, theirs, label, tolerance, ours))
    return out


def reference_greedy(reference, mel, steps: int, eos: list[int]):
    """transformers' `generate` under the checkpoint's generation config: the tokens per row
    cut after its first end token (it pads a finished row), and the first step's scores
    after its logits processors [B, V]."""
    import torch

    with torch.no_grad():
        out = reference.generate(
            input_features=mel, max_new_tokens=steps, output_scores=True,
            return_dict_in_generate=True,
        )  # fmt: skip
    new = out.sequences[:, out.sequences.shape[1] - len(out.scores) :]  # the prompt cut off
    return [_cut(row, eos) for row in new.tolist()], out.scores[0]


def _cut(row: list[int], eos: list[int]) -> list[int]:
    ends = [i for i, t in enumerate(row) if t in eos]
    return row[: ends[0] + 1] if ends else row


def first_step(model, rules, prompt, their_scores, label, tolerance) -> OutputFigures:
    """Linnet's first-step scores (the logits after the start tokens, then the rules) against
    transformers' first processed scores: the suppressed tokens (-inf) must be the same, the
    other scores are compared (suppressed ones read as 0 on both sides)."""
    import torch

    from linnet.speech import rule_scores

    model.reset()
    scores = rule_scores(_host(model.decode(prompt, 0)), rules, [[] for _ in prompt], False)
    ours_off = torch.from_numpy(np.isneginf(scores))
    theirs = their_scores.detach().float().cpu()
    theirs_off = torch.isneginf(theirs)
    top1 = int((torch.from_numpy(scores).argmax(-1) == theirs.argmax(-1)).sum())
    got = torch.from_numpy(scores).masked_fill(ours_off, 0.0)
    want = theirs.masked_fill(theirs_off, 0.0)
    extra = dict(tokens=int(prompt.shape[1]), rows=len(prompt), top1=top1)
    f = compare(got, want, label, "first", tolerance, **extra)
    only = int((ours_off != theirs_off).sum())
    if only:
        f.passed = False
        f.why = "; ".join(filter(None, [f.why, f"{only} scores suppressed on one side only"]))
    return f


def teacher_forced(model, reference, mel, prompt, theirs, label, tolerance, ours):
    """Linnet's decode steps along transformers' tokens (one at a time, the cache growing)
    against transformers' logits over the same tokens; `top1`: rows whose greedy tokens
    (`ours`, decoded freely) are transformers' (`theirs`)."""
    import torch

    width = max(len(r) for r in theirs)
    pad = [r + [r[-1]] * (width - len(r)) for r in theirs]  # finished rows: any token
    tokens = np.concatenate([prompt, np.array(pad, dtype=np.int64)], axis=1)
    p = prompt.shape[1]
    model.reset()
    steps = [_host(model.decode(prompt, 0))]
    for k in range(width - 1):
        steps.append(_host(model.decode(tokens[:, p + k : p + k + 1], p + k)))
    got = torch.from_numpy(np.stack(steps, axis=1))
    with torch.no_grad():
        ids = torch.from_numpy(tokens[:, :-1])
        want = reference(input_features=mel, decoder_input_ids=ids).logits[:, p - 1 :]
    same = sum(a == b for a, b in zip(ours, theirs))
    extra = dict(tokens=width, rows=len(theirs), top1=same)
    return compare(got, want, label, "greedy", tolerance, **extra)


def _host(x) -> np.ndarray:
    host = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)
    return np.array(host, dtype=np.float32)  # a copy: torch.from_numpy needs it writable
