#!/usr/bin/env python
"""GPT-OSS decode (issue 16): Linnet against llama.cpp on the same GGUF and transformers eager.

    python bench/gpt_oss.py                 # builds the checkpoint once, then bench/run.py
    python bench/gpt_oss.py --quick         # fewer repeats, shorter decode
    python bench/gpt_oss.py --threads 1     # every method on one thread (a loaded machine)

A random checkpoint of gpt-oss-20b's structure scaled to a 2-core machine (`SHAPE`: 32
experts of which 4 run per token, sinks, YaRN as gpt-oss-20b has it, sliding and full layers
alternating, 64-dim heads with 8 query heads per kv head; 8 layers of width 512 and a
32000-token vocabulary instead of 24 of 2880 and 201088), built by transformers and its
experts stored as MXFP4 pairs (Linnet's quantizer) as openai ships them, cached under
$LINNET_CACHE. bench/run.py then measures, each method in its own process:
`linnet/generated/equivalent` (the HF folder, experts kept MXFP4, the rest f32),
`linnet/generated/fast` (the same with the fused norm, rope and sink-attention step ops),
`transformers/eager` (the same folder) and `llama.cpp` (Linnet's f32 GGUF export of that
folder, whose experts are GGUF MXFP4 written from the stored blocks), and then
`linnet/generated/equivalent/gguf`: Linnet on that very GGUF file (its MXFP4 experts kept
packed, the rest f32: the bytes llama.cpp reads). Results:
bench/results/gpt_oss.json (the decoder format the site renders). No test asserts a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPE = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=512,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=64,
    num_local_experts=32,
    num_experts_per_tok=4,
    sliding_window=128,
    max_position_embeddings=4096,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=150000.0,
        factor=32.0,
        beta_fast=32.0,
        beta_slow=1.0,
        original_max_position_embeddings=4096,
        truncate=False,
    ),
)
MODEL = "gpt-oss-20b-shaped-scaled"  # the site files it under gpt-oss-20b
METHODS = "linnet/generated/equivalent,linnet/generated/fast,transformers/eager,llama.cpp"
GGUF_ROW = "linnet/generated/equivalent/gguf"  # Linnet on llama.cpp's file


def build_checkpoint() -> Path:
    """The scaled GPT-OSS checkpoint with MXFP4 experts (built once, then reused)."""
    cache = Path(os.environ.get("LINNET_CACHE", Path.home() / ".cache/linnet"))
    key = hashlib.sha256(json.dumps(SHAPE, sort_keys=True).encode()).hexdigest()[:12]
    path = cache / f"gpt-oss-shape-{key}"
    if (path / "mxfp4" / "config.json").exists():
        return path / "mxfp4"
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    from tests.tiny_gpt_oss import to_mxfp4

    torch.manual_seed(0)
    config = GptOssConfig(**SHAPE, attention_bias=True, dtype="float32")
    model = GptOssForCausalLM(config).eval()
    model.save_pretrained(path / "dense")
    return to_mxfp4(path / "dense", path / "mxfp4")


def main(argv=None) -> int:
    from bench import run

    argv = list(sys.argv[1:] if argv is None else argv)
    ckpt = build_checkpoint()
    defaults = ["--model", str(ckpt), "--dtypes", "f32", "--methods", METHODS]
    out = run.RESULTS / "gpt_oss.json"
    if "--out" in argv:  # a record the site does not render (bench/results/checks/)
        out = Path(argv[argv.index("--out") + 1])
    code = run.main(defaults + ["--out", str(out)] + argv)
    if out.exists():  # named for the site: the zoo entry's name, then what this is
        report = json.loads(out.read_text())
        report["model"] = MODEL
        add_gguf_row(report, ckpt, run.parse_args(defaults + ["--out", str(out)] + argv))
        out.write_text(json.dumps(report, indent=2) + "\n")
    return code


def add_gguf_row(report: dict, ckpt: Path, args) -> None:
    """Linnet's row on the GGUF file llama.cpp ran (the same worker, the file as checkpoint),
    with the load average it started at, ratios against the baselines of this run."""
    from bench import run

    gguf = run.RESULTS / "gguf" / ckpt.name / "model-f32.gguf"
    rows = report["results"].get("f32")
    if rows is None or not gguf.exists():
        return
    print(f"{MODEL} f32 {GGUF_ROW} ...", flush=True)
    load = list(os.getloadavg())
    rows[GGUF_ROW] = run.measure("linnet/generated/equivalent", str(gguf), "f32", gguf.parent, args)
    rows[GGUF_ROW]["load_average_at_start"] = load
    run.add_ratios(rows)


if __name__ == "__main__":
    raise SystemExit(main())
