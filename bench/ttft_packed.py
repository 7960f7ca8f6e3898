#!/usr/bin/env python
"""Time to first token of a long prompt (512 tokens by default), Linnet against llama.cpp on
the same GGUF file, rounds interleaved in one process.

    python bench/ttft_packed.py --dtypes q8_0,q4_k,f32 --rounds 3

Linnet: `mode="generated"`, `numerics="fast"`, the GGUF loaded as `dtype` (packed types stay
packed: a prompt above the packed kernels' 64 rows takes the blocked path, a block of rows
dequantized into a reused buffer and multiplied by MKL's f32 GEMM, or in bf16 where the CPU
has bf16 dot products: docs/torch.md, "Session 23"); bf16 loads the HF folder
in bf16, as bench/packed_decode.py does. llama.cpp: llama-cpp-python, `n_batch` = the prompt,
the same threads. What is timed is one prompt pass from an empty cache to the logits of its
last position (the first token's), after one untimed pass each. `--threads 1` times CPU time
(`time.process_time`), more threads the wall clock. Writes the machine (CPU flags, load
before and after) with the figures to bench/results/checks/ttft_packed.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.packed_decode import gguf_setup, write_report  # noqa: E402
from bench.run import RESULTS  # noqa: E402


def linnet_prompt(path: Path, dtype: str):
    import linnet.torch as lt

    model = lt.load(str(path), dtype=dtype, mode="generated", numerics="fast")

    def run(ids, clock):
        model.reset()
        t0 = clock()
        model.decode(ids, 0)
        return clock() - t0

    return run


def llamacpp_prompt(gguf: Path, threads: int, tokens: int):
    import llama_cpp

    llm = llama_cpp.Llama(
        str(gguf),
        n_ctx=max(512, 2 * tokens),
        n_batch=tokens,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )

    def run(ids, clock):
        llm.reset()
        t0 = clock()
        llm.eval(ids[0].tolist())
        return clock() - t0

    return run


def measure(dtype: str, gguf: Path, ckpt: str, args, clock) -> dict:
    import torch

    ids = torch.randint(0, 49152, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    runs = {
        "linnet": linnet_prompt(Path(ckpt) if dtype == "bf16" else gguf, dtype),
        "llama.cpp": llamacpp_prompt(gguf, args.threads, args.prompt),
    }
    for run in runs.values():
        run(ids, clock)  # untimed: buffers, the kernels' first build, page faults
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            times[name].append(run(ids, clock))
    return {name: {"seconds": statistics.median(t), "rounds": t} for name, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtypes", default="q8_0,q4_k,f32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--out", type=Path, default=RESULTS / "checks" / "ttft_packed.json")
    args = parser.parse_args(argv)
    clock, ckpt, gguf_dir, report = gguf_setup(args)
    for dtype in args.dtypes.split(","):
        rows = measure(dtype, gguf_dir / f"model-{dtype}.gguf", ckpt, args, clock)
        speed = rows["llama.cpp"]["seconds"] / rows["linnet"]["seconds"]
        rows["linnet_vs_llama_cpp"] = speed
        report.setdefault("results", {})[dtype] = rows
        print(
            f"{dtype:<5} {args.prompt}-token prompt: Linnet {rows['linnet']['seconds']:.2f} s, "
            f"llama.cpp {rows['llama.cpp']['seconds']:.2f} s  ({speed:.2f}x llama.cpp)"
        )
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
