"""Run in a process of its own with XLA_FLAGS=--xla_force_host_platform_device_count=N
(tests/parallel/test_jax_tp.py): each checkpoint on one device and over a mesh of the first
WORLD devices; with N > WORLD a mesh of all N devices is tried on the first checkpoint
(heads that do not divide N must be refused).

    python jax_worker.py OUT.json WORLD CKPT... [--positions N --ids JSON --new N --parity-only]

--positions: the KV cache's length (SmolLM2's default 4096 made six greedy tokens cost 110 s
of compiling and running per model on two cores); --ids, --new: the prompt and the number
of greedy tokens; --parity-only: skip the serving rows and the refused meshes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import linnet.jax
from linnet.errors import LinnetError
from linnet.shard.jax_rows import load_on_mesh

IDS = np.array([[3, 7, 11, 19, 23, 5, 9, 2, 31, 40], [1, 4, 9, 16, 25, 36, 49, 64, 81, 100]])


def one_checkpoint(ck: str, mesh, ids=IDS, new: int = 6, positions=None) -> dict:
    one = linnet.jax.load(ck, dtype="f32", max_positions=positions)
    two = linnet.jax.load(ck, dtype="f32", mesh=mesh, max_positions=positions)
    want, got = np.asarray(one.forward(ids)), np.asarray(two.forward(ids))
    hlo = two.runner.jitted["forward"].lower(two.params, jnp.asarray(ids, jnp.int32))
    shards = {}
    for name in two.shard_plan.params:
        node = two.params
        for part in name.split("."):
            node = node[int(part)] if part.isdigit() else node[part]
        shards[name] = [list(s.data.shape) for s in node.addressable_shards]
    return {
        "max_abs_diff": float(np.abs(got - want).max()),
        "max_abs_logit": float(np.abs(want).max()),
        "finite": bool(np.isfinite(got).all()),
        "tokens_one": np.asarray(one.generate(ids, new)).tolist(),
        "tokens_two": np.asarray(two.generate(ids, new)).tolist(),
        "all_reduce_in_hlo": "all-reduce" in hlo.compile().as_text(),
        "shards": shards,
        "state_specs": {k: str(v.sharding.spec) for k, v in two.state.items()},
    }


def rows_on_mesh(ck: str, world: int) -> dict:
    """The serving rows (linnet/shard/jax_rows.py) over the mesh against one device's rows:
    three prompts prefilled into rows 0-2, then four steps of all three."""
    one = linnet.jax.load(ck, dtype="f32", max_positions=64).rows(3)
    sharded = load_on_mesh(ck, world, dtype="f32", max_positions=64).rows(3)
    at_start = {k: str(getattr(v.sharding, "spec", v.sharding)) for k, v in sharded.state.items()}
    diffs, largest = [], 0.0
    prompts = [IDS[0, :7].tolist(), IDS[1, :3].tolist(), IDS[0, 2:].tolist()]
    for rows in (one, sharded):
        rows.logits = [np.asarray(rows.prefill(r, p)) for r, p in enumerate(prompts)]
        for step in range(4):
            rows.logits.append(np.asarray(rows.step([0, 1, 2], [5 + step, 9, 40 + step])))
    for want, got in zip(one.logits, sharded.logits, strict=True):
        diffs.append(float(np.abs(got - want).max()))
        largest = max(largest, float(np.abs(want).max()))
    return {
        "max_abs_diff": max(diffs),
        "max_abs_logit": largest,
        "state_specs": {k: str(v.sharding.spec) for k, v in sharded.state.items()},
        "state_specs_at_start": at_start,
    }


def refusals(ck: str, world: int) -> dict:
    """What bad meshes end with: the message of the error each raises."""
    said = {}
    attempts = {
        "no_tp_axis": lambda: linnet.jax.load(ck, dtype="f32", mesh=jax.make_mesh((2,), ("x",))),
        "too_few_devices": lambda: load_on_mesh(ck, len(jax.devices()) + 2, dtype="f32"),
    }
    if len(jax.devices()) > world:  # every device: heads that do not divide must be refused
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("tp",))
        attempts["heads_not_divisible"] = lambda: linnet.jax.load(ck, dtype="f32", mesh=mesh)
    for what, attempt in attempts.items():
        try:
            attempt()
            said[what] = None
        except LinnetError as e:
            said[what] = f"{type(e).__name__}: {e}"
    return said


def main() -> int:
    cli = argparse.ArgumentParser()
    cli.add_argument("out")
    cli.add_argument("world", type=int)
    cli.add_argument("cks", nargs="+")
    cli.add_argument("--positions", type=int)
    cli.add_argument("--ids", type=json.loads, default=IDS)
    cli.add_argument("--new", type=int, default=6)
    cli.add_argument("--parity-only", action="store_true")
    a = cli.parse_args()
    out, world, cks, ids = a.out, a.world, a.cks, np.asarray(a.ids)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:world]), ("tp",))
    report = {"devices": len(jax.devices()), "world": world, "runs": {}}
    seconds = report["seconds"] = {}  # where a test's time goes
    for ck in cks:
        start = time.perf_counter()
        report["runs"][ck] = one_checkpoint(ck, mesh, ids, a.new, a.positions)
        seconds[ck] = time.perf_counter() - start
    if not a.parity_only:
        start = time.perf_counter()
        if "decode_rows" in linnet.jax.load(cks[0], dtype="f32", max_positions=8).entries:
            report["rows"] = rows_on_mesh(cks[0], world)
        report["refused"] = refusals(cks[0], world)
        seconds["rows and refusals"] = time.perf_counter() - start
    with open(out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
