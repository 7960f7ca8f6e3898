"""Threads and spinning, side by side (issue 14): the whole transcription of bench/whisper.py's
clip (32 tokens) by Linnet's ONNX fast path with onnxruntime's default pool (2 threads,
spinning), without spinning and with one thread, and by CTranslate2 int8 with 2 threads and 1,
interleaved in one process so that each meets the same load. Prints the process's CPU seconds
per call and the wall times, and whether every variant gave the same tokens.

    python bench/whisper_threads.py [--repeats 3]
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

from bench.whisper import (  # noqa: E402  # noqa: E402
    FIRST_LANG,
    NO_TIMESTAMPS,
    SCRATCH,
    SOT,
    TRANSLATE,
    build_checkpoint,
    cut_at_end,
    speech,
)


def linnet_variant(fast: Path, folder: Path, samples, spin: bool, threads: int = 0):
    import onnxruntime as ort

    from linnet.onnx import OnnxModel
    from linnet.speech import transcribe

    signature = json.loads((fast / "linnet.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = {
        name: ort.InferenceSession(
            str(fast / e["file"]), options, providers=["CPUExecutionProvider"]
        )
        for name, e in signature["entries"].items()
    }
    model = OnnxModel(signature, sessions)
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
    from linnet.hub import linnet_cache

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    folder = build_checkpoint(linnet_cache() / "bench" / "whisper-tiny-shape")
    samples, _ = speech()
    scratch = Path(tempfile.mkdtemp(dir=SCRATCH))  # removed at exit
    fast = linnet.onnx.load(
        linnet.onnx.export(folder, scratch / "onnx", progress=False), numerics="fast"
    ).export_folder
    ctranslate2.converters.TransformersConverter(str(folder)).convert(str(scratch / "ct2"))
    runs = {
        "linnet/onnx-fast 2 threads": linnet_variant(fast, folder, samples, True),
        "linnet/onnx-fast 2 threads, no spinning": linnet_variant(fast, folder, samples, False),
        "linnet/onnx-fast 1 thread": linnet_variant(fast, folder, samples, True, 1),
        "ctranslate2/int8 2 threads": ct2_variant(scratch / "ct2", folder, samples, 2),
        "ctranslate2/int8 1 thread": ct2_variant(scratch / "ct2", folder, samples, 1),
    }
    tokens = {name: run() for name, run in runs.items()}  # untimed
    cpu, wall = ({name: [] for name in runs} for _ in range(2))
    load = os.getloadavg()[0]
    for _ in range(args.repeats):
        for name, run in runs.items():
            c0, t0 = time.process_time(), time.perf_counter()
            run()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - t0)
    print(f"same tokens: {len({tuple(t) for t in tokens.values()}) == 1}")
    for name in runs:
        print(f"{name}: CPU median {statistics.median(cpu[name]):.3f} s, wall best "
              f"{min(wall[name]):.3f} s, median {statistics.median(wall[name]):.3f} s")  # fmt: skip
    print(f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
