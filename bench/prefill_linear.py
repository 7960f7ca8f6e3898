#!/usr/bin/env python
"""One prefill linear of a packed weight, each way Linnet could run it, on this CPU.

    python bench/prefill_linear.py --tokens 512 --threads 1

For SmolLM2's shapes (qkv 960x576, gate 1536x576, down 576x1536, the tied head
49152x576) quantized to q8_0, x of `--tokens` rows: the blocked path in f32 (a block of
rows dequantized, MKL's f32 GEMM), the blocked path in bf16 (numerics="fast" on a CPU with
bf16 dot products), Linnet's integer kernel on 64-row chunks, and torch's f32 and bf16
GEMMs on the dense weight for reference. Milliseconds, best of `--rounds`; writes the
machine (CPU flags, load before and after) with them to bench/results/checks/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import machine, provenance, versions  # noqa: E402
from bench.packed_decode import write_report  # noqa: E402
from bench.run import RESULTS  # noqa: E402

SHAPES = {"qkv": (960, 576), "gate": (1536, 576), "down": (576, 1536), "head": (49152, 576)}


def best_ms(fn, rounds: int) -> float:
    fn()  # untimed: buffers, first-call dispatch
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def ways(x, w):
    """name -> a call computing x @ w^T one way (None where it cannot run here)."""
    import torch

    from linnet.backends.torch import kernels, quantized

    dense = w.dequantize()
    dense_bf16, x_bf16 = dense.bfloat16(), x.bfloat16()

    def blocked(low: bool):
        def run():
            w.int8_x = low  # the fast mark: the bf16 blocks where the CPU has bf16 dots
            return quantized._blocked_linear(x, w)

        return run

    op = kernels.int8x_linear_op()

    def int8_chunks():
        rows = [
            op(x[i : i + 64].contiguous(), w.codes, w.scale, None) for i in range(0, len(x), 64)
        ]
        return torch.cat(rows)

    return {
        "blocked_f32": blocked(False),
        "blocked_bf16": blocked(True) if quantized._BF16_DOT else None,
        "int8_kernel_64_row_chunks": int8_chunks if op is not None else None,
        "dense_f32_mm": lambda: torch.mm(x, dense.t()),
        "dense_bf16_mm": lambda: torch.mm(x_bf16, dense_bf16.t()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "checks" / "prefill_linear.json")
    args = parser.parse_args(argv)
    import torch

    from linnet.quantize import quantize_params

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    report = {"machine": machine(), "provenance": provenance(), "args": vars(args)}
    report["versions"] = versions(["torch", "linnet"])
    for name, (rows, cols) in SHAPES.items():
        w = quantize_params({"w": torch.randn(rows, cols) * 0.02}, "q8_0")["w"]
        x = torch.randn(args.tokens, cols)
        flops = 2 * args.tokens * rows * cols
        timed = {k: best_ms(f, args.rounds) for k, f in ways(x, w).items() if f is not None}
        report.setdefault("results", {})[name] = {
            "shape": [rows, cols],
            "ms": timed,
            "gflops": {k: flops / ms / 1e6 for k, ms in timed.items()},
        }
        print(f"{name} {rows}x{cols}: " + ", ".join(f"{k} {ms:.1f} ms" for k, ms in timed.items()))
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
