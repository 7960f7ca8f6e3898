#!/usr/bin/env python
"""Where a decode step goes: SmolLM2-135M-Instruct at q8_0, `generated`/`fast`, one
thread, thread CPU time around each generated helper (norm, rope, attention, the packed
linears through `linear_fast`, silu) and the rest, with decode_ops.cpp's ops ("ops") and
without them ("torch": kernels.step_ops answers None, the PyTorch helpers run).

    python bench/decode_step_split.py [--out bench/results/checks/decode_step_split.json]

The 36-token prompt is untimed; the unwrapped step is the median of 3 runs of 24 steps,
the split the fastest of 3 runs of 12 steps with the timers in (they add ~1 µs a call).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import machine  # noqa: E402
from bench.run import RESULTS, checkpoint_for  # noqa: E402

HELPERS = ("rms_norm_fast", "rope_fast", "attention_fast", "linear_fast")


def split(model, ids, acc, cnt) -> tuple[float, dict]:
    def steps(n):
        model.reset()
        logits = model.decode(ids, 0)
        acc.clear(), cnt.clear()
        t0 = time.thread_time()
        for _ in range(n):
            logits = model.decode(logits.argmax(-1, keepdim=True), model.position)
        return (time.thread_time() - t0) / n * 1e3

    return steps


def timed(name, fn, acc, cnt):
    def wrapper(*args, **kwargs):
        t0 = time.thread_time()
        out = fn(*args, **kwargs)
        acc[name] += time.thread_time() - t0
        cnt[name] += 1
        return out

    return wrapper


def measure(model, ids, variant: str) -> dict:
    import torch.nn.functional as F

    from linnet.backends.torch import kernels

    acc, cnt = collections.Counter(), collections.Counter()
    steps = split(model, ids, acc, cnt)
    real = kernels.step_ops
    kernels.step_ops = (lambda: None) if variant == "torch" else real
    steps(2)
    plain = [steps(24) for _ in range(3)]
    scope = type(model.runner.module).decode.__globals__
    saved = {n: scope[n] for n in HELPERS} | {"silu": F.silu}
    # the linears: `linear_fast` (packed ones call packed_linear straight, not F.linear)
    scope.update({n: timed(n, saved[n], acc, cnt) for n in HELPERS})
    F.silu = timed("silu", F.silu, acc, cnt)
    best = None
    for _ in range(3):
        total = steps(12)
        if best is None or total < best[0]:
            best = (total, {k: (v / 12 * 1e3, cnt[k] // 12) for k, v in acc.items()})
    F.silu = saved["silu"]
    scope.update({n: saved[n] for n in HELPERS})
    kernels.step_ops = real
    total, parts = best
    rest = total - sum(ms for ms, _ in parts.values())
    return {
        "step_ms_unwrapped": statistics.median(plain),
        "runs_ms": plain,
        "step_ms_wrapped": total,
        "parts": {k: {"ms": ms, "calls": n} for k, (ms, n) in parts.items()},
        "rest_ms": rest,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "checks" / "decode_step_split.json")
    args = parser.parse_args(argv)
    import torch

    import linnet.torch as lt

    torch.set_num_threads(1)
    model = lt.load(checkpoint_for("smollm2"), dtype="q8_0", mode="generated", numerics="fast")
    ids = torch.randint(0, 49152, (1, 36), generator=torch.Generator().manual_seed(0))
    report = {"machine": machine(), "clock": "thread_time", "results": {}}
    for variant in ("ops", "torch", "ops"):  # ops twice: before and after the other
        row = measure(model, ids, variant)
        report["results"].setdefault(variant, []).append(row)
        parts = ", ".join(f"{k} {v['ms']:.2f} ({v['calls']})" for k, v in row["parts"].items())
        print(
            f"{variant}: step {row['step_ms_unwrapped']:.1f} ms; {parts}; rest {row['rest_ms']:.2f}"
        )
    report["machine_after"] = machine()
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
