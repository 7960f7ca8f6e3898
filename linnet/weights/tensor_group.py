"""`TensorGroup`: one checkpoint tensor and the params it holds, the one type that a load
plan's rows and a weights stream's groups both are.

    plan = make_plan(checkpoint, weights_map, params)    # plan.rows: TensorGroups
    [g.hf for g in plan.rows if g.loads]                 # the tensors that load
    g.rule.forward(tensor, g.sizes)                      # -> the params g.params

A planned row may carry a `note` ("ignored", "tied duplicate, ignored", or the kind of
problem); a group of a `Weights` stream also says where its data is (`key`, `source`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from linnet.weights.maps import Rule
from linnet.weights.maps.rules import concat_shape


@dataclass
class TensorGroup:
    """One tensor of a checkpoint (HF or GGUF) and what becomes of it."""

    hf: str  # the HF tensor name (as the checkpoint names it, prefix or not)
    shape: tuple[int, ...] = ()  # the stored tensor's shape
    dtype: str = ""  # the stored dtype as its format spells it ("F32", "BF16", "Q4_1")
    transform: str = ""  # the rule's transform chain, for the plan's table
    params: tuple[str, ...] = ()
    note: str = ""  # "ignored", "tied duplicate, ignored", or a problem
    rule: Rule | None = field(default=None, repr=False)
    bindings: dict[str, str] = field(default_factory=dict, repr=False)
    shapes: tuple[tuple[int, ...], ...] = field(default=(), repr=False)  # the params' shapes
    key: Any = field(default=None, repr=False)  # how the origin finds the data
    read_dtype: str = "f32"  # what a stream's `read` returns: f32, f16 or bf16
    source: Any = field(default=None, repr=False)  # a folder's TensorInfo, as stored

    @property
    def loads(self) -> bool:
        return self.rule is not None and not self.note

    @property
    def hf_name(self) -> str:
        return self.hf

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return self.rule.hf_shape(list(self.shapes))

    @property
    def joined_shape(self) -> tuple[int, ...]:
        """The shape of the params concatenated along the split axis (the GGUF tensor)."""
        if self.rule.split_axis is None:
            return self.shapes[0]
        return concat_shape(list(self.shapes), self.rule.split_axis)

    @property
    def sizes(self) -> list[int] | None:
        """The split's part sizes (None for a rule without a split)."""
        if self.rule is None or self.rule.split_axis is None or not self.shapes:
            return None
        return [s[self.rule.split_axis] for s in self.shapes]

    @property
    def numel(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes)

    @property
    def layer(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.bindings.values())
