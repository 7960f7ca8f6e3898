#!/usr/bin/env python
"""The 32-row step's attention, f32: the C++ op of each row over its own keys
(`decode_attention_rows`, numerics "fast") against the same step without it (masked SDPA
over the longest row's reach) and against numerics "equivalent" (`attention_ref`).

    python bench/serve_rows_attention.py         # SmolLM2-135M-Instruct f32, torch generated

CPU time of the calling thread (`time.thread_time`, torch at one thread) per step of 32
rows holding 128-512 tokens each (`bench/serve.py`'s prompt lengths; the cache holds zeros:
the work does not depend on the values), the step's attention calls timed apart; the
variants run in interleaved rounds and the median over rounds is reported. Writes
bench/results/serve/serve-rows-attention.json with the machine record (its load)."""

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


def timed(namespace: dict, name: str, spent: list) -> None:
    inner = namespace[name]

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        out = inner(*args, **kwargs)
        spent[0] += time.thread_time() - start
        return out

    namespace[name] = wrapper


def variant(ckpt: str, numerics: str, op: bool, lengths: list[int], dtype: str = "f32"):
    """A model's 32 rows at `lengths`; its attention helper timed into the returned list."""
    import linnet.torch

    model = linnet.torch.load(
        ckpt, dtype=dtype, mode="generated", numerics=numerics, max_positions=max(lengths) + 64
    )
    namespace = vars(sys.modules[type(model.runner.module).__module__])
    if not op:
        namespace["_rows_attention"] = lambda *args: None
    spent = [0.0]
    timed(namespace, "attention_fast" if numerics == "fast" else "attention_ref", spent)
    rows = model.rows(ROWS, max(lengths) + 32)
    rows.lengths[:] = lengths
    return rows, spent


def step_ms(rows, spent: list, repeats: int) -> tuple[float, float]:
    spent[0] = 0.0
    start = time.thread_time()
    for _ in range(repeats):
        rows.step(list(range(ROWS)), [5] * ROWS)
        for r in range(ROWS):
            rows.lengths[r] -= 1  # the next step writes the same slot again
    return (time.thread_time() - start) / repeats * 1e3, spent[0] / repeats * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="an HF folder (default: SmolLM2-135M-Instruct f32)")
    p.add_argument("--dtype", default="f32", help="bf16: q, k, v widened to f32 for the op")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--out", type=Path, default=ROOT / "bench/results/serve/serve-rows-attention.json"
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    start_machine = machine()
    lengths = np.random.default_rng(1).integers(128, 513, ROWS).tolist()
    ckpt = checkpoint(args)
    loaded = {
        "fast, rows op": variant(ckpt, "fast", True, lengths, args.dtype),
        "fast, masked SDPA": variant(ckpt, "fast", False, lengths, args.dtype),
        "equivalent (attention_ref)": variant(ckpt, "equivalent", True, lengths, args.dtype),
    }
    samples: dict = {name: {"step_ms": [], "attention_ms": []} for name in loaded}
    for _ in range(args.rounds + 1):  # the first round warms up and is dropped
        for name, (rows, spent) in loaded.items():
            total, attention = step_ms(rows, spent, args.repeats)
            samples[name]["step_ms"].append(total)
            samples[name]["attention_ms"].append(attention)
    results = {
        name: {key: statistics.median(values[1:]) for key, values in s.items()}
        for name, s in samples.items()
    }
    report = {**provenance(), "machine": start_machine, "machine_end": machine(),
              "dtype": args.dtype, "torch_threads": 1, "row_lengths": lengths,
              "rounds": args.rounds, "cpu_ms_median": results,
              "cpu_ms_samples": samples}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"| 32-row step, {args.dtype} | CPU ms per step | of which attention |")
    for name, row in results.items():
        print(f"| {name} | {row['step_ms']:.1f} | {row['attention_ms']:.1f} |")


if __name__ == "__main__":
    main()
