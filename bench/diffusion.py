"""The SD VAE decoder, the SDXL UNet and SAM ViT-Base side by side at batch 1, f32: Linnet
(PyTorch interpret, generated equivalent and fast, compile, ONNX on onnxruntime) against the
reference (diffusers or transformers) eager, under torch.compile (default mode) and exported
by torch.onnx (TorchScript exporter, opset 17) on onnxruntime, on the same random weights and
inputs (bench/diffusion_models.py: the shapes).

    python bench/diffusion.py [--models vae,unet,sam] [--scale small] [--repeats 3]
                              [--threads 1] [--skip METHOD]
                              [--out bench/results/checks/diffusion.json]

Per method: the first call (compile time where a method compiles), the median wall time of
`--repeats` calls, the median process CPU time of a call (user + system over every thread:
less distorted by other processes' load than wall time), its ratio to the fastest reference
and max |Δ| of every output against the reference eager. The record carries bench/common.py's
machine (with the load average and `under_load`). The record goes under bench/results/checks/:
the site renders only the files directly in bench/results, and knows no such suite yet.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, provenance, versions  # noqa: E402
from bench.diffusion_models import TASKS, Task  # noqa: E402

REFERENCES = ("reference eager", "reference compile", "reference onnx")


THREADS = {"n": 1}  # set by --threads: torch's intra-op threads and onnxruntime's


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def ort_options():
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS["n"]
    return options


def linnet_methods(task: Task, folder: Path, work: Path) -> dict:
    """name -> a function (inputs) -> a zero-argument call returning numpy outputs."""
    import numpy as np

    def on_torch(mode, numerics):
        import linnet.torch as lt

        model = lt.load(folder, mode=mode, numerics=numerics)
        return lambda args: lambda: [np.asarray(o) for o in task.linnet(model.run, args)]

    def on_onnx():
        import linnet.onnx

        out = linnet.onnx.export(folder, work / f"{task.name}-linnet-onnx", progress=False)
        model = linnet.onnx.load(out, threads=THREADS["n"])

        def bind(args):
            arrays = [a.numpy() for a in args]
            return lambda: [np.asarray(o) for o in task.linnet(model.run, arrays)]

        return bind

    return {
        "linnet interpret": lambda: on_torch("interpret", "equivalent"),
        "linnet generated, equivalent": lambda: on_torch("generated", "equivalent"),
        "linnet generated, fast": lambda: on_torch("generated", "fast"),
        "linnet compile, fast": lambda: on_torch("compile", "fast"),
        "linnet onnx (onnxruntime)": on_onnx,
    }


def reference_methods(task: Task, folder: Path, work: Path) -> dict:
    import numpy as np
    import torch

    def torch_call(compiled):
        module = task.reference(folder)
        run = torch.compile(module) if compiled else module

        def bind(args):
            @torch.no_grad()
            def call():
                return [o.numpy() for o in run(*args)]

            return call

        return bind

    def onnx_call():
        import onnxruntime as ort

        path = work / f"{task.name}-reference.onnx"
        module = task.reference(folder)

        def bind(args):
            with torch.no_grad():
                torch.onnx.export(
                    module, args, str(path), dynamo=False, input_names=task.input_names,
                    output_names=task.output_names, opset_version=17,
                )  # fmt: skip
            session = ort.InferenceSession(
                str(path), ort_options(), providers=["CPUExecutionProvider"]
            )
            feeds = {n: a.numpy() for n, a in zip(task.input_names, args)}
            return lambda: [np.asarray(o) for o in session.run(None, feeds)]

        return bind

    return {
        "reference eager": lambda: torch_call(False),
        "reference compile": lambda: torch_call(True),
        "reference onnx": onnx_call,
    }


def time_call(call, repeats: int) -> dict:
    t0 = time.perf_counter()
    out = call()  # warm-up: compiles where a method compiles
    first = time.perf_counter() - t0
    walls, cpus, threads = [], [], []
    for _ in range(repeats):
        c0, h0, t0 = cpu_seconds(), time.thread_time(), time.perf_counter()
        out = call()
        walls.append(time.perf_counter() - t0)
        threads.append(time.thread_time() - h0)
        cpus.append(cpu_seconds() - c0)
    return dict(
        first_call_s=first,
        median_s=statistics.median(walls),
        cpu_s=statistics.median(cpus),
        thread_cpu_s=statistics.median(threads),
        output=out,
    )


def measure(task: Task, repeats: int, skip: list) -> list:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / task.name
        task.build(folder)
        args = task.inputs()
        methods = {
            **reference_methods(task, folder, Path(tmp)),
            **linnet_methods(task, folder, Path(tmp)),
        }
        for name, prepare in methods.items():
            if name in skip:
                continue
            try:
                row = dict(method=name, **time_call(prepare()(args), repeats))
            except Exception as e:  # a method that fails is recorded, not fatal
                row = dict(method=name, error=f"{type(e).__name__}: {e}"[:300])
                print(f"{task.name} {name:30s} failed: {row['error']}", flush=True)
            else:
                print(f"{task.name} {name:30s} {row['median_s'] * 1e3:9.1f} ms", flush=True)
            rows.append(row)
    return compare(task, rows)


def compare(task: Task, rows: list) -> list:
    """Deltas against the reference eager, ratios against the fastest reference."""
    import numpy as np

    timed = [r for r in rows if "median_s" in r]
    eager = next((r for r in timed if r["method"] == "reference eager"), None)
    refs = [r for r in timed if r["method"] in REFERENCES]
    best = min(refs, key=lambda r: r["median_s"]) if refs else None
    best_cpu = min(refs, key=lambda r: r["cpu_s"]) if refs else None
    want = eager["output"] if eager is not None else None
    for row in timed:
        out = row.pop("output")
        if want is not None:
            deltas = [np.abs(a - b).max() for a, b in zip(out, want)]
            row["max_abs_delta"] = {n: float(d) for n, d in zip(task.output_names, deltas)}
            row["max_abs_ref"] = {
                n: float(np.abs(b).max()) for n, b in zip(task.output_names, want)
            }
        if best is not None:
            row["vs_fastest_reference"] = best["median_s"] / row["median_s"]
            row["cpu_vs_fastest_reference"] = best_cpu["cpu_s"] / row["cpu_s"]
    for row in timed:
        print(
            f"{task.name} {row['method']:30s} {row['median_s'] * 1e3:9.1f} ms "
            f"cpu {row['cpu_s'] * 1e3:9.1f} ms  {row.get('vs_fastest_reference', 0):5.2f}x "
            f"(cpu {row.get('cpu_vs_fastest_reference', 0):5.2f}x)  "
            f"max |Δ| {max(row.get('max_abs_delta', {'': float('nan')}).values()):.1e}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vae,unet,sam")
    parser.add_argument("--scale", default="small", help="each model's scale (see the models)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (1: CPU time is the work)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip", action="append", default=[], help="a method to leave out")
    opts = parser.parse_args()
    import torch

    THREADS["n"] = opts.threads
    torch.set_num_threads(opts.threads)
    record = {"benchmark": "diffusion", "threads": opts.threads, "models": {}}
    record["machine_before"] = machine()
    for key in opts.models.split(","):
        task = TASKS[key](opts.scale)
        rows = measure(task, opts.repeats, opts.skip)
        record["models"][task.name] = {"shape": task.shape, "rows": rows}
        if opts.out:  # written after each model so a stopped run keeps what it measured
            write(opts.out, record)
    if opts.out:
        write(opts.out, record)


def write(path: Path, record: dict) -> None:
    packages = ["torch", "diffusers", "transformers", "onnxruntime", "onnx"]
    full = dict(record, machine=machine(), versions=versions(packages), **provenance())
    path.write_text(json.dumps(full, indent=2) + "\n")


if __name__ == "__main__":
    main()
