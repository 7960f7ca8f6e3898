"""`linnet serve --backend jax --tensor-parallel N`: one process, the model over a mesh of N
JAX devices (issue 19). No torchrun and no mirrored calls: the scheduler drives ordinary
rows, jit runs each step over the mesh and XLA issues the collectives.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        linnet serve CHECKPOINT --backend jax --tensor-parallel 2

`load_on_mesh` loads with `linnet.jax.load(..., mesh=)`; the model's rows (the row decoder's
cache, allocated whole by `linnet/rows.py`) are placed with the plan's shardings, so the
cache rows are split on their KV heads as the single-sequence cache is.
"""

from __future__ import annotations

import sys

import jax
import numpy as np

from linnet.shard.layout import ShardingError


def tp_mesh(world: int):
    """A mesh with axis "tp" over the first `world` JAX devices."""
    devices = jax.devices()
    if len(devices) < world:
        raise ShardingError(
            f"tensor parallel {world} on JAX needs {world} devices, found {len(devices)} "
            f"({devices[0].platform}); on CPU start the process with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={world}"
        )
    return jax.sharding.Mesh(np.array(devices[:world]), ("tp",))


def load_on_mesh(checkpoint, world: int, *, dtype=None, max_positions=None):
    """`linnet.jax.load` over `tp_mesh(world)`, its rows sharded like its cache."""
    import linnet.jax

    model = linnet.jax.load(
        checkpoint, dtype=dtype, max_positions=max_positions, mesh=tp_mesh(world)
    )
    shard_rows_of(model)
    split = sum(1 for lay in model.shard_plan.params.values() if lay is not None)
    print(
        f"linnet: tensor parallel {world} over {world} {jax.devices()[0].platform} devices "
        f"(mesh axis 'tp'; {split} of {len(model.shard_plan.params)} params split)",
        file=sys.stderr,
    )
    return model


def shard_rows_of(model) -> None:
    """Make `model.rows(...)` place each state of the rows it returns with the model's
    state shardings (an attribute of this model: `linnet/rows.py` stays unaware)."""
    plain = model.rows

    def rows(count: int, positions: int | None = None):
        made = plain(count, positions)
        place_row_state(made, model.state_shardings)
        return made

    model.rows = rows


def place_row_state(rows, shardings: dict) -> None:
    """Each of the rows' states on the mesh with its sharding (the row axis stays whole)."""
    for name, value in rows.state.items():
        if name in shardings:
            rows.state[name] = jax.device_put(value, shardings[name])
