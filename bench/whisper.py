"""Whisper transcription latency (issue 14): one ~10 s espeak-ng clip, batch 1, on a random
checkpoint of openai/whisper-tiny's shape, through Linnet's modes and backends, transformers
(eager and torch.compile) and CTranslate2 (f32 and int8), with the tokens compared.

    python bench/whisper.py                      # writes bench/results/whisper.json
    python bench/whisper.py --only linnet/onnx --repeats 3 --out /tmp/w.json

Every method transcribes the same samples (16 kHz) from the samples on: the log-mel front
end (Linnet's own; WhisperFeatureExtractor for transformers and CTranslate2), the encoder,
then greedy decoding of up to `--new-tokens` tokens after the prompt <|startoftranscript|>
<|en|> <|transcribe|> <|notimestamps|>, under the checkpoint's suppression rules. The random
weights never say <|endoftext|>, so every method decodes the same number of tokens. Timed:
the best and the median of `--repeats` calls after one untimed call (its time is recorded as
`first_call_s`; loading, exporting, converting and compiling are `setup_s`). The machine's
load is recorded before and after (bench/common.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.common import machine, provenance, versions  # noqa: E402

# openai/whisper-tiny's config.json (dims, special ids); the weights are random.
TINY = dict(
    vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
    encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
    decoder_ffn_dim=1536, max_source_positions=1500, max_target_positions=448,
    decoder_start_token_id=50258, bos_token_id=50257, eos_token_id=50257, pad_token_id=50257,
    begin_suppress_tokens=[220, 50257],
)  # fmt: skip
# --quick: the same vocabulary, special ids and 30 s window on a narrow, shallow model.
QUICK = dict(TINY, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
             decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128)  # fmt: skip
EOT, SOT, FIRST_LANG, TRANSLATE, NO_TIMESTAMPS = 50257, 50258, 50259, 50358, 50363
LANGS = ["en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar"]
# A few of whisper-tiny's suppress_tokens (punctuation-like ids, the special tokens' block).
SUPPRESS = [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92,
            93, 359, 503, 522, 542, 873, 893, 902, 918, 922, 931, 1350, 1853, 1982, 2460, 2627,
            50246, 50247, 50253, 50358, 50359, 50360, 50361, 50362]  # fmt: skip
TEXT = (
    "Whisper turns speech into text. This clip was spoken by a machine, so that every "
    "engine hears the same sound, and the benchmark can compare the tokens each one writes."
)
RATE = 16000
RESULTS = ROOT / "bench" / "results" / "whisper.json"
SCRATCH = Path(tempfile.mkdtemp(prefix="linnet-bench-whisper-"))  # exports, removed at exit


def special_tokens() -> list[str]:
    """whisper-tiny's ids 50257..50363: end, start, 99 languages (the first ones named), the
    tasks and the other markers."""
    langs = [f"<|{c}|>" for c in LANGS] + [f"<|l{i}|>" for i in range(99 - len(LANGS))]
    return ["<|endoftext|>", "<|startoftranscript|>", *langs, "<|translate|>",
            "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
            "<|notimestamps|>"]  # fmt: skip


def save_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over the ids (CTranslate2's converter reads a vocabulary)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(EOT)] + special_tokens()
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)


def build_checkpoint(folder: Path, shape: dict = TINY) -> Path:
    """whisper-tiny's shape with transformers' random init (seed 0), f32, its decoding rules
    in generation_config.json and WhisperFeatureExtractor's preprocessor_config.json."""
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(WhisperConfig(**shape)).eval()
    g = model.generation_config
    g.lang_to_id = {t: FIRST_LANG + i for i, t in enumerate(special_tokens()[2:101])}
    g.task_to_id = {"translate": TRANSLATE, "transcribe": TRANSLATE + 1}
    g.no_timestamps_token_id = NO_TIMESTAMPS
    g.suppress_tokens, g.begin_suppress_tokens = SUPPRESS, TINY["begin_suppress_tokens"]
    g.is_multilingual, g.max_length = True, 448
    g._from_model_config = False
    tmp = Path(tempfile.mkdtemp(dir=folder.parent))
    model.save_pretrained(tmp)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(tmp)
    save_tokenizer(tmp)
    tmp.rename(folder)
    return folder


def speech() -> tuple:
    """espeak-ng's voice reading TEXT, as 16 kHz samples, and the clip's length in s."""
    from linnet.audio import read_audio

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-s", "170", "-w", str(path), TEXT], check=True)
        samples = read_audio(path, RATE).astype("float32")
    return samples, samples.size / RATE


def cut_at_end(tokens) -> list[int]:
    tokens = [int(t) for t in tokens]
    return tokens[: tokens.index(EOT)] if EOT in tokens else tokens


# -- the methods: each returns (setup seconds, a call samples -> tokens) ----------------------
def linnet_method(folder: Path, backend: str, mode: str | None, new_tokens: int,
                  numerics: str = "equivalent"):  # fmt: skip
    from linnet.speech import transcribe

    t0 = time.perf_counter()
    if backend == "torch":
        import linnet.torch

        model = linnet.torch.load(folder, mode=mode)
    elif backend == "jax":
        import linnet.jax

        model = linnet.jax.load(folder)
    else:
        import linnet.onnx

        out = Path(tempfile.mkdtemp(dir=SCRATCH)) / "onnx"
        export = linnet.onnx.export(folder, out, progress=False)
        model = linnet.onnx.load(export, numerics=numerics)

    def run(samples):
        result = transcribe(model, samples, language="en", task="transcribe",
                            max_new_tokens=new_tokens, folder=folder)  # fmt: skip
        return cut_at_end(result.tokens[0])

    return time.perf_counter() - t0, run


def transformers_method(folder: Path, compiled: bool, new_tokens: int):
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    t0 = time.perf_counter()
    extractor = WhisperFeatureExtractor.from_pretrained(folder, trust_remote_code=False)
    model = WhisperForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, trust_remote_code=False
    ).eval()
    if compiled:  # transformers' recipe for Whisper: a static cache, the forward compiled
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward)

    def run(samples):
        feats = extractor(samples, sampling_rate=RATE, return_tensors="pt").input_features
        with torch.inference_mode():
            out = model.generate(feats, language="en", task="transcribe",
                                 max_new_tokens=new_tokens, do_sample=False)  # fmt: skip
        return cut_at_end(out[0].tolist())

    return time.perf_counter() - t0, run


def ctranslate2_method(folder: Path, compute_type: str, new_tokens: int):
    import ctranslate2
    from transformers import WhisperFeatureExtractor

    t0 = time.perf_counter()
    out = Path(tempfile.mkdtemp(dir=SCRATCH)) / "ct2"
    ctranslate2.converters.TransformersConverter(str(folder)).convert(str(out), force=True)
    model = ctranslate2.models.Whisper(
        str(out), device="cpu", compute_type=compute_type, intra_threads=os.cpu_count() or 0
    )
    extractor = WhisperFeatureExtractor.from_pretrained(folder, trust_remote_code=False)
    prompt = [SOT, FIRST_LANG, TRANSLATE + 1, NO_TIMESTAMPS]

    def run(samples):
        feats = extractor(samples, sampling_rate=RATE, return_tensors="np").input_features
        result = model.generate(
            ctranslate2.StorageView.from_array(feats), [prompt], beam_size=1,
            max_length=2 * new_tokens, suppress_blank=True, suppress_tokens=[-1],
        )  # fmt: skip
        return cut_at_end(result[0].sequences_ids[0][:new_tokens])

    return time.perf_counter() - t0, run


METHODS = {
    "linnet/interpret": lambda f, n: linnet_method(f, "torch", "interpret", n),
    "linnet/generated": lambda f, n: linnet_method(f, "torch", "generated", n),
    "linnet/compile": lambda f, n: linnet_method(f, "torch", "compile", n),
    "linnet/jax": lambda f, n: linnet_method(f, "jax", None, n),
    "linnet/onnx": lambda f, n: linnet_method(f, "onnx", None, n),
    # int8 encoder linears, f32 decoding (linnet/onnx_fast.py)
    "linnet/onnx-fast": lambda f, n: linnet_method(f, "onnx", None, n, "fast"),
    "transformers/eager": lambda f, n: transformers_method(f, False, n),
    "transformers/compile": lambda f, n: transformers_method(f, True, n),
    "ctranslate2/f32": lambda f, n: ctranslate2_method(f, "float32", n),
    "ctranslate2/int8": lambda f, n: ctranslate2_method(f, "int8", n),
}
REFERENCE = "transformers/eager"
PROFILED = ["linnet/onnx", "linnet/generated", "ctranslate2/f32", "ctranslate2/int8"]


def measure(name: str, folder: Path, samples, new_tokens: int, repeats: int) -> dict:
    try:
        setup_s, run = METHODS[name](folder, new_tokens)
        t0 = time.perf_counter()
        tokens = run(samples)
        first = time.perf_counter() - t0
        times, cpu = [], []  # cpu: the process's CPU seconds (all its threads), less load-bound
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            again = run(samples)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            if again != tokens:
                raise RuntimeError("tokens changed between calls")
    except Exception as err:  # a method that fails is a row with its error, not a crash
        return {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=3)}
    return dict(setup_s=setup_s, first_call_s=first, best_s=min(times),
                median_s=statistics.median(times), cpu_median_s=statistics.median(cpu),
                tokens=tokens)  # fmt: skip


def compare(results: dict, audio_s: float) -> None:
    """Tokens against transformers eager's; speed (audio seconds per second) and ratios."""
    want = results.get(REFERENCE, {}).get("tokens")
    for cell in results.values():
        if "best_s" not in cell:
            continue
        cell["same_tokens"] = want is not None and cell["tokens"] == want
        cell["realtime_x"] = audio_s / cell["best_s"]
    for cell in results.values():
        if "best_s" in cell:
            cell["vs"] = {
                other: results[other]["best_s"] / cell["best_s"]
                for other in results
                if other.split("/")[0] != "linnet" and "best_s" in results[other]
            }


def goals(results: dict) -> list[dict]:
    """The issue's goal: the best Linnet method >= 1.5x transformers' best, >= 1.0x CT2's."""
    best = lambda prefix: min(  # noqa: E731
        ((c["best_s"], m) for m, c in results.items() if m.startswith(prefix) and "best_s" in c),
        default=None,
    )
    ours, out = best("linnet/"), []
    for prefix, want in (("transformers/", 1.5), ("ctranslate2/", 1.0)):
        theirs = best(prefix)
        if ours and theirs:
            speedup = theirs[0] / ours[0]
            out.append(dict(goal=f"{ours[1]} >= {want}x {theirs[1]}", speedup=speedup,
                            met=speedup >= want))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(METHODS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--checkpoint", type=Path, default=None, help="default: a cache folder")
    ap.add_argument("--torch-threads", type=int, default=None, help="default: torch's own")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a check of the script: a 1-layer d_model 64 checkpoint, 4 tokens, 1 call",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="time the front end, the encoder and each decode step apart",
    )
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.new_tokens = 1, 4
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    from linnet.hub import linnet_cache

    cache = linnet_cache() / "bench"
    cache.mkdir(parents=True, exist_ok=True)
    if args.quick:
        folder = build_checkpoint(args.checkpoint or SCRATCH / "whisper-quick", QUICK)
    else:
        folder = build_checkpoint(args.checkpoint or cache / "whisper-tiny-shape")
    samples, audio_s = speech()
    record = dict(
        what="Whisper transcription latency, one clip, batch 1 (bench/whisper.py)",
        model="whisper-tiny" if not args.quick else "whisper-quick (a check of the script)",
        checkpoint="whisper-tiny-shape (random weights, transformers init)",
        quick=args.quick,
        audio=dict(source="espeak-ng -s 170", text=TEXT, seconds=audio_s, rate=RATE),
        new_tokens=args.new_tokens, repeats=args.repeats, torch_threads=args.torch_threads,
        machine=machine(),
        versions=versions(["torch", "transformers", "ctranslate2", "onnxruntime", "jax", "linnet"]),
        **provenance(), results={},
    )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.profile:
        from bench.whisper_profile import profile

        record["profile"] = profile(folder, samples, args.only or PROFILED, args.new_tokens,
                                    args.repeats)  # fmt: skip
        write(record, audio_s, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
        return
    for name in args.only or list(METHODS):
        print(f"{name} ...", file=sys.stderr, flush=True)
        cell = measure(name, folder, samples, args.new_tokens, args.repeats)
        record["results"][name] = cell
        shown = {k: v for k, v in cell.items() if k not in ("tokens", "trace")}
        print(f"  {shown}", file=sys.stderr, flush=True)
        write(record, audio_s, args.out)  # after each method: a stopped run keeps what it has
    print(f"wrote {args.out}", file=sys.stderr)


def write(record: dict, audio_s: float, out: Path) -> None:
    compare(record["results"], audio_s)
    record["goals"] = goals(record["results"])
    record["load_average_end"] = list(os.getloadavg())
    out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
