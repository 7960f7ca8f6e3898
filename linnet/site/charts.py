"""Charts as inline SVG, made here (no JavaScript): horizontal bars on the chart's own scale,
the best bar marked. Every chart has a <title> and an aria-label (its text alternative), and
every bar a <title> (its hover note).

    svg = bar_chart("decode, f32 (tokens/s)", [("linnet/generated/fast", 31.2), ...],
                    higher_is_better=True)
"""

from __future__ import annotations

from markupsafe import Markup, escape

WIDTH = 640
LABEL_W = 230
VALUE_W = 120
ROW_H = 22
TOP = 8


def fmt(value: float) -> str:
    """A figure with three significant digits, plain up to 10^5."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2e}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def best_index(values: list[float], higher_is_better: bool) -> int:
    pick = max if higher_is_better else min
    return values.index(pick(values))


def _bar(i: int, label: str, value: float, scale: float, best: bool, unit: str) -> str:
    y = TOP + i * ROW_H
    w = max(1.0, (WIDTH - LABEL_W - VALUE_W) * value / scale) if scale > 0 else 1.0
    mark = " ★ best" if best else ""
    text = f"{label}: {fmt(value)} {unit}{mark}".strip()
    cls = "bar best" if best else "bar"
    return (
        f'<g class="{cls}"><title>{escape(text)}</title>'
        f'<text x="{LABEL_W - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>'
        f'<rect x="{LABEL_W}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}" rx="2"/>'
        f'<text x="{LABEL_W + w + 4:.1f}" y="{y + 15}">{escape(fmt(value))}{escape(mark)}</text>'
        "</g>"
    )


def bar_chart(
    title: str, bars: list[tuple[str, float]], *, unit: str = "", higher_is_better: bool = True
) -> Markup:
    """One bar per (label, value), scaled to this chart's largest value; the best one (the
    largest when higher is better, else the smallest) is marked ★."""
    if not bars:
        return Markup("")
    values = [v for _, v in bars]
    best = best_index(values, higher_is_better)
    scale = max(values)
    height = TOP * 2 + ROW_H * len(bars)
    direction = "higher is better" if higher_is_better else "lower is better"
    summary = ", ".join(f"{label} {fmt(v)}" for label, v in bars)
    alt = f"{title} ({unit}, {direction}): {summary}; best {bars[best][0]}"
    rows = "".join(_bar(i, label, v, scale, i == best, unit) for i, (label, v) in enumerate(bars))
    return Markup(
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'aria-label="{escape(alt)}"><title>{escape(alt)}</title>{rows}</svg>'
    )
