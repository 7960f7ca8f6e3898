"""Benchmark results (bench/results/*.json) as rows for the site: one row per model, method
and configuration, with its figures, its notes and where and how it was measured.

Three writers, three shapes: bench/run.py (decoders: one file per model, rows per dtype),
bench/encoders.py (encoders and vision: rows per batch size) and bench/convert.py
(HF -> GGUF converters). A file of another shape stops the build with a message naming it.

    suites = read_bench(Path("bench/results"), entry_for)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from linnet.site.records import Made, SiteError, load_json, made_of

#: The benchmarks' own model names (bench/run.py --model, bench/encoder_models.MODELS) and
#: the zoo entry each is measured as.
BENCH_MODELS = {
    "smollm2": "smollm2-135m-instruct",
    "tinyllama": "tinyllama-1.1b-chat",
    "minilm": "all-minilm-l6-v2",
    "resnet18": "resnet-18",
}


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool


@dataclass
class BenchRow:
    model: str  # the benchmark's name for the model (or checkpoint)
    entry: str | None
    weights: str  # "real weights" or "random weights of the entry's shape"
    method: str
    config: str  # "f32", "batch 32", "HF -> GGUF f16"
    figures: dict[str, float]
    notes: str
    ok: bool
    file: str


@dataclass
class Suite:
    key: str  # decoders, encoders, convert
    title: str
    what: str
    metrics: list[Metric]
    comparisons: list[Metric]  # the metrics charted, one card per model
    rows: list[BenchRow] = field(default_factory=list)
    made: dict[str, Made] = field(default_factory=dict)  # file -> where it was measured
    images: dict[str, Path] = field(default_factory=dict)  # a record's `plot` (SVG) -> its file

    def models(self) -> list[str]:
        return list(dict.fromkeys(r.model for r in self.rows))

    def configs(self) -> list[str]:
        return list(dict.fromkeys(r.config for r in self.rows))


DECODER_METRICS = [
    Metric("decode_tok_s", "decode", "tokens/s", True),
    Metric("forward_128_ms", "forward, 128 tokens", "ms", False),
    Metric("forward_512_ms", "forward, 512 tokens", "ms", False),
    Metric("prefill_ms", "prefill", "ms", False),
    Metric("load_s", "load", "s", False),
    Metric("warmup_s", "warm-up", "s", False),
    Metric("roofline_fraction", "of roofline", "×", True),
]
ENCODER_METRICS = [
    Metric("latency_ms", "latency (median)", "ms", False),
    Metric("min_ms", "latency (min)", "ms", False),
    Metric("items_per_s", "throughput", "items/s", True),
    Metric("first_call_s", "first call", "s", False),
    Metric("max_abs_delta", "max |Δ| vs transformers", "", False),
]
CONVERT_METRICS = [
    Metric("wall_s", "wall time", "s", False),
    Metric("peak_rss_mb", "peak RSS", "MB", False),
]

TRAINING_METRICS = [  # bench/train.py (rows: linnet/site/bench_training.py)
    Metric("step_s", "step (median)", "s", False),
    Metric("tokens_s", "throughput", "tokens/s", True),
    Metric("peak_rss_mb", "peak RSS", "MB", False),
    Metric("final_loss", "last step's loss", "", False),
    Metric("heldout_loss", "held-out loss", "", False),
    Metric("mean_reward", "mean reward", "", True),
    Metric("first_step_s", "first step", "s", False),
]


def weights_of(checkpoint: str) -> str:
    """Bench checkpoints built at a model's shape with random weights say so in their name."""
    return "random weights of the entry's shape" if "shape" in checkpoint else "real weights"


def _ratios(vs) -> str:
    """`vs` (this method's speed over each baseline's) as one note."""
    if not isinstance(vs, dict):
        return ""
    parts = []
    for base, ratio in vs.items():
        if isinstance(ratio, dict):
            each = ", ".join(f"{k} {v:.2f}×" for k, v in ratio.items() if _number(v))
            parts.append(f"vs {base}: {each}")
        elif _number(ratio):
            parts.append(f"vs {base}: {ratio:.2f}×")
    return "; ".join(parts)


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _failure(cell: dict) -> str:
    text = str(cell.get("skipped") or cell.get("error") or "")
    return text.strip().splitlines()[-1] if text.strip() else ""


def _figures(cell: dict, metrics: list[Metric]) -> dict[str, float]:
    return {m.key: float(cell[m.key]) for m in metrics if _number(cell.get(m.key))}


def decoder_rows(data: dict, path: Path, entry_for) -> list[BenchRow]:
    """bench/run.py: results[dtype][method] -> figures, `vs` ratios, or error/skipped."""
    model = str(data.get("model"))
    weights = weights_of(str(data.get("checkpoint", "")))
    rows = []
    for dtype, methods in _dict(data["results"], path).items():
        for method, cell in _dict(methods, path).items():
            cell = _dict(cell, path)
            failed = _failure(cell)
            extra = [
                f"{k} {cell[k]:.2f} s" for k in ("compile_s", "export_s") if _number(cell.get(k))
            ]
            notes = "; ".join(p for p in (failed, *extra, _ratios(cell.get("vs"))) if p)
            row = BenchRow(
                model,
                entry_for(model),
                weights,
                method,
                dtype,
                _figures(cell, DECODER_METRICS),
                notes,
                not failed,
                path.name,
            )
            rows.append(row)
    return rows


def encoder_rows(data: dict, path: Path, entry_for) -> list[BenchRow]:
    """bench/encoders.py: results[model][method].batches[size] -> figures or error."""
    rows = []
    inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
    for model, methods in _dict(data["results"], path).items():
        weights = weights_of(str(_dict(inputs.get(model, {}), path).get("checkpoint", "")))
        for method, cell in _dict(methods, path).items():
            cell = _dict(cell, path)
            top = _failure(cell)
            info = cell.get("info") if isinstance(cell.get("info"), dict) else {}
            extra = [f"{k} {v:.2f} s" for k, v in info.items() if _number(v)]
            for batch, figs in _dict(cell.get("batches", {}), path).items():
                figs = _dict(figs, path)
                failed = top or _failure(figs)
                notes = "; ".join(p for p in (failed, *extra, _ratios(figs.get("vs"))) if p)
                row = BenchRow(
                    model,
                    entry_for(model),
                    weights,
                    method,
                    f"batch {batch}",
                    _figures(figs, ENCODER_METRICS),
                    notes,
                    not failed,
                    path.name,
                )
                rows.append(row)
            if top and not cell.get("batches"):
                rows.append(BenchRow(model, entry_for(model), weights, method, "every batch",
                                     {}, top, False, path.name))  # fmt: skip
    return rows


def convert_rows(data: dict, path: Path, entry_for) -> list[BenchRow]:
    """bench/convert.py: one result per checkpoint, each converter's wall time and RSS."""
    rows = []
    for result in data["results"]:
        result = _dict(result, path)
        name = str(result.get("checkpoint", "?"))
        notes = _convert_notes(result)
        for side in ("linnet", "llama.cpp"):
            cell = _dict(result.get(side, {}), path)
            row = BenchRow(
                name,
                entry_for(name),
                weights_of(name),
                side,
                "HF -> GGUF f16",
                _figures(cell, CONVERT_METRICS),
                notes,
                not _failure(cell),
                path.name,
            )
            rows.append(row)
    return rows


def _convert_notes(result: dict) -> str:
    parts = []
    if _number(result.get("speedup")):
        parts.append(f"linnet {result['speedup']:.2f}× faster than llama.cpp")
    if "rss_goal_met" in result:
        met = "met" if result["rss_goal_met"] else "missed"
        parts.append(f"RSS goal ≤ {result.get('rss_goal_mb', '?')} MB {met}")
    same = result.get("same_tensors")
    if isinstance(same, dict):
        differ = same.get("differing_tensors") or []
        parts.append(f"{same.get('tensors', '?')} tensors, {len(differ)} differ")
    return "; ".join(parts)


ratios_text, figures_of = _ratios, _figures  # for linnet.site.bench_training


def training_rows(data: dict, path: Path, entry_for) -> list[BenchRow]:
    """bench/train.py: runs[kind][method] -> figures (linnet/site/bench_training.py)."""
    from linnet.site.bench_training import training_rows as rows

    return rows(data, path, entry_for)


def _dict(value, path: Path) -> dict:
    if not isinstance(value, dict):
        raise SiteError(f"{path}: a benchmark result holds {type(value).__name__} for an object")
    return value


from linnet.site.bench_speech import SPEECH_METRICS, speech_rows  # noqa: E402 (uses the above)

SUITES = {
    "decoders": ("Decoders: PyTorch, JAX, transformers and llama.cpp", "bench/run.py",
                 DECODER_METRICS, DECODER_METRICS[:3], decoder_rows),
    "encoders": ("Encoders and vision: PyTorch, ONNX Runtime and transformers",
                 "bench/encoders.py", ENCODER_METRICS, ENCODER_METRICS[:1], encoder_rows),
    "convert": ("Conversion: HF safetensors to GGUF, Linnet and llama.cpp",
                "bench/convert.py", CONVERT_METRICS, CONVERT_METRICS, convert_rows),
    "speech": ("Speech: Whisper on PyTorch, JAX, ONNX Runtime, transformers and CTranslate2",
               "bench/whisper.py", SPEECH_METRICS, SPEECH_METRICS[:1], speech_rows),
    "training": ("LoRA training: Linnet (PyTorch, JAX) and TRL + PEFT", "bench/train.py",
                 TRAINING_METRICS, TRAINING_METRICS[:1], training_rows),
}  # fmt: skip


def suite_of(data: dict, path: Path) -> str:
    """Which writer made this file, from its shape."""
    results = data.get("results")
    if isinstance(results, dict) and "audio" in data and "new_tokens" in data:
        return "speech"
    if isinstance(results, dict) and "model" in data and "prompt" in data:
        return "decoders"
    if isinstance(results, dict) and "methods" in data and "inputs" in data:
        return "encoders"
    if isinstance(results, list) and "what" in data:
        return "convert"
    if data.get("suite") == "training" and isinstance(data.get("runs"), dict):
        return "training"
    keys = ", ".join(sorted(data)) or "none"
    raise SiteError(f"{path}: not a benchmark result the site knows (top-level keys: {keys})")


def read_bench(folder: Path, entry_for) -> list[Suite]:
    """Every result file under `folder`, grouped by the writer that made it."""
    suites: dict[str, Suite] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = load_json(path)
        key = suite_of(data, path)
        title, what, metrics, compared, rows_of = SUITES[key]
        suite = suites.setdefault(key, Suite(key, title, what, metrics, compared))
        suite.rows += rows_of(data, path, entry_for)
        suite.made[path.name] = made_of(data)
        plot = folder.parent.parent / str(data.get("plot") or "")  # bench/train.py's SVG
        if plot.suffix == ".svg" and plot.is_file():
            suite.images[plot.name] = plot
    return [suites[k] for k in SUITES if k in suites]
