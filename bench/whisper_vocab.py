"""A decode step of numerics="fast" ONNX with the vocabulary projection f32 (before) and int8
with the f32 argmax recovered (linnet/onnx_vocab.py), interleaved in one process on
bench/whisper.py's whisper-tiny-shaped checkpoint and clip (issue 14).

Both variants share the int8 encoder and every session option of `linnet.onnx.load(...,
numerics="fast")`; "f32 projection" runs the export's own decode.onnx (what the fast folder
held before), "int8 projection" the fast folder's. Per step, the process's CPU time and the
wall time of the decode call plus the rules and the argmax, as `linnet.speech.greedy` does
them (the rules: the checkpoint's suppression). Writes the medians, the candidates each
int8 step recomputed, whether both gave the same tokens at every step, the machine (CPU
flags) and the load average.

    python bench/whisper_vocab.py [--steps 32] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import bench.whisper as wb  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "checks" / "whisper_vocab.json"


def variants(export: Path):
    """name -> model: the fast folder's sessions, decode from the export or the fast folder."""
    import onnxruntime as ort

    import linnet.onnx
    from linnet.onnx import OnnxModel, _options

    fast = linnet.onnx.load(export, numerics="fast")
    old = OnnxModel(json.loads((export / "linnet.json").read_text()), dict(fast.sessions))
    old.sessions["decode"] = ort.InferenceSession(
        str(export / "decode.onnx"), _options("decode", None, "fast"),
        providers=["CPUExecutionProvider"],
    )  # fmt: skip
    return {"f32 projection": old, "int8 projection": fast}


def run_steps(model, mel, rules, prompt, steps: int) -> dict:
    """One greedy pass: per step (the prompt's first) CPU and wall seconds, tokens."""
    from linnet.speech import _host, _step, rule_scores

    model.encode(mel)
    decode, bounded = _step(model, False)
    cpu, wall, tokens, candidates, out = [], [], [], [], [[]]
    ids, at = prompt, 0
    for _ in range(steps):
        c0, t0 = time.process_time(), time.perf_counter()
        logits = decode(ids, at)
        scores = rule_scores(_host(logits.logits if bounded else logits), rules, out, False)
        token = int((logits.argmax(scores) if bounded else scores.argmax(-1))[0])
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
        candidates.extend(logits.candidates if bounded else [])
        out[0].append(token)
        tokens.append(token)
        at += ids.shape[1]
        ids = np.array([[token]], dtype=np.int64)
    return dict(cpu=cpu, wall=wall, tokens=tokens, candidates=candidates)


def main() -> None:
    import linnet.onnx
    from bench.common import machine, provenance, versions
    from linnet.audio import FrontEnd
    from linnet.hub import linnet_cache
    from linnet.speech import WhisperRules

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    folder = wb.build_checkpoint(linnet_cache() / "bench" / "whisper-tiny-shape")
    samples, audio_s = wb.speech()
    export = linnet.onnx.export(
        folder, Path(tempfile.mkdtemp(dir=wb.SCRATCH)) / "onnx", progress=False
    )
    models = variants(export)
    mel = FrontEnd.from_folder(folder, n_mels=80).features(samples)[None]
    rules = WhisperRules.from_folder(folder)
    prompt = np.array([[wb.SOT, wb.FIRST_LANG, wb.TRANSLATE + 1, wb.NO_TIMESTAMPS]], dtype=np.int64)
    record = dict(what=__doc__.splitlines()[0], audio_s=audio_s, machine=machine(),
                  versions=versions(["onnxruntime", "numpy"]), **provenance())  # fmt: skip
    runs = {name: [] for name in models}
    for model in models.values():
        run_steps(model, mel, rules, prompt, 3)  # untimed: warm-up
    for _ in range(args.rounds):
        for name, model in models.items():
            runs[name].append(run_steps(model, mel, rules, prompt, args.steps))
    record["load_average_end"] = list(os.getloadavg())
    record["same_tokens"] = len({tuple(r["tokens"]) for rs in runs.values() for r in rs}) == 1
    record["tokens"] = runs["int8 projection"][0]["tokens"]
    record["results"] = {
        name: dict(
            first_step_cpu_ms=1e3 * statistics.median(r["cpu"][0] for r in rs),
            step_cpu_ms=1e3 * statistics.median(c for r in rs for c in r["cpu"][1:]),
            step_wall_ms=1e3 * statistics.median(w for r in rs for w in r["wall"][1:]),
            step_wall_best_ms=1e3 * min(w for r in rs for w in r["wall"][1:]),
            candidates_max=max((c for r in rs for c in r["candidates"]), default=None),
            candidates_median=statistics.median(c for r in rs for c in r["candidates"])
            if rs[0]["candidates"] else None,
        )
        for name, rs in runs.items()
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("versions",)}, indent=1))


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(wb.SCRATCH, ignore_errors=True)
