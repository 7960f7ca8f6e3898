"""Tensor parallel on JAX: the whole program, params and cache placed with `NamedSharding`
over a mesh axis, and XLA's SPMD partitioner inserts the collectives (issue 19).

    mesh = jax.make_mesh((2,), ("tp",))
    model = linnet.jax.load(path, mesh=mesh)

The plan is the one PyTorch uses (`analysis.py`, from the Core IR): a param or state split
in as many blocks as the mesh axis has devices (or a multiple) is sharded along that axis;
the rest (and KV heads fewer than devices) are replicated. An uneven split (3 KV groups over
2 devices) is padded with zero blocks to a multiple first (`pad_uneven`). The generated code
is unchanged: jit follows its inputs' shardings.
"""

from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from linnet.shard.analysis import ShardPlan, derive_plan
from linnet.shard.layout import ShardingError, Split, is_uneven
from linnet.shard.rewrite import padded_parts, padded_program

AXIS = "tp"


def _spec(lay: Split | None, rank: int, world: int) -> PartitionSpec:
    if lay is None or lay.parts < world or lay.parts % world:
        return PartitionSpec()
    return PartitionSpec(*[AXIS if a == lay.axis else None for a in range(rank)])


def mesh_plan(program, mesh) -> ShardPlan:
    if AXIS not in mesh.shape:
        raise ShardingError(f"the mesh needs an axis named {AXIS!r}; it has {tuple(mesh.shape)}")
    if any("Explicit" in str(t) for t in getattr(mesh, "axis_types", ())):
        raise ShardingError(
            "the mesh's axes must be Auto (XLA places the collectives): "
            "jax.sharding.Mesh(devices, ('tp',)), or jax.make_mesh(..., axis_types=(Auto,))"
        )
    return derive_plan(program, mesh.shape[AXIS])


def pad_uneven(program, params: dict, plan: ShardPlan):
    """(program, params, plan) with each uneven split padded to a multiple of the mesh's
    blocks, so that `NamedSharding` splits it evenly: 3 KV groups over 2 devices become 4,
    the fourth a zero KV head, zero query heads and zero `wo` columns (an odd ffn: a zero
    row of gate/up, a zero column of down). A zero head attends to zero keys and values
    and gives zeros, which meet zero weight columns: the logits are the unpadded model's.
    Unchanged when nothing is uneven."""
    lays = {**plan.params, **plan.states}
    if not any(is_uneven(lay, plan.world) for lay in lays.values()):
        return program, params, plan
    padded = {}
    for name, x in params.items():
        lay = plan.params.get(name)
        if is_uneven(lay, plan.world):
            shape = list(x.shape)
            shape[lay.axis] = shape[lay.axis] // lay.parts * padded_parts(lay, plan.world)
            shape[lay.axis] -= x.shape[lay.axis]
            x = np.concatenate([x, np.zeros(shape, x.dtype)], axis=lay.axis)
        padded[name] = x
    even = {n: _even(lay, plan.world) for n, lay in plan.params.items()}
    states = {n: _even(lay, plan.world) for n, lay in plan.states.items()}
    return padded_program(plan), padded, replace(plan, params=even, states=states)


def _even(lay: Split | None, world: int) -> Split | None:
    return None if lay is None else Split(lay.axis, padded_parts(lay, world), lay.seeds)


def place_params(params: dict, plan: ShardPlan, mesh) -> dict:
    """Each param (flat name -> array) on the mesh with its sharding."""
    out = {}
    for name, x in params.items():
        spec = _spec(plan.params.get(name), x.ndim, plan.world)
        out[name] = jax.device_put(x, NamedSharding(mesh, spec))
    return out


def state_shardings(program, plan: ShardPlan, mesh) -> dict:
    """State name -> its NamedSharding (the cache split along its KV heads)."""
    ranks = {n: v.type.rank for g in program.graphs.values() for n, v in g.states.items()}
    return {
        name: NamedSharding(mesh, _spec(plan.states.get(name), rank, plan.world))
        for name, rank in ranks.items()
    }
