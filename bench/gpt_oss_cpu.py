#!/usr/bin/env python
"""GPT-OSS decode as CPU time of one thread per token (issue 16): a figure a loaded machine
distorts less than wall-clock tok/s (descheduled time is not counted).

    python bench/gpt_oss.py ...        # builds the checkpoint and the GGUF first
    python bench/gpt_oss_cpu.py --out bench/results/checks/gpt_oss_cpu.json

One process, one thread (torch.set_num_threads(1), llama.cpp n_threads=1: ggml computes on
the calling thread): a 128-token prompt, then 32 single-token steps timed with
`time.thread_time`, for Linnet on the HF folder and on llama.cpp's GGUF (MXFP4 experts
packed), each with numerics "equivalent" and "fast" (the fused norm, rope and
attention-with-sinks C++ ops, the MoE in one call with x rounded to int8 in the experts),
llama.cpp on that GGUF and transformers eager (generate(33) minus generate(1), over 32).
Every method is loaded first; then the rounds interleave (each round runs every method
once, in turn), so a drift in the machine's speed (another VM on the host: the AVX2 EPYC's
rows moved 1.5x between back-to-back runs) falls on all methods alike. A method's figure is
the median of its rounds' median steps; the record keeps every round. No test asserts a
time.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS, ROUNDS, PROMPT = 32, 5, 128


def _prompt(vocab: int):
    import torch

    return torch.randint(0, vocab, (1, PROMPT), generator=torch.Generator().manual_seed(0))


def _median_step(pick, step) -> float:
    """ms of thread time: the median of STEPS calls of step(pick()), the token's pick (argmax,
    llama.cpp's sampler) untimed."""
    times = []
    for _ in range(STEPS):
        token = pick()
        t0 = time.thread_time()
        step(token)
        times.append(time.thread_time() - t0)
    return 1e3 * statistics.median(times)


def linnet_round(path: str, numerics: str = "equivalent"):
    """Loads Linnet; returns a round: prompt, then the median decode step in ms."""
    import torch

    import linnet.torch as lt

    model = lt.load(path, dtype="f32", mode="generated", max_positions=1024, numerics=numerics)
    ids = _prompt(model.config["vocab"])

    @torch.inference_mode()
    def one_round():
        model.reset()
        last = [model._decode(ids, 0)]

        def step(token):
            last[0] = model._decode(token, model.position)

        return _median_step(lambda: last[0].argmax(-1)[:, None], step)

    return one_round


def llama_round(gguf: str):
    import llama_cpp

    llm = llama_cpp.Llama(gguf, n_ctx=1024, n_threads=1, n_batch=512, verbose=False)
    prompt = _prompt(llm.n_vocab())[0].tolist()

    def one_round():
        llm.reset()
        llm.eval(prompt)
        return _median_step(lambda: llm.sample(top_k=1, temp=0.0), lambda t: llm.eval([t]))

    return one_round


def transformers_round(folder: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, trust_remote_code=False
    ).eval()
    ids = _prompt(model.config.vocab_size)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def cpu(n):
        t0 = time.thread_time()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        return time.thread_time() - t0

    @torch.inference_mode()
    def one_round():
        return 1e3 * (cpu(STEPS + 1) - cpu(1)) / STEPS

    return one_round


def main(argv=None) -> int:
    import torch

    from bench import run
    from bench.common import machine, provenance
    from bench.gpt_oss import build_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    folder = build_checkpoint()
    gguf = run.RESULTS / "gguf" / folder.name / "model-f32.gguf"
    run.export_ggufs(str(folder), ["f32"], gguf.parent)  # Linnet's export, as bench/run.py's
    if not gguf.exists():
        raise SystemExit(f"gpt_oss_cpu: no GGUF at {gguf}")
    fast = functools.partial(linnet_round, numerics="fast")
    methods = {
        name: load(str(path))
        for name, load, path in [
            ("linnet/generated/equivalent", linnet_round, folder),
            ("linnet/generated/equivalent/gguf", linnet_round, gguf),
            ("linnet/generated/fast", fast, folder),
            ("linnet/generated/fast/gguf", fast, gguf),
            ("llama.cpp", llama_round, gguf),
            ("transformers/eager", transformers_round, folder),
        ]
    }
    rows = {name: {"rounds_ms": [], "load_average": []} for name in methods}
    for one_round in methods.values():
        one_round()  # warm-up: first-call costs out of the figures
    for r in range(args.rounds):
        for name, one_round in methods.items():
            rows[name]["load_average"].append(os.getloadavg()[0])
            rows[name]["rounds_ms"].append(one_round())
        print(f"round {r + 1}:", {n: round(v["rounds_ms"][-1], 2) for n, v in rows.items()})
    for row in rows.values():
        row["cpu_ms_per_token"] = statistics.median(row["rounds_ms"])
    for row in rows.values():
        row["vs"] = {
            base: rows[base]["cpu_ms_per_token"] / row["cpu_ms_per_token"]
            for base in ("llama.cpp", "transformers/eager")
            if row is not rows[base]
        }
    for name, row in rows.items():
        print(f"{name:34s} {row['cpu_ms_per_token']:7.2f} ms/token", row["vs"], flush=True)
    report = {**provenance(), "machine": machine(), "checkpoint": str(folder), "gguf": str(gguf)}
    report.update(prompt=PROMPT, steps=STEPS, rounds=args.rounds, interleaved=True, threads=1)
    report["results"] = rows
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
