"""The checks a session runs when it is lent a GPU (docs/testing.md, "On a GPU").

    python scripts/gpu_check.py --out DIR            # on a CUDA machine
    python scripts/gpu_check.py --out DIR --device cpu --quick   # a dry run of the script

Each check runs on its own, and one that fails is recorded with its error while the rest
go on, so one short device lease yields every figure it can. Results go to
DIR/gpu_check.json (and stdout as they come):

- tiny_parity: every tiny decoder (tests/tiny_decoders.py) on the device, in f32, in the
  modes interpret, generated (equivalent and fast numerics) and cudagraphs, against
  transformers on the same device and weights: max |logit delta| and greedy tokens.
- compile: mode="compile" on the device (Inductor's Triton kernels): parity and compile time.
- bf16: a SmolLM2-like tiny model in bf16 on the device against transformers in bf16.
- gpt_oss: the tiny MoE (gather path for a decode step on a GPU; cudagraphs too) against
  transformers.
- offload: layers beyond a device budget streamed from host memory, against transformers.
- jax: the generated JAX code on the device's XLA backend against transformers.
- decode_speed: SmolLM2-135M's shape with random weights, bf16, batch 1: Linnet's generated
  and cudagraphs decode against transformers' generate, tokens/s in the same process.

The pytest-marked `gpu` tests are run by the command in docs/testing.md, beside this.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from tests.tiny_decoders import load_reference  # noqa: E402

F32_TOL = 1e-4  # f32 logits against transformers on the same device (the CPU suite's bound)
NEW_TOKENS = 8
SMOLLM2_SHAPE = dict(  # SmolLM2-135M-Instruct's config.json, weights drawn at random
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=True, max_position_embeddings=8192,
)  # fmt: skip


def log(*parts) -> None:
    print(*parts, flush=True)


def env_report(device: str) -> dict:
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name, gpu_mib=props.total_memory // 2**20, cuda=torch.version.cuda,
            sm=f"{props.major}.{props.minor}", count=torch.cuda.device_count(),
        )  # fmt: skip
    return info


@torch.no_grad()
def reference_run(model, ids: torch.Tensor, new_tokens: int):
    logits = model(input_ids=ids).logits.float()
    greedy = model.generate(
        ids, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        pad_token_id=0,
    )  # fmt: skip
    return logits, greedy


def compare(model, ids, ref_logits, ref_greedy, tol: float) -> dict:
    """Linnet's logits and greedy tokens against the reference's, on one device."""
    got = model.forward(ids).float()
    delta = float((got - ref_logits).abs().max())
    tokens = model.generate(ids, ref_greedy.shape[1] - ids.shape[1])
    same = tokens.tolist() == ref_greedy.tolist()
    return {"max_abs": delta, "tokens_equal": same, "ok": same and delta <= tol}


def check_tiny_parity(device: str, root: Path, quick: bool) -> dict:
    import linnet.torch as lt
    from tests.tiny_decoders import TINY_CONFIGS, build_tiny, probe_ids

    modes = [("generated", "equivalent"), ("generated", "fast")]
    if device == "cuda":
        modes.append(("cudagraphs", "equivalent"))
    rows = {}
    for arch, variant in list(TINY_CONFIGS)[: 2 if quick else None]:
        folder = build_tiny(arch, variant, root)
        ref = load_reference(folder, device)
        ids = probe_ids(ref.config.vocab_size).to(device)
        ref_logits, ref_greedy = reference_run(ref, ids, NEW_TOKENS)
        one = ids[:1]  # cudagraphs decodes batch 1 with a captured step
        ref_one = reference_run(ref, one, NEW_TOKENS)
        for mode, numerics in ([("interpret", "equivalent")] if variant == "base" else []) + modes:
            key = f"{arch}/{variant}/{mode}/{numerics}"
            model = lt.load(folder, dtype="f32", device=device, mode=mode, numerics=numerics)
            rows[key] = compare(model, ids, ref_logits, ref_greedy, F32_TOL)
            rows[key]["batch1"] = compare(model, one, *ref_one, F32_TOL)
            rows[key]["ok"] = rows[key]["ok"] and rows[key]["batch1"]["ok"]
            log(key, rows[key])
        del ref
    return {"rows": rows, "ok": all(r["ok"] for r in rows.values())}


def check_compile(device: str, root: Path, quick: bool) -> dict:
    import linnet.torch as lt
    from tests.tiny_decoders import build_tiny, probe_ids

    folder = build_tiny("llama", "base", root)
    ref = load_reference(folder, device)
    ids = probe_ids(ref.config.vocab_size).to(device)
    expected = reference_run(ref, ids, NEW_TOKENS)
    t0 = time.perf_counter()
    model = lt.load(folder, dtype="f32", device=device, mode="compile")
    row = compare(model, ids, *expected, F32_TOL)
    row["load_compile_and_run_s"] = round(time.perf_counter() - t0, 1)
    return row


def check_bf16(device: str, root: Path, quick: bool) -> dict:
    """bf16 rounds differently from transformers' bf16 (fused ops, reduction order): the
    check is the first greedy token of every probe row and a logit delta, recorded."""
    import linnet.torch as lt
    from tests.tiny_decoders import build_tiny, probe_ids

    folder = build_tiny("llama", "tied", root)
    ref = load_reference(folder, device, torch.bfloat16)
    ids = probe_ids(ref.config.vocab_size).to(device)
    with torch.no_grad():
        ref_logits = ref(input_ids=ids).logits.float()
    rows = {}
    for mode in ["generated"] + (["cudagraphs"] if device == "cuda" else []):
        model = lt.load(folder, dtype="bf16", device=device, mode=mode)
        got = model.forward(ids).float()
        first = bool(torch.equal(got[:, -1].argmax(-1), ref_logits[:, -1].argmax(-1)))
        spread = float(ref_logits.abs().max())
        rows[mode] = {
            "max_abs": float((got - ref_logits).abs().max()),
            "max_abs_logit": spread,
            "first_token_equal": first,
            "ok": first,
        }
        log("bf16", mode, rows[mode])
    return {"rows": rows, "ok": all(r["ok"] for r in rows.values())}


def check_gpt_oss(device: str, root: Path, quick: bool) -> dict:
    import linnet.torch as lt
    from tests.tiny_decoders import probe_ids
    from tests.tiny_gpt_oss import build_gpt_oss

    rows = {}
    for variant in ("spread", "one_expert"):
        folder = build_gpt_oss(variant, root / "gpt_oss")
        ref = load_reference(folder, device)
        ids = probe_ids(ref.config.vocab_size).to(device)
        expected = reference_run(ref, ids, NEW_TOKENS)
        modes = ("interpret", "generated") + (("cudagraphs",) if device == "cuda" else ())
        for mode in modes:  # a decode step on a GPU takes the gather path: no host sync
            model = lt.load(folder, dtype="f32", device=device, mode=mode)
            rows[f"{variant}/{mode}"] = compare(model, ids, *expected, F32_TOL)
            log("gpt_oss", variant, mode, rows[f"{variant}/{mode}"])
    return {"rows": rows, "ok": all(r["ok"] for r in rows.values())}


def check_offload(device: str, root: Path, quick: bool) -> dict:
    """Layers beyond a device budget streamed from pinned host memory on a side stream
    (linnet/shard), four-layer tiny Llama: every budget's logits and tokens against
    transformers on the device."""
    import linnet.torch as lt
    from tests.tiny_decoders import build_tiny, probe_ids

    folder = build_tiny("llama", "deep", root)
    ref = load_reference(folder, device)
    ids = probe_ids(ref.config.vocab_size).to(device)
    expected = reference_run(ref, ids, NEW_TOKENS)
    whole = lt.load(folder, dtype="f32", device=device, mode="generated")
    fixed = sum(t.nbytes for n, t in whole.params.items() if not n.startswith("layers."))
    layer = sum(t.nbytes for n, t in whole.params.items() if n.startswith("layers.0."))
    rows = {}
    # one byte short of the model: layer 0 held, three streamed; room for two streamed alone
    for held, budget in ((1, fixed + 4 * layer - 1), (0, fixed + 3 * layer - 1)):
        model = lt.load(
            folder, dtype="f32", devices=[device], max_device_bytes=budget, mode="generated"
        )
        row = compare(model, ids, *expected, F32_TOL)
        row["streamed"] = sorted(model.placement.streamed)
        rows[f"held {held}"] = row
        log("offload", held, row)
    return {"rows": rows, "ok": all(r["ok"] for r in rows.values())}


def check_jax(device: str, root: Path, quick: bool) -> dict:
    import jax
    import numpy as np

    import linnet.jax as lj
    from tests.tiny_decoders import build_tiny, probe_ids

    folder = build_tiny("llama", "base", root)
    ref = load_reference(folder, "cpu")
    ids = probe_ids(ref.config.vocab_size)
    ref_logits, ref_greedy = reference_run(ref, ids, NEW_TOKENS)
    model = lj.load(folder, dtype="f32")
    got = np.asarray(model.forward(ids.numpy()), dtype=np.float32)
    tokens = np.asarray(model.generate(ids.numpy(), NEW_TOKENS))
    delta = float(np.abs(got - ref_logits.numpy()).max())
    same = tokens.tolist() == ref_greedy.tolist()
    return {
        "jax_devices": [str(d) for d in jax.devices()],
        "max_abs": delta,
        "tokens_equal": same,
        "ok": same and delta <= F32_TOL,
    }


def _timed(fn, device: str, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def check_decode_speed(device: str, root: Path, quick: bool) -> dict:
    """Tokens/s of a 64-token greedy answer after a 16-token prompt (batch 1, bf16), the
    best of 3 after a warm-up, each stack in this process."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import linnet.torch as lt

    shape = dict(SMOLLM2_SHAPE, num_hidden_layers=2) if quick else SMOLLM2_SHAPE
    folder = root / "smollm2-shape"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**shape)).to(torch.bfloat16).save_pretrained(folder)
    new, rounds = (8, 1) if quick else (64, 3)
    ids = torch.randint(0, shape["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    rows = {}
    ref = LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, trust_remote_code=False)
    ref = ref.eval().to(device)
    for cache in ("dynamic", "static"):

        def run(ref=ref, cache=cache):
            with torch.no_grad():
                return ref.generate(
                    ids, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                    pad_token_id=0, cache_implementation=cache,
                )  # fmt: skip

        reference_tokens = run()
        rows[f"transformers/{cache}"] = {"tok_s": new / _timed(run, device, rounds)}
    del ref
    for mode in ["generated"] + (["cudagraphs"] if device == "cuda" else []):
        model = lt.load(folder, dtype="bf16", device=device, mode=mode, max_positions=256)
        tokens = model.generate(ids, new)
        seconds = _timed(lambda model=model: model.generate(ids, new), device, rounds)
        rows[f"linnet/{mode}"] = {
            "tok_s": new / seconds,
            "same_tokens_as_transformers": tokens.tolist() == reference_tokens.tolist(),
        }
        del model
    base = rows["transformers/dynamic"]["tok_s"]
    for row in rows.values():
        row["vs_transformers_dynamic"] = round(row["tok_s"] / base, 2)
        row["tok_s"] = round(row["tok_s"], 1)
    log("decode_speed", rows)
    return {"rows": rows, "ok": True, "prompt": 16, "new_tokens": new, "rounds": rounds}


CHECKS = {
    "tiny_parity": check_tiny_parity,
    "compile": check_compile,
    "bf16": check_bf16,
    "gpt_oss": check_gpt_oss,
    "offload": check_offload,
    "jax": check_jax,
    "decode_speed": check_decode_speed,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer models (a dry run)")
    parser.add_argument("--only", default="", help="comma-separated checks")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    report = {"device": args.device, "env": env_report(args.device), "checks": {}}
    root = Path(tempfile.mkdtemp(prefix="linnet-gpu-check-"))
    for name in names:
        t0 = time.perf_counter()
        try:
            result = CHECKS[name](args.device, root, args.quick)
        except Exception as e:  # one failing check must not cost the others' figures
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()
        result["seconds"] = round(time.perf_counter() - t0, 1)
        report["checks"][name] = result
        log(f"== {name}: {'ok' if result['ok'] else 'FAILED'} in {result['seconds']} s")
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(c["ok"] for c in report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
