"""Two outputs of the same shape, Linnet's and transformers', as `OutputFigures` with a
verdict: max |Δ|, relative error ‖Δ‖₂ / ‖ref‖₂, and where measured cosine and top-1.

    f = compare(got, want, "A man is eating food.", "embed", tolerance, tokens=7)
    f.passed, f.why
"""

from __future__ import annotations

from linnet.errors import LinnetError
from linnet.parity.report import OutputFigures
from linnet.zoo.registry import Tolerance


def judge(f: OutputFigures, tolerance: Tolerance) -> OutputFigures:
    """Set f.passed and f.why: max |Δ| and rel within the tolerance (NaN fails), the cosine
    (where measured) at least the tolerance's, every row's top-1 class the same."""
    why = []
    if not f.max_abs <= tolerance.max_abs:
        why.append(f"max|Δ| {f.max_abs:.3g} > {tolerance.max_abs:g}")
    if not f.rel <= tolerance.rel:
        why.append(f"rel {f.rel:.3g} > {tolerance.rel:g}")
    if f.cosine is not None and not f.cosine >= tolerance.cosine:
        why.append(f"cosine {f.cosine:.8f} < {tolerance.cosine:g}")
    if f.top1 is not None and f.top1 < f.rows:
        why.append(f"top-1 class differs in {f.rows - f.top1} of {f.rows} rows")
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
    return judge(f, tolerance)
