"""Where the time of bench/diffusion.py's models goes: onnxruntime's per-op-type time for
Linnet's export and the reference's torch.onnx export, and torch.profiler's self CPU time per
op for Linnet's generated code and the reference eager, side by side, one thread each.

    python bench/diffusion_profile.py --model sam [--scale small] [--top 15] [--skip-torch]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.diffusion_models import TASKS, Task  # noqa: E402


def ort_op_times(path: Path, feeds: dict, runs: int = 2) -> collections.Counter:
    """Total microseconds per op type over `runs` calls after one warm-up."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in names}
    session.run(None, feeds)
    options.enable_profiling = True
    options.profile_file_prefix = str(path.with_suffix(""))  # beside the model, in a temp folder
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    totals = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            totals[e["args"]["op_name"]] += e["dur"] / runs
    return totals


def show(title: str, totals: collections.Counter, top: int) -> None:
    print(f"-- {title}: {sum(totals.values()) / 1e3:.1f} ms")
    for op, us in totals.most_common(top):
        print(f"   {op:32s} {us / 1e3:9.2f} ms")


def profile_onnx(task: Task, folder: Path, work: Path, args: tuple, top: int) -> None:
    import torch

    import linnet.onnx

    out = linnet.onnx.export(folder, work / "linnet-onnx", progress=False)
    arrays = [a.numpy() for a in args]
    # Linnet's entries in the order the task calls them, each fed what it takes
    model = linnet.onnx.load(out, threads=1)
    calls = []
    task.linnet(lambda entry, *xs: calls.append(entry) or model.run(entry, *xs), arrays)
    totals = collections.Counter()
    for entry in dict.fromkeys(calls):
        path = out / f"{entry}.onnx"
        totals.update(ort_op_times(path, _feeds_from_run(task, model, arrays, entry, path)))
    show("linnet onnx", totals, top)
    ref = work / "reference.onnx"
    with torch.no_grad():
        torch.onnx.export(
            task.reference(folder), args, str(ref), dynamo=False, opset_version=17,
            input_names=task.input_names, output_names=task.output_names,
        )  # fmt: skip
    show("reference onnx", ort_op_times(ref, dict(zip(task.input_names, arrays))), top)


def _inputs(path: Path):
    import onnx

    return onnx.load(str(path), load_external_data=False).graph.input


def _feeds_from_run(task, model, arrays, entry, path) -> dict:
    seen = {}

    def run(name, *xs):
        if name == entry:
            seen.update({i.name: x for i, x in zip(_inputs(path), xs)})
        return model.run(name, *xs)

    task.linnet(run, arrays)
    return seen


def profile_torch(task: Task, folder: Path, args: tuple, top: int) -> None:
    import torch
    from torch.profiler import profile

    import linnet.torch as lt

    model = lt.load(folder, mode="generated", numerics="fast")
    reference = task.reference(folder)
    for title, call in (
        ("linnet generated, fast", lambda: task.linnet(model.run, args)),
        ("reference eager", lambda: reference(*args)),
    ):
        with torch.no_grad():
            call()
            with profile() as prof:
                call()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
        print(f"-- {title}\n{table}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(TASKS), required=True)
    parser.add_argument("--scale", default="small")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--skip-onnx", action="store_true")
    opts = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    task = TASKS[opts.model](opts.scale)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / task.name
        task.build(folder)
        args = task.inputs()
        if not opts.skip_onnx:
            profile_onnx(task, folder, Path(tmp), args, opts.top)
        if not opts.skip_torch:
            profile_torch(task, folder, args, opts.top)


if __name__ == "__main__":
    main()
