"""Decode on one process with two threads against two tensor-parallel processes with one
thread each (issue 19), on a random checkpoint shaped like TinyLlama's layers.

    python bench/parallel.py [--layers 2] [--tokens 32] [--out bench/results/checks/parallel.json]

TinyLlama-1.1B's shapes (dim 2048, 32 heads, 4 KV heads, ffn 5632, vocab 32000) with fewer
layers (`--layers`, default 2: the 22 of the real model need 4.4 GB of f32 per process).
Greedy decode of `--tokens` tokens after a 16-token prompt; per-token wall time, the median
of the steps. Each configuration runs in processes of its own (`tp 1`: one, 2 threads;
`tp 2`: two, 1 thread each, gloo); rank 0 reports. The record says the load average: on a
shared machine the figures measure the neighbours too.
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


def worker(ckpt: str, tokens: int, threads: int, world: int, placement: str = "none") -> None:
    """One process (a rank when world > 1): times each decode step, rank 0 prints JSON."""
    import torch

    import linnet.torch

    torch.set_num_threads(threads)
    tp = world if world > 1 else None
    options = placement_options(ckpt, placement)
    t0 = time.perf_counter()
    model = linnet.torch.load(ckpt, dtype="f32", mode="generated", max_positions=128,
                              tensor_parallel=tp, **options)  # fmt: skip
    load_s = time.perf_counter() - t0
    ids = torch.arange(1, 17).reshape(1, 16)
    model.reset()
    logits = model.decode(ids, 0)
    steps, at = [], 16
    for _ in range(tokens):
        nxt = logits.argmax(-1, keepdim=True)
        t = time.perf_counter()
        logits = model.decode(nxt, at)
        steps.append(time.perf_counter() - t)
        at += 1
    params = sum(t.numel() * t.element_size() for t in model.params.values())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    where = getattr(model, "placement", None)
    if getattr(model, "rank", 0) == 0:
        print(json.dumps({"load_s": load_s, "step_ms_median": 1e3 * statistics.median(steps),
                          "step_ms_all": [round(1e3 * s, 2) for s in steps],
                          "param_bytes_rank0": params, "peak_rss_mb_rank0": peak_mb,
                          "placement": placement, **options,
                          "described": where.describe() if where else None}))  # fmt: skip


def launch(ckpt: Path, tokens: int, world: int, placement: str = "none") -> dict:
    threads = 2 if world == 1 else 1
    cmd = [sys.executable, __file__, "--worker", str(ckpt), "--tokens", str(tokens),
           "--threads", str(threads), "--world", str(world), "--placement", placement]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if world > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
               "--master-port", "29517", *cmd[1:]]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    line = [x for x in done.stdout.splitlines() if x.startswith("{")][-1]
    return dict(json.loads(line), processes=world, threads_each=threads)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", default="bench/results/checks/parallel.json")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--placement", default="none", choices=["none", "pipeline", "offload"])
    ap.add_argument("--placed", action="store_true",
                    help="rows of one process (2 threads): whole, layers over cpu,cpu, "
                    "every layer streamed (bench/results/checks/placement.json)")  # fmt: skip
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.tokens, args.threads, args.world, args.placement)
    folder = Path(tempfile.gettempdir()) / f"linnet-tinyllama-shaped-{args.layers}l"
    ckpt = build(folder, args.layers)
    record = dict(provenance(), machine=machine(), shape=dict(SHAPE, layers=args.layers))
    record["load_before"] = os.getloadavg()
    if args.placed:
        record["rows"] = [launch(ckpt, args.tokens, 1, p) for p in ("none", "pipeline", "offload")]
    else:
        record["rows"] = [launch(ckpt, args.tokens, 1), launch(ckpt, args.tokens, 2)]
    record["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    for row in record["rows"]:
        mb = row["param_bytes_rank0"] / 1e6
        print(f"tp {row['processes']} x {row['threads_each']} thread(s), "
              f"placement {row.get('placement', 'none')}: "
              f"{row['step_ms_median']:.1f} ms/token, rank 0 params {mb:.0f} MB, "
              f"peak RSS {row['peak_rss_mb_rank0']:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
