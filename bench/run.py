#!/usr/bin/env python
"""Linnet's PyTorch and JAX paths against transformers and llama.cpp, in one run.

    python bench/run.py                          # SmolLM2-135M-Instruct, f32 and bf16
    python bench/run.py --model tinyllama        # a random TinyLlama-1.1B-shaped checkpoint
    python bench/run.py --quick                  # fewer repeats, shorter decode
    python bench/run.py --dtypes q8_0,q4_k --methods linnet/generated/fast,llama.cpp
                                                 # packed weights: both read one GGUF file

For every method (each in its own process) and dtype: forward latency at B=1,
S=128 and S=512, and decode throughput (128-token prompt, 128 new greedy tokens,
prefill excluded; the median of --repeats generations, since one generation on this VM
varies by 20-30%). Compile time is reported apart from steady-state figures (JAX rows:
generated JAX under jit in both numerics, and StableHLO exports with their export time).
Results go to bench/results/latest.json (machine, versions, every figure, the
ratio to each baseline), rewritten after every row, and a table is printed; `--merge`
keeps the rows of an earlier run that this one does not measure (e.g. `--dtypes bf16`
after an f32 run; `runs` records each run's machine and bandwidth). No test asserts a time.
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
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))
from bench.common import machine, provenance, versions  # noqa: E402

METHODS = [
    "linnet/interpret/equivalent",
    "linnet/generated/equivalent",
    "linnet/generated/fast",
    "linnet/compile/equivalent",
    "linnet/compile/fast",
    "jax/jit/equivalent",
    "jax/jit/fast",
    "jax/stablehlo",
    "transformers/eager",
    "transformers/compile",
    "llama.cpp",
]
BASELINES = ["transformers/eager", "transformers/compile", "llama.cpp"]
PACKAGES = ("torch", "transformers", "llama_cpp", "linnet", "jax")
# Weight-only quantized dtypes: Linnet's PyTorch rows load the GGUF export llama.cpp reads
# (its q8_0 / q4_0 / q4_K tensors kept packed); transformers and JAX have no such rows.
PACKED = ("q8_0", "q4_0", "q4_k")
BYTES_PER_WEIGHT = {"f32": 4, "bf16": 2, "f16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}
BYTES_PER_WEIGHT["q4_k"] = 144 / 256  # nominal: rows not whole 256-blocks fall back


# -- workers: one method, one dtype, one process ------------------------------------------
def _timeit(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _prompt(vocab: int, n: int):
    import torch

    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(0))


def worker_linnet(ckpt: str, dtype: str, mode: str, numerics: str, args) -> dict:
    import torch

    import linnet.torch as lt

    t0 = time.perf_counter()
    if dtype in PACKED:  # the very file llama.cpp runs
        ckpt = str(Path(args.gguf_dir) / f"model-{dtype}.gguf")
    model = lt.load(ckpt, dtype=dtype, mode=mode, numerics=numerics, max_positions=1024)
    vocab = model.config["vocab"]
    out = {"load_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    model.generate(_prompt(vocab, args.prompt), 2)  # compiles prefill and decode
    model.forward(_prompt(vocab, 128))
    out["warmup_s"] = time.perf_counter() - t0
    with torch.inference_mode():
        for s in (128, 512):
            ids = _prompt(vocab, s)
            out[f"forward_{s}_ms"] = 1e3 * _timeit(lambda ids=ids: model.forward(ids), args.repeats)
    ids = _prompt(vocab, args.prompt)
    first = _timeit(lambda: model.generate(ids, 1), args.repeats)
    full = _timeit(lambda: model.generate(ids, args.new + 1), args.repeats)
    out["decode_tok_s"] = args.new / (full - first)
    out["prefill_ms"] = 1e3 * first
    return out


def worker_jax(ckpt: str, dtype: str, kind: str, numerics: str, args) -> dict:
    """Generated JAX under jit, or StableHLO exports (`jax.export`) run with XLA. Compile
    time (and, for StableHLO, export time) is reported apart from the timed runs."""
    import shutil
    import tempfile

    import jax
    import numpy as np

    import linnet.jax as lj

    def prompt(vocab, n):
        return np.random.default_rng(0).integers(0, vocab, (1, n))

    out = {}
    exports = None
    if kind == "stablehlo":
        from linnet import stablehlo
        from linnet.weights.planning import plan_checkpoint

        _, source, config, _ = plan_checkpoint(ckpt, dtype=dtype, max_positions=1024)
        exports = tempfile.mkdtemp(prefix="linnet-bench-hlo-")
        t0 = time.perf_counter()
        for entry in ("forward", "decode"):
            exported = stablehlo.export_entry(source, config, entry, numerics)
            stablehlo.save(exported, f"{exports}/{entry}.mlir", source, config, numerics)
        out["export_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = lj.load(
        ckpt, dtype=dtype, numerics=numerics, max_positions=1024, from_stablehlo=exports
    )
    vocab = model.config["vocab"]
    out["load_s"] = time.perf_counter() - t0

    def forward(ids):
        jax.block_until_ready(model.forward(ids))

    def generate(ids, n):
        jax.block_until_ready(model.generate(ids, n))

    t0 = time.perf_counter()  # XLA compiles each shape once: prefill, step, forwards
    generate(prompt(vocab, args.prompt), 2)
    for s in (128, 512):
        forward(prompt(vocab, s))
    out["warmup_s"] = out["compile_s"] = time.perf_counter() - t0
    for s in (128, 512):
        ids = prompt(vocab, s)
        out[f"forward_{s}_ms"] = 1e3 * _timeit(lambda ids=ids: forward(ids), args.repeats)
    ids = prompt(vocab, args.prompt)
    first = _timeit(lambda: generate(ids, 1), args.repeats)
    full = _timeit(lambda: generate(ids, args.new + 1), args.repeats)
    out["decode_tok_s"] = args.new / (full - first)
    out["prefill_ms"] = 1e3 * first
    out["compilations"] = model.compilations
    if exports is not None:
        shutil.rmtree(exports, ignore_errors=True)
    return out


def worker_transformers(ckpt: str, dtype: str, compiled: bool, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch_dtype, trust_remote_code=False
    ).eval()
    out = {"load_s": time.perf_counter() - t0}
    kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    if compiled:  # the documented fast path: static cache + torch.compile
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward, dynamic=True)
    vocab = model.config.vocab_size
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(_prompt(vocab, args.prompt), max_new_tokens=2, **kwargs)
        model(_prompt(vocab, 128))
    out["warmup_s"] = time.perf_counter() - t0

    def generate(ids, n):
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)

    with torch.inference_mode():
        for s in (128, 512):
            ids = _prompt(vocab, s)
            out[f"forward_{s}_ms"] = 1e3 * _timeit(lambda ids=ids: model(ids), args.repeats)
        ids = _prompt(vocab, args.prompt)
        first = _timeit(lambda: generate(ids, 1), args.repeats)
        full = _timeit(lambda: generate(ids, args.new + 1), args.repeats)
    out["decode_tok_s"] = args.new / (full - first)
    out["prefill_ms"] = 1e3 * first
    return out


def worker_llamacpp(ckpt: str, dtype: str, args) -> dict:
    import llama_cpp

    gguf = Path(args.gguf_dir) / f"model-{dtype}.gguf"
    if not gguf.exists():
        return {"skipped": f"no GGUF export at {gguf} (linnet export gguf failed or missing)"}
    llm = llama_cpp.Llama(
        str(gguf), n_ctx=1024, n_threads=args.threads or os.cpu_count(), n_batch=512, verbose=False
    )
    vocab = llm.n_vocab()
    out = {}
    for s in (128, 512):
        tokens = _prompt(vocab, s)[0].tolist()

        def run(tokens=tokens):
            llm.reset()
            llm.eval(tokens)

        out[f"forward_{s}_ms"] = 1e3 * _timeit(run, args.repeats)
    prompt = _prompt(vocab, args.prompt)[0].tolist()

    def generate(n):
        llm.reset()
        llm.eval(prompt)
        for _ in range(n):
            token = llm.sample(top_k=1, temp=0.0)
            llm.eval([token])

    first = _timeit(lambda: generate(0), args.repeats)
    full = _timeit(lambda: generate(args.new), args.repeats)
    out["decode_tok_s"] = args.new / (full - first)
    out["prefill_ms"] = 1e3 * first
    return out


def run_worker(args) -> None:
    method = args.worker
    if args.threads:  # every method at the same count (llama.cpp: n_threads)
        import torch

        torch.set_num_threads(args.threads)
    if method.startswith("linnet/"):
        _, mode, numerics = method.split("/")
        result = worker_linnet(args.checkpoint, args.dtype, mode, numerics, args)
    elif method.startswith("jax/"):
        kind, numerics = (method.split("/") + ["equivalent"])[1:3]
        result = worker_jax(args.checkpoint, args.dtype, kind, numerics, args)
    elif method.startswith("transformers/"):
        result = worker_transformers(args.checkpoint, args.dtype, method.endswith("compile"), args)
    else:
        result = worker_llamacpp(args.checkpoint, args.dtype, args)
    if "decode_tok_s" in result:  # the median of this many timed generations
        result["decode_repeats"] = args.repeats
    print("RESULT " + json.dumps(result))


# -- the driver -----------------------------------------------------------------------------
def bandwidth_gb_s() -> float:
    """Streaming read bandwidth: the decode roofline's denominator."""
    import torch

    x = torch.ones(512 * 1024 * 1024 // 4)  # 512 MiB
    x.sum()
    seconds = _timeit(lambda: x.sum(), 5)
    return x.numel() * 4 / seconds / 1e9


def model_bytes(ckpt: str, dtype: str) -> int:
    from linnet.weights.planning import plan_checkpoint

    _, source, config, _ = plan_checkpoint(ckpt, dtype="f32" if dtype in PACKED else dtype)
    per = BYTES_PER_WEIGHT[dtype]
    total = 0
    for t in source.params(config).shapes.values():
        n = 1
        for d in t.shape:
            n *= d.value
        total += n * per
    return int(total)


def checkpoint_for(name: str) -> str:
    if name == "smollm2":
        out = subprocess.run(
            [sys.executable, str(ROOT / "scripts/make_smollm2_checkpoint.py")],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    if name == "tinyllama":
        return build_tinyllama()
    return name


def build_tinyllama() -> str:
    """A random checkpoint of TinyLlama-1.1B's shape (bf16), cached."""
    path = Path(os.environ.get("LINNET_CACHE", Path.home() / ".cache/linnet")) / "tinyllama-shape"
    if (path / "config.json").exists():
        return str(path)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    return str(path)


def export_ggufs(ckpt: str, dtypes: list[str], out_dir: Path) -> None:
    for dtype in dtypes:
        target = out_dir / f"model-{dtype}.gguf"
        if target.exists():
            continue
        # this interpreter's CLI: the venv's bin/ need not be on PATH
        cmd = [sys.executable, "-m", "linnet.cli", "export", "gguf", ckpt, "--out", str(target)]
        proc = subprocess.run(cmd + ["--dtype", dtype], capture_output=True, text=True)
        if proc.returncode:
            print(f"  (no llama.cpp baseline in {dtype}: {proc.stderr.strip()[-200:]})")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tinyllama or a folder")
    parser.add_argument("--dtypes", default="f32,bf16")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    parser.add_argument(
        "--merge", action="store_true", help="keep the rows of --out that this run does not measure"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--gguf-dir", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--threads", type=int, help="threads of every method (default: own)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.new = 1, 32
    return args


def start_report(args, ckpt: str, dtypes: list[str], methods: list[str], gbs: float) -> dict:
    """The report this run fills in; with --merge, the rows of an earlier run are kept."""
    report = {
        **provenance(),  # date and command: the site shows them beside the rows
        "machine": machine(),
        "versions": versions(PACKAGES),
        "model": args.model,
        "checkpoint": ckpt,
        "bandwidth_gb_s": gbs,
        "prompt": args.prompt,
        "new_tokens": args.new,
        "threads": args.threads,
        "results": {},
    }
    if args.merge and args.out.exists():  # keep the other rows of an earlier run
        earlier = json.loads(args.out.read_text())
        report["results"] = earlier.get("results", {})
        report["model_bytes"] = earlier.get("model_bytes", {})
        report["runs"] = earlier.get("runs", [])
    run = {
        "dtypes": dtypes,
        "methods": methods,
        "machine": report["machine"],
        "bandwidth_gb_s": gbs,
    }
    report.setdefault("runs", []).append(run)
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0

    ckpt = checkpoint_for(args.model)
    dtypes = args.dtypes.split(",")
    gguf_dir = RESULTS / "gguf" / Path(ckpt).name
    gguf_dir.mkdir(parents=True, exist_ok=True)
    methods = args.methods.split(",")
    if "llama.cpp" in methods:
        export_ggufs(ckpt, dtypes, gguf_dir)
    gbs = bandwidth_gb_s()
    report = start_report(args, ckpt, dtypes, methods, gbs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for dtype in dtypes:
        rows = report["results"].setdefault(dtype, {})
        report.setdefault("model_bytes", {})[dtype] = model_bytes(ckpt, dtype)
        roofline = gbs * 1e9 / report["model_bytes"][dtype]
        for method in methods:
            print(f"{args.model} {dtype} {method} ...", flush=True)
            if dtype in PACKED and not method.startswith(("linnet/", "llama.cpp")):
                rows[method] = {"skipped": f"{method} runs no packed {dtype} weights"}
                continue
            rows[method] = measure(method, ckpt, dtype, gguf_dir, args)
            if "decode_tok_s" in rows[method]:
                rows[method]["roofline_fraction"] = rows[method]["decode_tok_s"] / roofline
            add_ratios(rows)
            # written after every row: a long run stopped part way keeps what it measured
            args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    print(f"\nwrote {args.out}")
    return 0


def measure(method: str, ckpt: str, dtype: str, gguf_dir: Path, args) -> dict:
    """Run one method in its own process (a fresh interpreter: no state shared between rows)."""
    options = {
        "--worker": method,
        "--checkpoint": ckpt,
        "--dtype": dtype,
        "--gguf-dir": str(gguf_dir),
        "--repeats": str(args.repeats),
        "--prompt": str(args.prompt),
        "--new": str(args.new),
    }
    if args.threads:
        options["--threads"] = str(args.threads)
    cmd = [sys.executable, __file__] + [part for pair in options.items() for part in pair]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (proc.stderr or proc.stdout).strip()[-400:]}


def add_ratios(rows: dict) -> None:
    """Speed-ups against each baseline: >1 means faster than the baseline."""
    for row in rows.values():
        for base in BASELINES:
            ref = rows.get(base, {})
            ratios = {}
            if "decode_tok_s" in row and "decode_tok_s" in ref:
                ratios["decode"] = row["decode_tok_s"] / ref["decode_tok_s"]
            for s in (128, 512):
                key = f"forward_{s}_ms"
                if key in row and key in ref:
                    ratios[f"forward_{s}"] = ref[key] / row[key]
            if ratios and row is not ref:
                row.setdefault("vs", {})[base] = ratios


def print_table(report: dict) -> None:
    for dtype, rows in report["results"].items():
        print(
            f"\n{report['model']} {dtype}  (bandwidth {report['bandwidth_gb_s']:.1f} GB/s, "
            f"weights {report['model_bytes'][dtype] / 1e6:.0f} MB)"
        )
        print(
            f"{'method':<30} {'fwd128 ms':>10} {'fwd512 ms':>10} {'decode tok/s':>13} "
            f"{'roofline':>9} {'vs hf eager':>12} {'vs llama.cpp':>13} {'warmup s':>9}"
        )
        for method, row in rows.items():
            if "error" in row or "skipped" in row:
                why = row.get("skipped") or row["error"].splitlines()[-1]
                print(f"{method:<30} {why[:90]}")
                continue
            vs = row.get("vs", {})
            hf = vs.get("transformers/eager", {}).get("decode")
            cpp = vs.get("llama.cpp", {}).get("decode")
            print(
                f"{method:<30} {row['forward_128_ms']:>10.1f} {row['forward_512_ms']:>10.1f} "
                f"{row['decode_tok_s']:>13.1f} {row.get('roofline_fraction', 0):>8.0%} "
                f"{f'{hf:.2f}x' if hf else '-':>12} {f'{cpp:.2f}x' if cpp else '-':>13} "
                f"{row.get('warmup_s', 0):>9.1f}"
            )


if __name__ == "__main__":
    sys.exit(main())
