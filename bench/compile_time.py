"""How long `mode="compile"` takes to compile, and how fast it then decodes (issue 21).

    python bench/compile_time.py --model PATH [--numerics fast] [--whole] [--out FILE]

Loads the checkpoint in `mode="compile"`, then times, in this process: the first decode
call (a 128-token prompt from position 0: its compile and its run), the second (the first
one-token step: the S=1 graphs), and the steady state (greedy one-token steps after a few
warm ones, tokens/s). `--whole` compiles each entry whole, as before issue 21 (one graph
of every layer). Inductor's on-disk cache is wherever `TORCHINDUCTOR_CACHE_DIR` points
(Linnet's default: `$LINNET_CACHE/inductor`): an empty folder gives the cold figure, a
second run the warm one. Prints one JSON line with the machine (bench/common.py).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import machine, provenance  # noqa: E402


def load(path: str, numerics: str, whole: bool):
    import linnet.torch as lt

    if not whole:
        return lt.load(path, dtype="f32", mode="compile", numerics=numerics)
    model = lt.load(path, dtype="f32", mode="generated", numerics=numerics)
    runner = model.runner
    runner.methods = {e: torch.compile(m, dynamic=True) for e, m in runner.methods.items()}
    return model


def cpu_seconds() -> float:
    """CPU time of this process and the compilers it waited for: under load the wall clock
    mostly measures the other jobs."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(model, prompt_len: int, steps: int, warm: int) -> dict:
    ids = torch.randint(
        0, model.config["vocab"], (1, prompt_len), generator=torch.Generator().manual_seed(0)
    )
    model.reset()
    c0, t0 = cpu_seconds(), time.perf_counter()
    logits = model.decode(ids, 0)
    c1, t1 = cpu_seconds(), time.perf_counter()
    token = logits.argmax(-1, keepdim=True)
    logits = model.decode(token, prompt_len)
    c2, t2 = cpu_seconds(), time.perf_counter()
    pos = prompt_len + 1
    for _ in range(warm):
        logits = model.decode(logits.argmax(-1, keepdim=True), pos)
        pos += 1
    t3 = time.perf_counter()
    for _ in range(steps):
        logits = model.decode(logits.argmax(-1, keepdim=True), pos)
        pos += 1
    t4 = time.perf_counter()
    return {
        "first_call_s": round(t1 - t0, 2),
        "second_call_s": round(t2 - t1, 2),
        "first_call_cpu_s": round(c1 - c0, 2),
        "second_call_cpu_s": round(c2 - c1, 2),
        "steady_tok_s": round(steps / (t4 - t3), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--numerics", default="fast")
    parser.add_argument("--whole", action="store_true", help="compile entries whole (before)")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    load_before = list(os.getloadavg())
    start = time.perf_counter()
    model = load(args.model, args.numerics, args.whole)
    result = {
        "numerics": args.numerics,
        "whole": args.whole,
        "load_s": round(time.perf_counter() - start, 2),
        **measure(model, args.prompt, args.steps, warm=4),
        "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "load_average_before": load_before,
        "machine": machine(),
        **provenance(),
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
