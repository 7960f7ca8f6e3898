"""What each page shows, as plain data for the templates: the zoo cards, the matrix, one page
per model, the benchmark comparisons. Every figure comes from a record; an entry with none
says "not measured".
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from linnet.site.bench import Metric, Suite
from linnet.site.charts import bar_chart, best_index, fmt
from linnet.site.highlight import highlight
from linnet.site.matrix import RUNTIMES
from linnet.site.records import ParityRecord
from linnet.zoo import source_path


def model_file(name: str) -> str:
    """A model page's file name (entry names are file-safe: letters, digits, '.', '-')."""
    return f"models/{name}.html"


def parity_line(r: ParityRecord) -> str:
    verdict = "✓" if r.passed else "✕"
    return f"{r.weights} {r.backend} {r.dtype}: max|Δ| {r.max_abs:.2e}, rel {r.rel:.2e} {verdict}"


def card(entry, cells: dict, parity: list[ParityRecord]) -> dict:
    """One zoo card: the entry's facts, where it ran (from the matrix), its parity figures."""
    ran = [rt.label for rt in RUNTIMES if cells[rt.key].state in ("ran", "some")]
    failed = [rt.label for rt in RUNTIMES if cells[rt.key].state == "failed"]
    mine = [r for r in parity if r.entry == entry.name]
    return {
        "entry": entry,
        "href": model_file(entry.name),
        "ran": ran,
        "failed": failed,
        "parity": [parity_line(r) for r in mine],
    }


def commands(entry) -> list[tuple[str, str]]:
    """(what, command) to pull, run, export and verify an entry, by what its map offers."""
    name = shlex.quote(entry.name)
    out = [("pull (planned first, then verified)", f"linnet zoo pull {name}")]
    if entry.kind == "decoder":
        out.append(("run (greedy, streamed)", f'linnet run {name} --prompt "Say hello."'))
    out.append(("export to HF safetensors", f"linnet export hf {name} --out {entry.name}-hf"))
    if entry.weights_map().gguf is not None:
        out.append(("export to GGUF", f"linnet export gguf {name} --out {entry.name}.gguf"))
    if "onnx" in entry.backends:
        out.append(("export to ONNX", f"linnet export onnx {name} --out {entry.name}-onnx"))
    for backend in entry.backends:
        for dtype in entry.tolerances.get(backend, {}):
            out.append((f"verify on {backend} {dtype}",
                        f"linnet parity {name} --backend {backend} --dtype {dtype}"))  # fmt: skip
    return out


def sources(entry) -> dict:
    """The entry's .linnet source and weights map, highlighted (ready entries only)."""
    if not entry.ready:
        return {}
    wmap = entry.weights_map()
    source = source_path(wmap.source)
    return {
        "source_name": f"zoo/{source.name}",
        "source": highlight(source.read_text(encoding="utf-8"), "linnet"),
        "map_name": f"weights_maps/{wmap.path.name}",
        "map": highlight(wmap.path.read_text(encoding="utf-8"), "toml"),
    }


def model_page(entry, cells: dict, parity: list[ParityRecord], suites: list[Suite]) -> dict:
    mine = [r for r in parity if r.entry == entry.name]
    rows = [(s, r) for s in suites for r in s.rows if r.entry == entry.name]
    return {
        "entry": entry,
        "cells": [(rt, cells[rt.key]) for rt in RUNTIMES],
        "parity": mine,
        "plans": [(r, highlight(r.plan, "")) for r in mine if r.plan],
        "samples": [(r, s) for r in mine for s in r.samples],
        "bench": rows,
        "commands": commands(entry) if entry.ready else [],
        **sources(entry),
    }


@dataclass
class Card:
    model: str
    weights: str
    chart: str
    best: str
    faster: str  # the best Linnet method against the best baseline, when both are there


def _versus(bars: list[tuple[str, float]], higher: bool) -> str:
    """Which side is faster: Linnet's best bar or the best of the others."""
    ours = [b for b in bars if b[0].startswith(("linnet", "jax"))]
    theirs = [b for b in bars if not b[0].startswith(("linnet", "jax"))]
    if not ours or not theirs:
        return ""
    a = ours[best_index([v for _, v in ours], higher)]
    b = theirs[best_index([v for _, v in theirs], higher)]
    ratio = a[1] / b[1] if higher else b[1] / a[1]
    side = "Linnet" if ratio >= 1 else b[0]
    return f"faster: {side} ({a[0]} {fmt(a[1])} vs {b[0]} {fmt(b[1])}, {fmt(ratio)}×)"


def cards(suite: Suite, metric: Metric, config: str) -> list[Card]:
    """One card per model: the methods' bars for one metric and configuration."""
    out = []
    for model in suite.models():
        rows = [r for r in suite.rows if r.model == model and r.config == config]
        bars = [(r.method, r.figures[metric.key]) for r in rows if metric.key in r.figures]
        if not bars:
            continue
        title = f"{model}, {metric.label}, {config}"
        chart = bar_chart(title, bars, unit=metric.unit, higher_is_better=metric.higher_is_better)
        best = bars[best_index([v for _, v in bars], metric.higher_is_better)][0]
        out.append(
            Card(model, rows[0].weights, chart, best, _versus(bars, metric.higher_is_better))
        )
    return out


def comparisons(suite: Suite) -> list[dict]:
    """Each compared metric in each configuration, as a list of model cards."""
    out = []
    for metric in suite.comparisons:
        for config in suite.configs():
            found = cards(suite, metric, config)
            if found:
                direction = "higher" if metric.higher_is_better else "lower"
                title = f"{metric.label}, {config} ({metric.unit}, {direction} is better)"
                slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{metric.key}-{config}")
                out.append({"title": title, "id": slug, "cards": found})
    return out


def bench_table(suite: Suite) -> dict:
    """Every row, with a column per metric that any row has."""
    metrics = [m for m in suite.metrics if any(m.key in r.figures for r in suite.rows)]
    rows = [
        {"row": r, "cells": [fmt(r.figures[m.key]) if m.key in r.figures else "–" for m in metrics]}
        for r in suite.rows
    ]
    return {"metrics": metrics, "rows": rows}
