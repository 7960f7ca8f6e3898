"""Forward and decode on one process with two threads against tensor-parallel processes with
one thread each (issue 19), on a random checkpoint shaped like TinyLlama's layers and on
SmolLM2-135M's real weights.

    python bench/parallel.py [--layers 2] [--tokens 32] [--smollm2 FOLDER] [--out ...json]
    python bench/parallel.py --smollm2 FOLDER --no-tinyllama --smollm2-tp 1,2 --out ...json
    python bench/parallel.py --one-thread [--smollm2 FOLDER] --out ...   # 1 process, 1 thread
    python bench/parallel.py --placed --layers 3 --tokens 16 --out ...   # layers / offload

TinyLlama-1.1B's shapes (dim 2048, 32 heads, 4 KV heads, ffn 5632, vocab 32000) with fewer
layers (`--layers`, default 2: the 22 of the real model need 4.4 GB of f32 per process); tp 1
and tp 2. SmolLM2 (9 heads, 3 KV heads): tp 1 and tp 2 (`--smollm2-tp`), two ranks holding 2
and 1 KV groups (6 and 3 query heads: rank 0 does twice rank 1's attention). Each
row: a 64-token forward (median of 3) and greedy decode of `--tokens` tokens after a 16-token
prompt (median step), wall time and the process's CPU time (every thread); every rank's
param bytes and peak RSS (`ru_maxrss`, after load and at the end). Each configuration runs in
processes of its own (gloo between ranks). The record says the load average before and after
each row: on a shared machine the figures measure the neighbours too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import machine, provenance  # noqa: E402

SHAPE = dict(
    hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4,
    vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
)  # fmt: skip


def build(folder: Path, layers: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, architectures=["LlamaForCausalLM"], **SHAPE)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def placement_options(ckpt: str, placement: str) -> dict:
    """linnet.torch.load's keywords for a placement row: `pipeline` splits the layers over
    `cpu,cpu`; `offload` gives the CPU a budget of the params outside the layers and two
    layers, so every layer streams from "host" memory (a copy per layer per step)."""
    import linnet.torch

    if placement == "pipeline":
        return dict(devices=["cpu", "cpu"])
    if placement != "offload":
        return {}
    params = linnet.torch.load(ckpt, dtype="f32", mode="interpret", max_positions=128).params
    layers: dict = {}
    for name, t in params.items():
        if name.startswith("layers."):
            layers[name.split(".")[1]] = layers.get(name.split(".")[1], 0) + t.nbytes
    fixed = sum(t.nbytes for n, t in params.items() if not n.startswith("layers."))
    return dict(max_device_bytes=fixed + sum(sorted(layers.values())[-2:]))


def _timed(fn) -> tuple[float, float]:
    """(wall s, this process's CPU s: every thread, OpenMP's and gloo's included)."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - cpu0


def _decode_steps(model, tokens: int) -> list[tuple[float, float]]:
    import torch

    ids = torch.arange(1, 17).reshape(1, 16)
    model.reset()
    box = [model.decode(ids, 0)]
    steps = []
    for at in range(16, 16 + tokens):
        nxt = box[0].argmax(-1, keepdim=True)
        steps.append(_timed(lambda n=nxt, a=at: box.__setitem__(0, model.decode(n, a))))
    return steps


def worker(ckpt: str, tokens: int, threads: int, world: int, placement: str = "none") -> None:
    """One process (a rank when world > 1): times a 64-token forward (3 runs) and each decode
    step; every rank prints one JSON line (its rank, its params, its peak RSS)."""
    import torch

    import linnet.torch

    torch.set_num_threads(threads)
    tp = world if world > 1 else None
    options = placement_options(ckpt, placement)
    t0 = time.perf_counter()
    model = linnet.torch.load(ckpt, dtype="f32", mode="generated", max_positions=128,
                              tensor_parallel=tp, **options)  # fmt: skip
    load_s = time.perf_counter() - t0
    rss_after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    prompt = torch.arange(1, 65).reshape(1, 64) % 100 + 1
    forwards = [_timed(lambda: model.forward(prompt)) for _ in range(3)]
    steps = _decode_steps(model, tokens)
    where = getattr(model, "placement", None)
    print(json.dumps({
        "rank": getattr(model, "rank", 0), "load_s": load_s,
        "forward64_ms_median": 1e3 * statistics.median(w for w, _ in forwards),
        "forward64_cpu_ms_median": 1e3 * statistics.median(c for _, c in forwards),
        "step_ms_median": 1e3 * statistics.median(w for w, _ in steps),
        "step_cpu_ms_median": 1e3 * statistics.median(c for _, c in steps),
        "step_ms_all": [round(1e3 * w, 2) for w, _ in steps],
        "param_bytes": sum(t.numel() * t.element_size() for t in model.params.values()),
        "peak_rss_mb_after_load": rss_after_load,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "placement": placement, **options,
        "described": where.describe() if where else None}))  # fmt: skip


def launch(
    ckpt: Path, tokens: int, world: int, placement: str = "none", threads: int | None = None
) -> dict:
    """Rank 0's figures, with every rank's params and peak RSS under `ranks`; `threads` per
    process (default: 2 for one process, 1 for each rank)."""
    threads = threads or (2 if world == 1 else 1)
    cmd = [sys.executable, __file__, "--worker", str(ckpt), "--tokens", str(tokens),
           "--threads", str(threads), "--world", str(world), "--placement", placement]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if world > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
               "--master-port", "29517", *cmd[1:]]  # fmt: skip
    load = os.getloadavg()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    lines.sort(key=lambda r: r["rank"])
    ranks = [{k: r[k] for k in ("rank", "param_bytes", "peak_rss_mb_after_load", "peak_rss_mb")}
             for r in lines]  # fmt: skip
    return dict(lines[0], processes=world, threads_each=threads, ranks=ranks,
                checkpoint=ckpt.name, load_before=load, load_after=os.getloadavg())  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", default="bench/results/checks/parallel.json")
    ap.add_argument(
        "--smollm2",
        default=None,
        help="also SmolLM2-135M's f32 folder, at the --smollm2-tp sizes",
    )
    ap.add_argument("--smollm2-tp", default="1,2",
                    help="SmolLM2's rows: 2 splits its 3 KV groups 2 + 1, 3 one each")  # fmt: skip
    ap.add_argument("--no-tinyllama", action="store_true", help="SmolLM2's rows only")
    ap.add_argument("--note", default=None, help="a line kept in the record (e.g. the load)")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument(
        "--one-thread",
        action="store_true",
        help="only one process with one thread per checkpoint (the baseline that two-thread "
        "rows lose to OpenMP barriers under load)",
    )
    ap.add_argument("--placement", default="none", choices=["none", "pipeline", "offload"])
    ap.add_argument("--placed", action="store_true",
                    help="rows of one process (2 threads): whole, layers over cpu,cpu, "
                    "every layer streamed (bench/results/checks/placement.json)")  # fmt: skip
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.tokens, args.threads, args.world, args.placement)
    folder = Path(tempfile.gettempdir()) / f"linnet-tinyllama-shaped-{args.layers}l"
    ckpt = folder if args.no_tinyllama else build(folder, args.layers)
    record = dict(provenance(), machine=machine(), shape=dict(SHAPE, layers=args.layers))
    record["load_before"] = os.getloadavg()
    if args.note:
        record["note"] = args.note
    if args.one_thread:
        cks = [ckpt] + ([Path(args.smollm2)] if args.smollm2 else [])
        record["rows"] = [launch(c, args.tokens, 1, threads=1) for c in cks]
    elif args.placed:
        record["rows"] = [launch(ckpt, args.tokens, 1, p) for p in ("none", "pipeline", "offload")]
    else:
        worlds = [] if args.no_tinyllama else [1, 2]
        record["rows"] = [launch(ckpt, args.tokens, w) for w in worlds]
        if args.smollm2:
            smol = Path(args.smollm2)
            tps = [int(w) for w in args.smollm2_tp.split(",")]
            record["rows"] += [launch(smol, args.tokens, w) for w in tps]
    record["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    for row in record["rows"]:
        memory = ", ".join(
            f"rank {r['rank']} params {r['param_bytes'] / 1e6:.0f} MB "
            f"peak RSS {r['peak_rss_mb']:.0f} MB"
            for r in row["ranks"]
        )
        print(f"{row['checkpoint']} tp {row['processes']} x {row['threads_each']} thread(s), "
              f"placement {row.get('placement', 'none')}: "
              f"forward(64) {row['forward64_ms_median']:.1f} ms, "
              f"decode {row['step_ms_median']:.1f} ms/token "
              f"(cpu {row['step_cpu_ms_median']:.1f} ms); {memory}")  # fmt: skip


if __name__ == "__main__":
    main()
