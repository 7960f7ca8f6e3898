"""Where transcription time goes (bench/whisper.py --profile): the log-mel front end, the
encoder, the prompt's decode and each later decode step, timed apart, for Linnet's backends and
CTranslate2 on the same clip and checkpoint.

Linnet: `front.features`, `model.encode`, `model.decode(prompt, 0)`, then one `decode` per
token (the host copy of the logits and the argmax included, as `greedy` does them).
CTranslate2: WhisperFeatureExtractor, `Whisper.encode`, then `Whisper.generate` from the encoder
output (prompt and steps together: it exposes no single step; `step_s` is its total over the
tokens it returned). Each figure is the median of `repeats` runs after one untimed run.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np


def _timed(fn, repeats: int):
    fn()  # untimed: warm-up, compilation
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _load_linnet(name: str, folder: Path, scratch: Path):
    backend = name.split("/")[1]
    if backend in ("interpret", "generated", "compile"):
        import linnet.torch

        return linnet.torch.load(folder, mode=backend)
    if backend == "jax":
        import linnet.jax

        return linnet.jax.load(folder)
    import linnet.onnx

    out = Path(tempfile.mkdtemp(dir=scratch)) / "onnx"
    numerics = "fast" if backend == "onnx-fast" else "equivalent"
    return linnet.onnx.load(linnet.onnx.export(folder, out, progress=False), numerics=numerics)


def linnet_parts(name, folder, samples, prompt, new_tokens, repeats, scratch) -> dict:
    from linnet.audio import FrontEnd
    from linnet.speech import _host

    model = _load_linnet(name, folder, scratch)
    front = FrontEnd.from_folder(folder, n_mels=model.config["n_mels"])
    front_s, mel = _timed(lambda: front.features(samples)[None], repeats)
    encode_s, _ = _timed(lambda: model.encode(mel), repeats)
    ids = np.array([prompt], dtype=np.int64)

    def prefill():
        model.reset()
        return int(_host(model.decode(ids, 0)).argmax(-1)[0])

    prefill_s, token = _timed(prefill, repeats)
    steps = []
    for k in range(new_tokens - 1):
        t0 = time.perf_counter()
        logits = model.decode(np.array([[token]], dtype=np.int64), len(prompt) + k)
        token = int(_host(logits).argmax(-1)[0])
        steps.append(time.perf_counter() - t0)
    return dict(front_s=front_s, encode_s=encode_s, prefill_s=prefill_s,
                step_s=statistics.median(steps), steps=len(steps))  # fmt: skip


def ct2_parts(name, folder, samples, prompt, new_tokens, repeats, scratch) -> dict:
    import ctranslate2
    from transformers import WhisperFeatureExtractor

    out = Path(tempfile.mkdtemp(dir=scratch)) / "ct2"
    ctranslate2.converters.TransformersConverter(str(folder)).convert(str(out), force=True)
    compute = {"f32": "float32", "int8": "int8"}[name.split("/")[1]]
    model = ctranslate2.models.Whisper(
        str(out), device="cpu", compute_type=compute, intra_threads=os.cpu_count() or 0
    )
    extractor = WhisperFeatureExtractor.from_pretrained(folder, trust_remote_code=False)
    feats = lambda: extractor(samples, sampling_rate=16000, return_tensors="np").input_features  # noqa: E731
    front_s, mel = _timed(feats, repeats)
    view = ctranslate2.StorageView.from_array(mel)
    encode_s, memory = _timed(lambda: model.encode(view, to_cpu=True), repeats)

    def generate():
        result = model.generate(memory, [prompt], beam_size=1, max_length=2 * new_tokens,
                                suppress_blank=True, suppress_tokens=[-1])  # fmt: skip
        return len(result[0].sequences_ids[0])

    decode_s, tokens = _timed(generate, repeats)
    return dict(front_s=front_s, encode_s=encode_s, decode_s=decode_s, tokens=tokens,
                step_s=decode_s / max(tokens, 1))  # fmt: skip


def profile(folder: Path, samples, methods, new_tokens: int, repeats: int) -> dict:
    """method -> its parts' seconds (or the error it raised)."""
    from bench.whisper import FIRST_LANG, NO_TIMESTAMPS, SCRATCH, SOT, TRANSLATE

    prompt = [SOT, FIRST_LANG, TRANSLATE + 1, NO_TIMESTAMPS]
    out = {}
    for name in [m for m in methods if m.split("/")[0] in ("linnet", "ctranslate2")]:
        parts = ct2_parts if name.startswith("ctranslate2/") else linnet_parts
        print(f"profile {name} ...", flush=True)
        try:
            out[name] = parts(name, folder, samples, prompt, new_tokens, repeats, SCRATCH)
        except Exception as err:  # a method that fails is a row with its error
            out[name] = {"error": f"{type(err).__name__}: {err}",
                         "trace": traceback.format_exc(limit=3)}  # fmt: skip
        print(f"  {out[name]}", flush=True)
    return out
