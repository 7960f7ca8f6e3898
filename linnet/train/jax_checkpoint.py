"""Checkpoints of a JAX run in the PyTorch trainer's layout (`linnet.train.loop`):
`OUT/checkpoint-STEP` holds the adapter (PEFT's format, the same files PyTorch writes),
`jax_optimizer.npz` (optax's state, its leaves in tree order) and `jax_trainer_state.json`
(step, losses, evaluations). Resuming rebuilds the optimizer state's tree from a fresh
`init` and fills it with the saved leaves, so no pickle is read."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from linnet.errors import LinnetError
from linnet.train.loop import latest_checkpoint

OPTIMIZER_FILE = "jax_optimizer.npz"
STATE_FILE = "jax_trainer_state.json"


def save_checkpoint(trainer, step: int) -> Path:
    folder = Path(trainer.config.out) / f"checkpoint-{step}"
    trainer.model.save_adapter(folder)
    leaves = jax.tree_util.tree_leaves(trainer.opt_state)
    np.savez(folder / OPTIMIZER_FILE, *[np.asarray(leaf) for leaf in leaves])
    state = {"step": step, "losses": trainer.losses, "evals": trainer.evals}
    (folder / STATE_FILE).write_text(json.dumps(state) + "\n")
    return folder


def saved(out, step: int) -> bool:
    return (Path(out) / f"checkpoint-{step}" / STATE_FILE).is_file()


def resume_checkpoint(trainer) -> Path | None:
    """Adapters, optimizer state and losses from the latest JAX checkpoint in `out`."""
    latest = latest_checkpoint(trainer.config.out, STATE_FILE)
    if latest is None:
        return None
    from linnet.train.peft_format import load_adapter

    model = trainer.model
    adapters, _, _ = load_adapter(latest, model.wmap(), model.program.params)
    model.adapters = {
        n: jnp.asarray(adapters[n].float().numpy().astype(model.dtype)) for n in model.adapters
    }
    trainer.opt_state = _restored(trainer.opt_state, latest / OPTIMIZER_FILE)
    state = json.loads((latest / STATE_FILE).read_text())
    trainer.losses = list(state["losses"])
    trainer.evals = [tuple(e) for e in state["evals"]]
    return latest


def _restored(template, path: Path):
    """`template`'s tree (a fresh optimizer state) with the leaves saved at `path`."""
    leaves, tree = jax.tree_util.tree_flatten(template)
    with np.load(path) as saved_leaves:
        values = [saved_leaves[f"arr_{i}"] for i in range(len(saved_leaves.files))]
    if len(values) != len(leaves):
        raise LinnetError(
            f"{path}: {len(values)} optimizer arrays, the run's optimizer has {len(leaves)} "
            "(another optimizer or adapter set?)"
        )
    for i, (have, want) in enumerate(zip(values, leaves)):
        if have.shape != want.shape:
            raise LinnetError(f"{path}: optimizer array {i} is {have.shape}, not {want.shape}")
    return jax.tree_util.tree_unflatten(
        tree, [jnp.asarray(v, dtype=w.dtype) for v, w in zip(values, leaves)]
    )
