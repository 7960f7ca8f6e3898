"""How a value is laid out over the tensor-parallel ranks.

A value is whole on every rank (`None`: replicated) or split along one axis into
`parts` equal blocks (`Split`), and `span` says which blocks a rank holds: with
`parts == world` each rank its own block; with fewer parts (KV heads fewer than ranks)
`world // parts` neighbouring ranks share one block, as vLLM replicates KV heads; with more
parts than ranks (a block is one KV group: SmolLM2's 3 over 2 ranks) each rank a run of
neighbouring blocks, the first ranks one more when `world` does not divide `parts`.
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


def span(parts: int, rank: int, world: int) -> tuple[int, int]:
    """The blocks [lo, hi) of a `parts`-way split that `rank` of `world` holds."""
    if parts < world:  # one block shared by `world // parts` ranks
        b = rank * parts // world
        return b, b + 1
    return -(-rank * parts // world), -(-(rank + 1) * parts // world)  # ceil: 3 over 2 = 2 + 1


def local_range(size: int, lay: Split, rank: int, world: int) -> tuple[int, int]:
    """The [start, stop) of an axis of `size` that `rank` holds under `lay`."""
    lo, hi = span(lay.parts, rank, world)
    unit = size // lay.parts
    return lo * unit, hi * unit


def is_uneven(lay: Split | None, world: int) -> bool:
    """Ranks hold different amounts of it (more blocks than ranks, not a multiple)."""
    return lay is not None and lay.parts > world and lay.parts % world != 0


def seeds_of(*layouts) -> frozenset:
    out: frozenset = frozenset()
    for lay in layouts:
        if lay is not None:
            out |= lay.seeds
    return out
