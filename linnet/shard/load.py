"""Each rank reads only its blocks of a checkpoint (issue 19).

    params = rank_params(plan, shard, rank, torch_dtype)

A tensor that maps to one param with no transform is read as a slice straight from the
file (`safe_open(...).get_slice`: the safetensors header gives the byte ranges, only the
rows or columns of this rank's block are copied out of the memory map). A tensor that needs
a transform or splits into several params (GPT-2's transposed Conv1D, Phi-3's fused qkv) is
read whole, transformed, and cut; only the blocks are kept, so peak memory is one tensor
above the rank's share. Whole params are read whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from linnet.shard.layout import Split, local_range
from linnet.weights.plan import Plan


def _index(shape: tuple[int, ...], lay: Split, rank: int, world: int) -> tuple:
    lo, hi = local_range(shape[lay.axis], lay, rank, world)
    return tuple(slice(lo, hi) if a == lay.axis else slice(None) for a in range(len(shape)))


def _read_slice(plan: Plan, name: str, index: tuple):
    from safetensors import safe_open

    info = plan.checkpoint.headers()[name]
    with safe_open(str(info.file), framework="pt") as f:
        return f.get_slice(name)[index]


def rank_params(
    plan: Plan, layouts: dict[str, Split | None], rank: int, world: int, torch_dtype: Any
) -> Iterator[tuple[str, Any]]:
    """(param, tensor) pairs of `rank`'s share, cast to `torch_dtype`, one checkpoint
    tensor at a time."""
    plan.check()
    for row in plan.rows:
        if not row.loads:
            continue
        lays = [layouts.get(p) for p in row.params]
        direct = len(row.params) == 1 and not row.rule.transforms and row.rule.split_axis is None
        if lays[0] is not None and direct and row.hf not in plan.checkpoint.packed:
            x = _read_slice(plan, row.hf, _index(row.shape, lays[0], rank, world))
            yield row.params[0], x.to(torch_dtype).contiguous()
            continue
        parts = row.rule.forward(plan.checkpoint.read(row.hf), row.sizes)
        for name, part, lay in zip(row.params, parts, lays, strict=True):
            if lay is not None:
                part = part[_index(tuple(part.shape), lay, rank, world)]
            yield name, part.to(torch_dtype).contiguous()
        del parts
