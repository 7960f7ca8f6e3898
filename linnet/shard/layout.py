"""How a value is laid out over the tensor-parallel ranks.

A value is whole on every rank (`None`: replicated) or split along one axis into
`parts` equal blocks (`Split`). Rank r holds block `r * parts // world`: with
`parts == world` each rank its own block; with fewer parts (KV heads fewer than ranks)
`world // parts` neighbouring ranks share one block, as vLLM replicates KV heads.
`seeds` names the column-parallel linears (by weight param) the split comes from, so a
conflict downstream can turn exactly those back to replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from linnet.errors import LinnetError


class ShardingError(LinnetError):
    """A model or config that cannot be split over the requested ranks."""


@dataclass(frozen=True)
class Split:
    axis: int
    parts: int
    seeds: frozenset = field(default=frozenset(), compare=False)

    def moved(self, axis: int) -> Split:
        return Split(axis, self.parts, self.seeds)

    def same(self, other: Split | None) -> bool:
        return other is not None and (self.axis, self.parts) == (other.axis, other.parts)


def block(parts: int, rank: int, world: int) -> int:
    """The block of a `parts`-way split that `rank` of `world` holds."""
    return rank * parts // world


def seeds_of(*layouts) -> frozenset:
    out: frozenset = frozenset()
    for lay in layouts:
        if lay is not None:
            out |= lay.seeds
    return out
