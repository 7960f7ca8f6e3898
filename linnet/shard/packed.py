"""Packed dtypes (q8_0, q4_0, q4_k) under tensor parallel (issue 19): each rank quantizes
its own dense blocks after reading them.

ggml packs a weight row by row in blocks along the input axis (32 values for q8_0/q4_0,
256 for q4_k). A column-parallel split takes whole rows, so a rank's rows quantize to the
very blocks of the whole weight; a row-parallel split cuts each row, which gives the same
blocks only when every rank's part of a row is a whole number of blocks. Otherwise the
split would quantize differently from one device (or leave the part float), so it is
refused before anything is read.
"""

from __future__ import annotations

from linnet.shard.layout import ShardingError, Split, local_range
from linnet.weights.gguf_packed import BLOCK


def check_blocks(program, layouts: dict[str, Split | None], kind: str, world=None) -> None:
    """Refuse a row-parallel split that cuts `kind`'s blocks on any of `world` ranks
    (default: as many ranks as blocks)."""
    for name, lay in layouts.items():
        typ = program.params.get(name)  # a TensorType
        if lay is None or typ is None or len(typ.shape) != 2 or lay.axis != 1:
            continue
        cols = typ.shape[1]
        cols = getattr(cols, "value", cols)
        if not isinstance(cols, int) or cols % BLOCK[kind]:
            continue
        n = world or lay.parts
        per_rank = sorted({hi - lo for lo, hi in (local_range(cols, lay, r, n) for r in range(n))})
        if any(c % BLOCK[kind] for c in per_rank):
            raise ShardingError(
                f"{kind} packs {BLOCK[kind]} values per block along a weight's input axis; "
                f"{name}'s {cols} columns over {n} ranks are "
                f"{' or '.join(map(str, per_rank))} per rank, which cuts blocks: use fewer "
                f"ranks or a dtype with smaller blocks (q8_0, q4_0: 32)"
            )
