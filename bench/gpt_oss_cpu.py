#!/usr/bin/env python
"""GPT-OSS decode as CPU time of one thread per token (issue 16): a figure a loaded machine
distorts less than wall-clock tok/s (descheduled time is not counted).

    python bench/gpt_oss.py ...        # builds the checkpoint and the GGUF first
    python bench/gpt_oss_cpu.py --out bench/results/checks/gpt_oss_cpu.json

One process, one thread (torch.set_num_threads(1), llama.cpp n_threads=1: ggml computes on
the calling thread): a 128-token prompt, then 32 single-token steps timed with
`time.thread_time`, the median step of 3 rounds, for Linnet on the HF folder and on
llama.cpp's GGUF (MXFP4 experts packed), each with numerics "equivalent" and "fast" (the
fused norm, rope and attention-with-sinks C++ ops), llama.cpp on that GGUF and transformers
eager (generate(33) minus generate(1), over 32). No test asserts a time.
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

STEPS, ROUNDS, PROMPT = 32, 3, 128


def _prompt(vocab: int):
    import torch

    return torch.randint(0, vocab, (1, PROMPT), generator=torch.Generator().manual_seed(0))


def linnet_ms(path: str, numerics: str = "equivalent") -> float:
    import linnet.torch as lt

    model = lt.load(path, dtype="f32", mode="generated", max_positions=1024, numerics=numerics)
    ids = _prompt(model.config["vocab"])
    import torch

    def round_ms():
        model.reset()
        logits = model._decode(ids, 0)
        times = []
        for _ in range(STEPS):
            token = logits.argmax(-1)[:, None]
            t0 = time.thread_time()
            logits = model._decode(token, model.position)
            times.append(time.thread_time() - t0)
        return 1e3 * statistics.median(times)

    with torch.inference_mode():
        round_ms()
        return statistics.median(round_ms() for _ in range(ROUNDS))


def llama_ms(gguf: str) -> float:
    import llama_cpp

    llm = llama_cpp.Llama(gguf, n_ctx=1024, n_threads=1, n_batch=512, verbose=False)
    prompt = _prompt(llm.n_vocab())[0].tolist()

    def round_ms():
        llm.reset()
        llm.eval(prompt)
        times = []
        for _ in range(STEPS):
            token = llm.sample(top_k=1, temp=0.0)
            t0 = time.thread_time()
            llm.eval([token])
            times.append(time.thread_time() - t0)
        return 1e3 * statistics.median(times)

    round_ms()
    return statistics.median(round_ms() for _ in range(ROUNDS))


def transformers_ms(folder: str) -> float:
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

    with torch.inference_mode():
        cpu(2)
        first = statistics.median(cpu(1) for _ in range(ROUNDS))
        full = statistics.median(cpu(STEPS + 1) for _ in range(ROUNDS))
    return 1e3 * (full - first) / STEPS


def main(argv=None) -> int:
    import torch

    from bench import run
    from bench.common import machine, provenance
    from bench.gpt_oss import build_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    folder = build_checkpoint()
    gguf = run.RESULTS / "gguf" / folder.name / "model-f32.gguf"
    run.export_ggufs(str(folder), ["f32"], gguf.parent)  # Linnet's export, as bench/run.py's
    if not gguf.exists():
        raise SystemExit(f"gpt_oss_cpu: no GGUF at {gguf}")
    rows = {}
    fast = functools.partial(linnet_ms, numerics="fast")
    for name, fn, path in [
        ("linnet/generated/equivalent", linnet_ms, folder),
        ("linnet/generated/equivalent/gguf", linnet_ms, gguf),
        ("linnet/generated/fast", fast, folder),
        ("linnet/generated/fast/gguf", fast, gguf),
        ("llama.cpp", llama_ms, gguf),
        ("transformers/eager", transformers_ms, folder),
    ]:
        load = list(os.getloadavg())
        rows[name] = {"cpu_ms_per_token": fn(str(path)), "load_average_at_start": load}
        print(name, rows[name], flush=True)
    for row in rows.values():
        row["vs"] = {
            base: rows[base]["cpu_ms_per_token"] / row["cpu_ms_per_token"]
            for base in ("llama.cpp", "transformers/eager")
            if row is not rows[base]
        }
    report = {**provenance(), "machine": machine(), "checkpoint": str(folder), "gguf": str(gguf)}
    report.update(prompt=PROMPT, steps=STEPS, rounds=ROUNDS, threads=1, results=rows)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
