"""Decoders: the last-position logits of Linnet's decode entry (the path `generate` takes)
against transformers' forward, per prompt.

    figures = measure_decoder(model, reference, ids, tolerance, "Say hello.")

Four figures: the same first greedy token (yes/no), max |Δ|, relative error
‖Δ‖₂ / ‖ref‖₂, and the overlap of the two top-5 sets.
"""

from __future__ import annotations

from linnet.errors import LinnetError
from linnet.parity.compare import beyond, nonfinite
from linnet.parity.report import PromptFigures
from linnet.zoo.registry import Tolerance


def measure_decoder(model, reference, ids, tolerance: Tolerance, label: str) -> PromptFigures:
    """Figures for one prompt: Linnet's decode (a fresh cache) against transformers' forward."""
    import numpy as np
    import torch

    model.reset()
    got = torch.tensor(np.asarray(model.decode(ids, 0))[0]).float().to(ids.device)
    with torch.no_grad():
        want = reference(input_ids=ids.to(reference.device)).logits[0, -1].float().to(got.device)
    if got.shape != want.shape:
        raise LinnetError(
            f"Linnet's logits have shape {tuple(got.shape)}, transformers' {tuple(want.shape)}"
        )
    delta = got - want
    top5 = len(set(got.topk(5).indices.tolist()) & set(want.topk(5).indices.tolist()))
    f = PromptFigures(
        prompt=label,
        tokens=int(ids.shape[-1]),
        linnet_token=int(got.argmax()),
        reference_token=int(want.argmax()),
        same_token=int(got.argmax()) == int(want.argmax()),
        max_abs=float(delta.abs().max()),
        rel=float(delta.norm() / want.norm().clamp_min(1e-30)),
        top5=top5,
    )
    return judge_decoder(f, tolerance, nonfinite(got, want))


def judge_decoder(f: PromptFigures, tolerance: Tolerance, problems=()) -> PromptFigures:
    """Set f.passed and f.why: no `problems` (non-finite logits), the same first token, max
    |Δ| and rel within the tolerance (NaN fails), at least the tolerance's top-5 overlap."""
    why = list(problems)
    if not f.same_token:
        why.append("first token differs")
    why += beyond(f.max_abs, f.rel, tolerance)
    if f.top5 < tolerance.top5:
        why.append(f"top-5 {f.top5}/5 < {tolerance.top5}")
    f.passed, f.why = not why, "; ".join(why)
    return f
