"""The two contenders interleaved (issue 14): the whole transcription of bench/whisper.py's
clip (32 tokens) by Linnet's ONNX fast path as `linnet.onnx.load(..., numerics="fast")` gives it
(no spinning, decode on one thread), the same int8 folder under onnxruntime's default pool (2
threads, spinning: the sessions before that tuning), and CTranslate2 int8 with 2 threads (what
bench/whisper.py runs) and 1, called in turn `--repeats` times in one process so that each
meets the same load. Writes the process's CPU seconds and the wall times per call (medians,
best), whether every variant gave the same tokens, the machine (CPU flags) and the load
average before and after.

    python bench/whisper_threads.py [--repeats 7] [--out FILE]  # default: OUT below
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.whisper import (  # noqa: E402
    FIRST_LANG,
    NO_TIMESTAMPS,
    SCRATCH,
    SOT,
    TRANSLATE,
    build_checkpoint,
    cut_at_end,
    speech,
)

OUT = Path(__file__).resolve().parent / "results" / "checks" / "whisper_interleaved.json"
CT2 = "ctranslate2/int8 2 threads"


def linnet_variant(export: Path, folder: Path, samples, tuned: bool):
    import onnxruntime as ort

    import linnet.onnx
    from linnet.onnx import OnnxModel
    from linnet.speech import transcribe

    model = linnet.onnx.load(export, numerics="fast")
    if not tuned:  # the same int8 folder, every session with onnxruntime's default options
        options = ort.SessionOptions()
        files = {name: e["file"] for name, e in model.signature["entries"].items()}
        vocab = model.vocab  # the int8 projection's f32 rows (linnet/onnx_vocab.py)
        model = OnnxModel(model.signature, {
            name: ort.InferenceSession(str(model.export_folder / f), options,
                                       providers=["CPUExecutionProvider"])
            for name, f in files.items()
        })  # fmt: skip
        model.vocab = vocab
    return lambda: cut_at_end(
        transcribe(
            model, samples, language="en", task="transcribe", max_new_tokens=32, folder=folder
        ).tokens[0]  # fmt: skip
    )


def ct2_variant(converted: Path, folder: Path, samples, threads: int):
    import ctranslate2
    from transformers import WhisperFeatureExtractor

    model = ctranslate2.models.Whisper(
        str(converted), device="cpu", compute_type="int8", intra_threads=threads
    )
    extractor = WhisperFeatureExtractor.from_pretrained(folder, trust_remote_code=False)
    prompt = [SOT, FIRST_LANG, TRANSLATE + 1, NO_TIMESTAMPS]

    def run():
        feats = extractor(samples, sampling_rate=16000, return_tensors="np").input_features
        out = model.generate(ctranslate2.StorageView.from_array(feats), [prompt], beam_size=1,
                             max_length=64, suppress_blank=True, suppress_tokens=[-1])  # fmt: skip
        return cut_at_end(out[0].sequences_ids[0][:32])

    return run


def main() -> None:
    import ctranslate2

    import linnet.onnx
    from bench.common import machine, provenance, versions
    from linnet.hub import linnet_cache

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    folder = build_checkpoint(linnet_cache() / "bench" / "whisper-tiny-shape")
    samples, audio_s = speech()
    scratch = Path(tempfile.mkdtemp(dir=SCRATCH))  # removed at exit
    export = linnet.onnx.export(folder, scratch / "onnx", progress=False)
    ctranslate2.converters.TransformersConverter(str(folder)).convert(str(scratch / "ct2"))
    runs = {
        "linnet/onnx-fast": linnet_variant(export, folder, samples, True),
        "linnet/onnx-fast, onnxruntime's default pool": linnet_variant(
            export, folder, samples, False
        ),
        "ctranslate2/int8 2 threads": ct2_variant(scratch / "ct2", folder, samples, 2),
        "ctranslate2/int8 1 thread": ct2_variant(scratch / "ct2", folder, samples, 1),
    }
    tokens = {name: run() for name, run in runs.items()}  # untimed
    record = dict(what=__doc__.splitlines()[0], audio_s=audio_s, repeats=args.repeats,
                  machine=machine(), versions=versions(["onnxruntime", "ctranslate2"]),
                  **provenance())  # fmt: skip
    cpu, wall = ({name: [] for name in runs} for _ in range(2))
    for _ in range(args.repeats):
        for name, run in runs.items():
            c0, t0 = time.process_time(), time.perf_counter()
            run()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - t0)
    record["load_average_end"] = list(os.getloadavg())
    record["same_tokens"] = len({tuple(t) for t in tokens.values()}) == 1
    record["tokens"] = tokens
    record["results"] = {
        name: dict(cpu_median_s=statistics.median(cpu[name]), wall_median_s=statistics.median(
            wall[name]), wall_best_s=min(wall[name]), wall_s=wall[name], cpu_s=cpu[name])
        for name in runs
    }  # fmt: skip
    ours, theirs = record["results"]["linnet/onnx-fast"], record["results"][CT2]
    record["vs_ctranslate2_int8"] = {
        k: theirs[k] / ours[k] for k in ("wall_median_s", "wall_best_s", "cpu_median_s")
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(
        json.dumps({k: v for k, v in record.items() if k not in ("versions", "tokens")}, indent=1)
    )


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
