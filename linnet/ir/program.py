"""A source lowered for one config: everything a backend needs, and nothing of the front end.

    program = Source.load("zoo/llama.linnet").program(config)
    program.graphs["decode"]     # the Core-IR graph of each entry, as lowered
    program.params               # {"layers.0.wq": TensorType, ...} (tied params left out)

Backends take a `Program` and never the source: lowering happens above them
(`linnet.source`), so a backend imports `linnet.ir` and `linnet.core` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from linnet.ir.graph import Graph
from linnet.ir.types import TensorType


@dataclass
class Program:
    name: str  # the source's name (generated classes and messages use it)
    config: dict
    graphs: dict[str, Graph]  # entry -> its lowered graph, in the source's order
    params: dict[str, TensorType]  # the params this config has
    tied: dict[str, str] = field(default_factory=dict)  # param -> the param it shares

    @property
    def entries(self) -> list[str]:
        return list(self.graphs)
