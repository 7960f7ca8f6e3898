"""What a parity run measured: figures per prompt or output, and the report around them.

    report = run_gate(folder, entry=entry)     # linnet.parity.gate
    report.passed                              # every row within the tolerance
    [f.why for f in report.figures if not f.passed]

Decoders give one `PromptFigures` per prompt; encoders and vision models one
`OutputFigures` per input and output (linnet.parity.compare judges those).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field

from linnet.zoo.registry import Tolerance


@dataclass
class PromptFigures:
    """Decoders: Linnet's last-position logits against transformers' for one prompt."""

    prompt: str
    tokens: int
    linnet_token: int
    reference_token: int
    same_token: bool
    max_abs: float
    rel: float
    top5: int
    passed: bool = False
    why: str = ""


@dataclass
class OutputFigures:
    """Encoders and vision: one output of Linnet against transformers' for one input."""

    prompt: str  # the sentence, or the pixels ("random pixels [2, 3, 224, 224], seed 0")
    output: str  # the entry: embed, forward, pool, classify
    tokens: int  # encoders: the sentence's real tokens; vision: 0
    max_abs: float
    rel: float
    cosine: float | None = None  # embed: least cosine similarity over the rows
    top1: int | None = None  # classify: rows whose top-1 class agrees (of `rows`)
    rows: int = 1
    passed: bool = False
    why: str = ""


@dataclass
class Report:
    entry: str | None
    checkpoint: str
    backend: str
    dtype: str
    device: str
    tolerance: Tolerance
    figures: list[PromptFigures] | list[OutputFigures]
    weights: str = "real"  # or "tiny-random"
    kind: str = "decoder"  # or "encoder", "vision"
    repo: str | None = None
    revision: str | None = None
    commit: str | None = None
    seconds: float = 0.0
    versions: dict = field(default_factory=dict)
    date: str = ""
    samples: list[str] = field(default_factory=list)  # Linnet's greedy text per prompt
    plan: str | None = None  # `linnet plan` text of the checkpoint
    mode: str | None = None  # PyTorch's mode when not the default (interpret)

    @property
    def passed(self) -> bool:
        return bool(self.figures) and all(f.passed for f in self.figures)


def versions() -> dict:
    """The versions a record names: Linnet, torch, transformers, Python, huggingface_hub."""
    import torch
    import transformers

    import linnet

    out = {
        "linnet": getattr(linnet, "__version__", "?"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    try:
        import huggingface_hub

        out["huggingface_hub"] = huggingface_hub.__version__
    except ImportError:  # pragma: no cover
        pass
    return out
