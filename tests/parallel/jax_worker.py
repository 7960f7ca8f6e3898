"""Run in a process of its own with XLA_FLAGS=--xla_force_host_platform_device_count=2
(tests/parallel/test_jax_tp.py): each checkpoint on one device and over a two-device mesh.

    python jax_worker.py OUT.json CKPT...
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import linnet.jax
from linnet.errors import LinnetError

IDS = np.array([[3, 7, 11, 19, 23, 5, 9, 2, 31, 40], [1, 4, 9, 16, 25, 36, 49, 64, 81, 100]])


def one_checkpoint(ck: str, mesh) -> dict:
    one = linnet.jax.load(ck, dtype="f32")
    two = linnet.jax.load(ck, dtype="f32", mesh=mesh)
    want, got = np.asarray(one.forward(IDS)), np.asarray(two.forward(IDS))
    hlo = two.runner.jitted["forward"].lower(two.params, jnp.asarray(IDS, jnp.int32))
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
        "tokens_one": np.asarray(one.generate(IDS, 6)).tolist(),
        "tokens_two": np.asarray(two.generate(IDS, 6)).tolist(),
        "all_reduce_in_hlo": "all-reduce" in hlo.compile().as_text(),
        "shards": shards,
        "state_specs": {k: str(v.sharding.spec) for k, v in two.state.items()},
    }


def main() -> int:
    out, cks = sys.argv[1], sys.argv[2:]
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("tp",))
    report = {"devices": len(jax.devices()), "runs": {}}
    for ck in cks:
        report["runs"][ck] = one_checkpoint(ck, mesh)
    try:
        linnet.jax.load(cks[0], dtype="f32", mesh=jax.make_mesh((2,), ("x",)))
    except LinnetError as e:
        report["no_tp_axis"] = str(e)
    with open(out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
