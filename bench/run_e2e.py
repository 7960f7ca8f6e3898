#!/usr/bin/env python
"""`linnet run` end to end against transformers' `generate`, each from a fresh process
(issue 21): the wall time from starting the process to its exit, a chat answer of up to
64 greedy tokens, the same prompt, stopping at EOS alike (both print the same text; the
record keeps it).

    python bench/run_e2e.py [--rounds 3] [--threads 2] [--out bench/results/checks/run_e2e.json]

The checkpoint is bench/run.py's SmolLM2-135M-Instruct folder (f32). The two commands
alternate, round by round, so a drift in the machine's speed falls on both. Linnet's
stderr line gives its own split (load, first token, decode rate). No test asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "Write a short story about a lighthouse keeper and a storm."
NEW = 64
# transformers as a user would call it: tokenizer, model, chat template, greedy generate
REFERENCE = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, prompt, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=False)
ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                              return_tensors="pt", return_dict=True)["input_ids"]
out = model.generate(ids, max_new_tokens=new, do_sample=False)
print(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
"""


def _timed(cmd: list[str], env: dict) -> tuple[float, str, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"run_e2e: {cmd[:3]} failed: {done.stderr.strip()[-400:]}")
    return wall, done.stdout.strip(), done.stderr.strip().splitlines()[-1]


def main(argv=None) -> int:
    from bench.common import machine, provenance
    from bench.run import RESULTS, checkpoint_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="OMP threads of both")
    parser.add_argument("--out", type=Path, default=RESULTS / "checks" / "run_e2e.json")
    args = parser.parse_args(argv)
    folder = str(checkpoint_for("smollm2"))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    linnet = [sys.executable, "-m", "linnet", "run", folder, "--prompt", PROMPT]
    linnet += ["--max-new-tokens", str(NEW)]
    reference = [sys.executable, "-c", REFERENCE, folder, PROMPT, str(NEW)]
    rows = {"linnet run": {"wall_s": []}, "transformers generate": {"wall_s": []}}
    report = {**provenance(), "machine": machine(), "checkpoint": folder, "prompt": PROMPT}
    for r in range(args.rounds):
        for name, cmd in (("linnet run", linnet), ("transformers generate", reference)):
            wall, text, last = _timed(cmd, env)
            rows[name]["wall_s"].append(wall)
            rows[name]["text"] = text
            if name == "linnet run":
                rows[name].setdefault("split", []).append(last)
        print(f"round {r + 1}:", {n: round(v["wall_s"][-1], 2) for n, v in rows.items()})
    for row in rows.values():
        row["median_s"] = statistics.median(row["wall_s"])
    ratio = rows["transformers generate"]["median_s"] / rows["linnet run"]["median_s"]
    same = rows["linnet run"]["text"] == rows["transformers generate"]["text"]
    print(f"linnet run {ratio:.2f}x faster end to end; same text: {same}")
    report.update(new_tokens=NEW, threads=args.threads, rounds=args.rounds, results=rows)
    report.update(speedup=ratio, same_text=same, machine_after=machine())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
