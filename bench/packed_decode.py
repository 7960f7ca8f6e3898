#!/usr/bin/env python
"""Packed-weight decode in one process, rounds interleaved: Linnet (numerics="fast") with
its integer C++ kernel (x rounded to int8, AVX512-VNNI or AVX2), the same with the step's
norms, rope and attention on PyTorch's ops instead of decode_ops.cpp ("torch step ops"),
with its f32 C++ kernel (LINNET_INT8X=0), Linnet's PyTorch path (LINNET_KERNELS=0: what
ran before the kernels), the first with its weights in 4 KB pages (LINNET_HUGE_PAGES=0:
before session 21; and so without the row kernels' page-ahead prefetch, page_ahead.h:
before session 24) and all in 2 MB pages (LINNET_HUGE_PAGES=always), and llama.cpp
(mapping the file, its default, and reading it into its own memory), all on the same
GGUF file; for q4_k also the integer kernel with the file's q5_0 matrices in q8_0's
layout (before session 15). With `--threads 2` also Linnet's step with each linear split
over torch's threads (LINNET_STREAM_AHEAD=0: before session 25, when the step did not yet
run on one core with a helper thread on the other, linnet/backends/torch/stream_ahead.py),
and with the helper only reading the weights ahead, not sharing the linears' rows
(session 25's step for bf16 and q8_0, before session 26).

    python bench/packed_decode.py --dtypes q8_0,q4_0,bf16 --threads 1 --rounds 5

Each round runs every variant once (so a burst of load from other jobs hits all of
them), and each figure is the median over rounds. `--threads 1` times CPU time
(`time.process_time`: one thread each, what other jobs on the cores change least);
`--threads 2` times the wall clock. The prompt is run untimed, then N one-token greedy
decode steps are timed (llama.cpp: `eval` of the sampled token; both use `threads` threads
for the prompt too). The GGUF files are bench/run.py's
exports (`bench/results/gguf/<checkpoint>/model-<dtype>.gguf`). Writes
bench/results/checks/packed_decode.json with the machine (CPU flags, load) and the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import huge_pages, machine, provenance, versions  # noqa: E402
from bench.run import RESULTS, checkpoint_for, export_ggufs  # noqa: E402


def linnet_decoder(path: Path, dtype: str, q5_as_q8=False, pages=None):
    """decode(prompt, n): prefill untimed, then n one-token greedy steps timed; q5_as_q8:
    the file's q5_0 matrices held in q8_0's layout (what every load did before session 15,
    and what CPUs whose integer kernel is VNNI's hold); pages: LINNET_HUGE_PAGES while
    loading ("0": the weights where torch allocated them, as before session 21; "always":
    every weight in 2 MB pages however slow they come; None: the default)."""
    import os

    import linnet.quantize
    import linnet.torch as lt

    keep = linnet.quantize.int8x_reads_q5_0
    if q5_as_q8:
        linnet.quantize.int8x_reads_q5_0 = lambda: False
    if pages is not None:
        os.environ["LINNET_HUGE_PAGES"] = pages
    try:
        model = lt.load(str(path), dtype=dtype, mode="generated", numerics="fast")
    finally:
        linnet.quantize.int8x_reads_q5_0 = keep
        os.environ.pop("LINNET_HUGE_PAGES", None)

    def decode(ids, n, clock):
        model.reset()
        logits = model.decode(ids, 0)
        t0 = clock()
        for _ in range(n):
            logits = model.decode(logits.argmax(-1, keepdim=True), model.position)
        return clock() - t0

    return decode


def llamacpp_decoder(gguf: Path, threads: int, use_mmap=True):
    """use_mmap=False: the file read into llama.cpp's own memory, not mapped from the
    page cache (whose 2 MB pages come and go with the machine's history)."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(gguf), n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False,
        use_mmap=use_mmap,
    )  # fmt: skip

    def decode(ids, n, clock):
        llm.reset()
        llm.eval(ids[0].tolist())
        t0 = clock()
        for _ in range(n):
            llm.eval([llm.sample(top_k=1, temp=0.0)])
        return clock() - t0

    return decode


def variants(gguf: Path, dtype: str, threads: int, ckpt: str) -> dict:
    """name -> (decode(ids, n, clock), LINNET_KERNELS for it); bf16: Linnet loads the HF
    folder in bf16 (its bf16 GEMV), llama.cpp the bf16 GGUF export; f32: both the f32 GGUF
    export (Linnet's linears through MKL, tall ones column-major: docs/torch.md)."""
    path = Path(ckpt) if dtype == "bf16" else gguf
    run = linnet_decoder(path, dtype)
    small_pages = linnet_decoder(path, dtype, pages="0")
    found = {
        "linnet int8 x": (run, "1"),
        "linnet int8 x, 4 KB pages": (small_pages, "1"),
        "linnet int8 x, 4 KB pages, no page-ahead": (small_pages, "nopage"),
        "linnet int8 x, 2 MB pages always": (linnet_decoder(path, dtype, pages="always"), "1"),
        "linnet torch step ops": (run, "nostep"),
        "linnet kernel": (run, "int8x=0"),
        "linnet pytorch": (run, "0"),
        "llama.cpp": (llamacpp_decoder(gguf, threads), "1"),
        "llama.cpp, no mmap": (llamacpp_decoder(gguf, threads, use_mmap=False), "1"),
    }
    if threads > 1:  # each linear over torch's threads: what two threads ran before session 25
        found["linnet int8 x, linears split"] = (run, "split")
        found["linnet int8 x, read ahead only"] = (run, "noshare")  # session 25's helper
    if dtype in ("bf16", "f32"):  # no packed weights: the integer kernel does not apply
        split = ("linears split", "read ahead only") if threads > 1 else ()
        for pages in ("4 KB pages", "4 KB pages, no page-ahead", "2 MB pages always", *split):
            found[f"linnet kernel, {pages}"] = found.pop(f"linnet int8 x, {pages}")
        del found["linnet int8 x"], found["linnet torch step ops"]
    if dtype == "q4_k":  # most of SmolLM2's q4_K_M is q5_0 (576-wide rows)
        found["linnet int8 x, q5_0 as q8_0"] = (linnet_decoder(gguf, dtype, q5_as_q8=True), "1")
    return found


def measure(dtype: str, gguf: Path, ckpt: str, args, clock) -> tuple[dict, dict]:
    """Each variant's figures, and the MB in 2 MB pages while they are all loaded."""
    import os

    import torch

    from linnet.backends.torch import kernels as kernels_mod

    step_ops = kernels_mod.step_ops
    ids = torch.randint(0, 49152, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    runs = variants(gguf, dtype, args.threads, ckpt)
    times: dict[str, list[float]] = {name: [] for name in runs}
    ops = kernels_mod.load()  # its page_ahead op: the distance for each variant's rounds
    ahead = ops.page_ahead(0)  # the default, put back below
    for _ in range(args.rounds):
        for name, (decode, kernels) in runs.items():
            ops.page_ahead(0 if kernels == "nopage" else ahead)
            # both read on every packed linear call; int8x=0: the f32 kernel
            os.environ["LINNET_KERNELS"] = "0" if kernels == "0" else "1"
            os.environ["LINNET_INT8X"] = "0" if kernels == "int8x=0" else "1"
            kernels_mod.step_ops = (lambda: None) if kernels == "nostep" else step_ops
            if kernels == "split":  # not streamed ahead on the other core (stream_ahead.py)
                os.environ["LINNET_STREAM_AHEAD"] = "0"
            else:
                os.environ.pop("LINNET_STREAM_AHEAD", None)
            ops.stream_ahead_share(kernels != "noshare")
            decode(ids, 2, clock)  # warm: buffers, caches, the kernel's first build
            times[name].append(1e3 * decode(ids, args.new, clock) / args.new)
    kernels_mod.step_ops = step_ops
    ops.page_ahead(ahead)
    ops.stream_ahead_share(True)
    os.environ.pop("LINNET_KERNELS")
    os.environ.pop("LINNET_INT8X")
    os.environ.pop("LINNET_STREAM_AHEAD", None)
    found = {name: {"ms_per_token": statistics.median(t), "rounds": t} for name, t in times.items()}
    return found, huge_pages(gguf)  # read while the variants are alive


def gguf_setup(args):
    """What a run over the GGUF exports starts with: torch's threads, the clock (CPU time
    for one thread, else the wall), the checkpoint, its exports for `args.dtypes` (made once,
    bench/run.py's) and the report's head (machine, provenance, versions, clock)."""
    import torch

    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    ckpt = checkpoint_for(args.model)
    gguf_dir = RESULTS / "gguf" / Path(ckpt).name
    gguf_dir.mkdir(parents=True, exist_ok=True)
    export_ggufs(ckpt, args.dtypes.split(","), gguf_dir)
    report = {"machine": machine(), "provenance": provenance(), "args": vars(args) | {"out": ""}}
    report["versions"] = versions(("torch", "llama_cpp", "linnet"))
    report["clock"] = clock.__name__
    return clock, ckpt, gguf_dir, report


def write_report(report: dict, out: Path) -> None:
    """The machine after the run (its load then) added, the report written to `out`."""
    report["machine_after"] = machine()
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {out}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtypes", default="q8_0,q4_0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=36)
    parser.add_argument("--new", type=int, default=24)
    parser.add_argument("--out", type=Path, default=RESULTS / "checks" / "packed_decode.json")
    args = parser.parse_args(argv)
    clock, ckpt, gguf_dir, report = gguf_setup(args)
    for dtype in args.dtypes.split(","):
        rows, pages = measure(dtype, gguf_dir / f"model-{dtype}.gguf", ckpt, args, clock)
        report.setdefault("results", {})[dtype] = rows
        report.setdefault("huge_pages", {})[dtype] = pages
        cpp = rows["llama.cpp"]["ms_per_token"]
        print(f"{dtype} 2 MB pages: {pages}")
        for name, row in rows.items():
            speed = cpp / row["ms_per_token"]
            print(
                f"{dtype} {name:<28} {row['ms_per_token']:8.1f} ms/token  {speed:5.2f}x llama.cpp"
            )
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
