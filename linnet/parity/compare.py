"""Two outputs of the same shape, Linnet's and transformers', as `OutputFigures` with a
verdict: max |Δ|, relative error ‖Δ‖₂ / ‖ref‖₂, and where measured cosine and top-1.

    f = compare(got, want, "A man is eating food.", "embed", tolerance, tokens=7)
    f.passed, f.why
"""

from __future__ import annotations

from linnet.errors import LinnetError
from linnet.parity.report import OutputFigures
from linnet.zoo.registry import Tolerance

#: What `top1` counts, by output (else a classifier's top-1 class).
DIFFERS = {
    "greedy": "the greedy tokens' sequence",
    "first": "the first token",
    "logits": "the best text for an image",
}


def nonfinite(got, want) -> list[str]:
    """What is not a number in two torch tensors, said plainly (NaN also fails the bounds, but
    "max|Δ| nan" alone does not say whose output broke)."""
    out = []
    for side, t in (("Linnet's", got), ("transformers'", want)):
        bad = int((~t.isfinite()).sum())
        if bad:
            out.append(f"{side} output has {bad} NaN/inf of {t.numel()} values")
    return out


def beyond(max_abs: float, rel: float, tolerance: Tolerance) -> list[str]:
    """max |Δ| and rel past the tolerance, said plainly; NaN fails (it is within nothing)."""
    out = []
    for name, value, limit in (("max|Δ|", max_abs, tolerance.max_abs), ("rel", rel, tolerance.rel)):
        if not value <= limit:
            out.append(f"{name} is NaN" if value != value else f"{name} {value:.3g} > {limit:g}")
    return out


def judge(f: OutputFigures, tolerance: Tolerance, problems=()) -> OutputFigures:
    """Set f.passed and f.why: no `problems` (non-finite outputs), max |Δ| and rel within the
    tolerance (NaN fails), the cosine (where measured) at least the tolerance's, every row's
    top-1 class the same."""
    why = list(problems) + beyond(f.max_abs, f.rel, tolerance)
    if f.cosine is not None and not f.cosine >= tolerance.cosine:
        why.append("cosine is NaN" if f.cosine != f.cosine else
                   f"cosine {f.cosine:.8f} < {tolerance.cosine:g}")  # fmt: skip
    if f.top1 is not None and f.top1 < f.rows:
        why.append(f"{DIFFERS.get(f.output, 'top-1 class')} differs in "
                   f"{f.rows - f.top1} of {f.rows} rows")  # fmt: skip
    f.passed, f.why = not why, "; ".join(why)
    return f


def compare(got, want, label: str, output: str, tolerance: Tolerance, **extra) -> OutputFigures:
    """Figures of two tensors of the same shape (any backend's output as `got`)."""
    import numpy as np
    import torch

    got = torch.tensor(np.asarray(got)).float()
    want = want.detach().float().cpu()
    if tuple(got.shape) != tuple(want.shape):
        raise LinnetError(
            f"`{output}` gives {tuple(got.shape)}, transformers {tuple(want.shape)}: "
            "the source and the reference disagree on the output's shape"
        )
    delta = got - want
    rel = float(delta.norm() / want.norm().clamp_min(1e-30))
    f = OutputFigures(label, output, max_abs=float(delta.abs().max()), rel=rel, **extra)
    return judge(f, tolerance, nonfinite(got, want))
