"""Tensor parallel on JAX: the whole program, params and cache placed with `NamedSharding`
over a mesh axis, and XLA's SPMD partitioner inserts the collectives (issue 19).

    mesh = jax.make_mesh((2,), ("tp",))
    model = linnet.jax.load(path, mesh=mesh)

The plan is the one PyTorch uses (`analysis.py`, from the Core IR): a param or state split
in as many blocks as the mesh axis has devices is sharded along that axis; the rest (and
KV heads fewer than devices) are replicated. The generated code is unchanged: jit follows
its inputs' shardings.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from linnet.shard.analysis import ShardPlan, derive_plan
from linnet.shard.layout import ShardingError, Split

AXIS = "tp"


def _spec(lay: Split | None, rank: int, world: int) -> PartitionSpec:
    if lay is None or lay.parts != world:
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
