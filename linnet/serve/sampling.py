"""Next-token choice for one request: greedy at temperature 0, else a draw from the tempered
distribution cut to its top-k and its top-p nucleus, from the request's own generator (so a
seeded request draws the same tokens whatever else is in flight)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # (0, 1]: the smallest set of tokens holding this much probability
    top_k: int = 0  # 0 (or -1): no cut
    seed: int | None = None


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        seed = None if params.seed is None else params.seed % 2**64
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        """One token id from f32 logits [vocab]."""
        p = self.params
        if p.temperature == 0:
            return int(np.argmax(logits))
        probs = _softmax(np.asarray(logits, dtype=np.float64) / p.temperature)
        order = np.argsort(-probs, kind="stable")
        if 0 < p.top_k < order.size:
            order = order[: p.top_k]
        kept = probs[order]
        if p.top_p < 1.0:
            # keep each token while the mass before it is under top_p (the first always)
            before = np.cumsum(kept) - kept
            order, kept = order[before < p.top_p], kept[before < p.top_p]
        kept = kept / kept.sum()
        return int(order[self.rng.choice(kept.size, p=kept)])


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max())
    return e / e.sum()
