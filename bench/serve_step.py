#!/usr/bin/env python
"""The server's model step by part, against the plain decode step `linnet run` takes.

    python bench/serve_step.py            # SmolLM2-135M-Instruct bf16, torch generated

CPU time of the calling thread (`time.thread_time`, torch at one thread: other jobs' load
distorts it far less than wall time), per step: the plain `decode` at batch 1, then a
`RowDecoder.step` of 1, 8 and 32 active rows of 32 (each row holding a 200-token prompt;
one row also through `decode_rows`, the path a lone row took before it stepped by
`decode`), the plain decode again. Each step is split by the generated code's helpers, wrapped with
timers: the linears (`linear_lowp`), attention, rope, per-row cache writes (`write_rows`),
norms; `other` is the rest (slices, adds, silu, the embedding, the host copy of the
logits). Writes bench/results/serve/serve-step.json with the machine record (its load)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import machine, provenance  # noqa: E402
from bench.serve import checkpoint  # noqa: E402

PARTS = ("linear_lowp", "attention_ref", "rope_ref", "write_rows", "rms_norm_ref")
PROMPT = 200
ROWS = 32


def timed_parts(namespace: dict, spent: dict) -> None:
    """Wrap the generated module's helpers so each adds its CPU time to `spent`."""
    for name in PARTS:
        inner = namespace[name]

        def timed(*args, _inner=inner, _name=name, **kwargs):
            start = time.thread_time()
            out = _inner(*args, **kwargs)
            spent[_name] = spent.get(_name, 0.0) + time.thread_time() - start
            return out

        namespace[name] = timed


def measure(call, spent: dict, repeats: int) -> dict:
    call()  # warm
    spent.clear()
    start = time.thread_time()
    for _ in range(repeats):
        call()
    total = (time.thread_time() - start) / repeats * 1e3
    out = {name: spent.get(name, 0.0) / repeats * 1e3 for name in PARTS}
    out["other"] = total - sum(out.values())
    return {"total_ms": total, **out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="an HF folder (default: SmolLM2-135M-Instruct f32)")
    p.add_argument("--mode", default="generated")
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/serve/serve-step.json")
    args = p.parse_args()
    import linnet.torch

    torch.set_num_threads(1)
    start_machine = machine()
    model = linnet.torch.load(
        checkpoint(args), dtype="bf16", mode=args.mode, max_positions=PROMPT + 64
    )
    spent: dict = {}
    timed_parts(vars(sys.modules[type(model.runner.module).__module__]), spent)
    prompt = np.random.default_rng(0).integers(100, 5000, PROMPT).tolist()
    rows = model.rows(ROWS, PROMPT + 32)
    for r in range(ROWS):
        rows.prefill(r, prompt)
    model.reset()
    model._decode(model._ids([prompt]), 0)
    one = model._ids([[5]])

    def step(active: int) -> None:
        rows.step(list(range(active)), [5] * active)
        for r in range(active):
            rows.lengths[r] -= 1  # the next step writes the same slot again

    def rows_entry_step() -> None:  # one row through `decode_rows`, as before 3eb22e3
        rows._rows_call(0, 1, np.full((1, 1), 5, np.int64), [0], [0])
        rows.lengths[0] -= 1

    results = {"plain decode": measure(lambda: model._decode(one, PROMPT), spent, args.repeats)}
    results["row step, 1 active, by decode_rows"] = measure(rows_entry_step, spent, args.repeats)
    for active in (1, 8, ROWS):
        key = f"row step, {active} of {ROWS} active"
        results[key] = measure(lambda a=active: step(a), spent, args.repeats)
    results["plain decode, again"] = measure(lambda: model._decode(one, PROMPT), spent, 8)
    report = {**provenance(), "machine": start_machine, "machine_end": machine(),
              "mode": args.mode, "torch_threads": 1, "prompt_tokens": PROMPT,
              "cpu_ms_per_step": results}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("| step | total | " + " | ".join(PARTS) + " | other |")
    for key, row in results.items():
        cells = " | ".join(f"{row[name]:.1f}" for name in (*PARTS, "other"))
        print(f"| {key} | {row['total_ms']:.1f} | {cells} |")


if __name__ == "__main__":
    main()
