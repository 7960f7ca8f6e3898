"""Speech benchmark results (bench/whisper.py) as site rows: one row per method, with its
latency on the clip, its speed against real time, and whether its tokens are transformers'.

    rows = speech_rows(data, path, entry_for)    # data: bench/results/whisper.json
"""

from __future__ import annotations

from pathlib import Path

from linnet.site.bench import BenchRow, Metric, _dict, _failure, _figures, _number, weights_of

SPEECH_METRICS = [
    Metric("best_s", "latency (best)", "s", False),
    Metric("median_s", "latency (median)", "s", False),
    Metric("realtime_x", "speed", "× real time", True),
    Metric("first_call_s", "first call", "s", False),
    Metric("setup_s", "load, export, compile", "s", False),
]


def _speech_notes(cell: dict) -> str:
    parts = [_failure(cell)]
    if "same_tokens" in cell:
        parts.append("tokens equal transformers'" if cell["same_tokens"] else "tokens differ")
    vs = cell.get("vs") if isinstance(cell.get("vs"), dict) else {}
    ratios = [f"{base} {r:.2f}×" for base, r in vs.items() if _number(r)]
    if ratios:
        parts.append("speed vs " + ", ".join(ratios))
    return "; ".join(p for p in parts if p)


def speech_rows(data: dict, path: Path, entry_for) -> list[BenchRow]:
    """bench/whisper.py: results[method] -> figures, tokens compared, or error."""
    model = str(data.get("model"))
    audio = _dict(data.get("audio", {}), path)
    seconds = audio.get("seconds")
    config = f"{seconds:.1f} s clip" if _number(seconds) else "one clip"
    if _number(data.get("new_tokens")):
        config += f", {data['new_tokens']} tokens"
    weights = weights_of(str(data.get("checkpoint", "")))
    rows = []
    for method, cell in _dict(data["results"], path).items():
        cell = _dict(cell, path)
        figures = _figures(cell, SPEECH_METRICS)
        rows.append(BenchRow(model, entry_for(model), weights, method, config, figures,
                             _speech_notes(cell), not _failure(cell), path.name))  # fmt: skip
    return rows
