#!/usr/bin/env python
"""f32 against bf16 (and numerics "equivalent" against "fast") for the server's model work.

    python bench/serve_dtype.py                  # SmolLM2-135M-Instruct, torch generated

CPU time of the calling thread (`time.thread_time`, torch at one thread: other jobs' load
distorts it far less than wall time) per `RowDecoder.step` of 1, 8 and 32 active rows of
32 (rows holding prompts of 128-512 tokens, as `bench/serve.py`'s workload) and per prompt
token of a 256-token prefill chunk, for each variant; the variants run in interleaved
rounds (one measurement of each per round) so a change of load hits them all alike; the
median over rounds is reported. Writes bench/results/serve/serve-dtype.json with the
machine record (its load at the start and the end)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import machine, provenance  # noqa: E402
from bench.serve import checkpoint  # noqa: E402

ROWS = 32
CHUNK = 256
VARIANTS = ("bf16/equivalent", "f32/equivalent", "f32/fast")


def rows_of(model, lengths: list[int]):
    """32 cache rows, row r prefilled with a prompt of lengths[r] tokens."""
    rows = model.rows(ROWS, max(lengths) + 32)
    rng = np.random.default_rng(0)
    for r, n in enumerate(lengths):
        rows.prefill(r, rng.integers(100, 5000, n).tolist())
    return rows


def cpu_ms(call, repeats: int) -> float:
    start = time.thread_time()
    for _ in range(repeats):
        call()
    return (time.thread_time() - start) / repeats * 1e3


def measures(model, rows, repeats: int) -> dict:
    """CPU ms per step of 1, 8 and 32 active rows, and per token of a prefill chunk."""

    def step(active: int) -> None:
        rows.step(list(range(active)), [5] * active)
        for r in range(active):
            rows.lengths[r] -= 1  # the next step writes the same slot again

    chunk = model._ids([list(range(100, 100 + CHUNK))])
    out = {f"step {a} of {ROWS}": cpu_ms(lambda a=a: step(a), repeats) for a in (1, 8, ROWS)}
    model.reset()
    out["prefill per token"] = cpu_ms(lambda: model._decode(chunk, 0), 2) / CHUNK
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="an HF folder (default: SmolLM2-135M-Instruct f32)")
    p.add_argument("--mode", default="generated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/serve/serve-dtype.json")
    args = p.parse_args()
    import linnet.torch

    torch.set_num_threads(1)
    start_machine = machine()
    lengths = np.random.default_rng(1).integers(128, 513, ROWS).tolist()
    loaded = {}
    for variant in args.variants.split(","):
        dtype, numerics = variant.split("/")
        model = linnet.torch.load(
            checkpoint(args), dtype=dtype, mode=args.mode, numerics=numerics,
            max_positions=max(lengths) + 64,
        )  # fmt: skip
        loaded[variant] = (model, rows_of(model, lengths))
    samples: dict = {v: {} for v in loaded}
    for _ in range(args.rounds):
        for variant, (model, rows) in loaded.items():
            for key, ms in measures(model, rows, args.repeats).items():
                samples[variant].setdefault(key, []).append(ms)
    results = {v: {k: statistics.median(s) for k, s in d.items()} for v, d in samples.items()}
    report = {**provenance(), "machine": start_machine, "machine_end": machine(),
              "mode": args.mode, "torch_threads": 1, "prompt_lengths": lengths,
              "rounds": args.rounds, "cpu_ms_median": results,
              "cpu_ms_samples": samples}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    keys = list(next(iter(results.values())))
    print("| variant | " + " | ".join(keys) + " |")
    for variant, row in results.items():
        print(f"| {variant} | " + " | ".join(f"{row[k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
