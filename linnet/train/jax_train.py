"""LoRA training on JAX: `jax.grad` through the generated JAX `forward`, the adapters the
only leaves that train, optax's AdamW (issue 17).

    model = JaxLoraModel.load("path/to/checkpoint", LoraSpec(("layers.*.wq",), r=8))
    losses = JaxTrainer(model, jax_sft_loss, batches, TrainConfig(steps=30)).run()
    model.save_adapter("out/adapter")          # PEFT's format, as on PyTorch

The program is the same LoRA rewrite of the source as PyTorch trains (`add_lora`), written
by `linnet.backends.jax.codegen`; the adapters are a flat dict `{"layers.0.wq_lora_a": ...}`
joined with the frozen params (`nest_params`) inside the differentiated function, so
gradients exist for the adapters only. The optimizer mirrors `linnet.train.loop.Trainer`
(transformers' defaults): clipping by global norm, AdamW (β 0.9, 0.999, ε 1e-8), a linear
schedule with optional warmup. `remat=True` marks each layer's output (the residual stream
between layers, found by `linnet.ir.outline`) and differentiates under `jax.checkpoint`
with a policy that saves those marks only: everything inside a layer is recomputed in the
backward.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from jax.ad_checkpoint import checkpoint_name

from linnet.backends.jax.codegen import generate_entries, prepare
from linnet.backends.jax.prelude import nest_params
from linnet.backends.jax.runners import load_module
from linnet.errors import LinnetError
from linnet.ir.outline import outline
from linnet.ir.program import Program
from linnet.train.loop import TrainConfig
from linnet.train.lora import LoraSpec
from linnet.train.lora_base import LoraCheckpoint
from linnet.train.peft_format import merge_lora, save_adapter
from linnet.train.tokens import IGNORE

BUCKET = 64  # batch lengths padded to a multiple of this (one XLA compile per bucket)
LAYER_MARK = "linnet_layer"  # the name `remat` saves (jax.ad_checkpoint.checkpoint_name)


def _value_names(graph) -> dict:
    """Value -> the variable `emit_function` gives it (`t1`, `t2`, ... in node order,
    array constants and state updates aside); a forward has neither."""
    names, count = {}, 0
    for node in graph.nodes:
        if node.output is None:
            continue
        if node.op == "const" and node.attrs["value"].ndim > 0:
            continue
        count += 1
        names[node.output] = f"t{count}"
    return names


def mark_layer_outputs(text: str, graph) -> str:
    """The generated text with each layer's outputs named for `jax.checkpoint`'s policy:
    a line `tN = checkpoint_name(tN, "linnet_layer")` after each."""
    cut = outline(graph)
    if cut is None:
        raise LinnetError("remat: the source's layers could not be outlined")
    names = _value_names(graph)
    lines = text.split("\n")
    for var in {names[v] for r in cut.regions for v in r.outputs}:
        head = f"    {var} = "
        at = [i for i, line in enumerate(lines) if line.startswith(head)]
        if len(at) != 1:  # fail closed if the code generator names values otherwise
            raise LinnetError(f"remat: no single definition of {var} in the generated forward")
        mark = f'{head}checkpoint_name({var}, "{LAYER_MARK}")'
        lines.insert(at[0] + 1, mark)
    return "\n".join(lines)


def jax_forward(program: Program, numerics: str = "equivalent", remat: bool = False):
    """`forward(params, tokens) -> logits` of the program's generated JAX module."""
    if "forward" not in program.graphs:
        raise LinnetError(f"the {program.name} source has no `forward` entry to train")
    entry = prepare(program, "forward")
    consts: dict = {}
    text = generate_entries(program, {"forward": entry}, numerics, consts)
    if remat:
        text = mark_layer_outputs(text, entry.graph)
    module = load_module(text, program.name, consts)
    if not remat:
        return module.forward
    module.checkpoint_name = checkpoint_name  # what the marks call
    policy = jax.checkpoint_policies.save_only_these_names(LAYER_MARK)
    return jax.checkpoint(module.forward, policy=policy)


class JaxLoraModel(LoraCheckpoint):
    """A checkpoint's params on JAX with LoRA adapters: `logits(adapters, ids)` is the
    function to differentiate, `reference(ids)` the base with adapters disabled."""

    backend = "jax"  # what `linnet.train.trainers` picks the trainer by

    def __init__(
        self,
        checkpoint,
        spec: LoraSpec,
        *,
        adapters=None,
        seed=0,
        numerics="equivalent",
        remat=False,
    ):
        initial = self._adapt(checkpoint, spec, adapters, seed)
        base = checkpoint.numpy_params()
        self.dtype = next(iter(base.values())).dtype
        self.frozen = {n: jnp.asarray(base[n]) for n in self.base_program.graphs["forward"].params}
        self.adapters = {n: jnp.asarray(_numpy(initial[n], self.dtype)) for n in self.adapter_names}
        self.numerics = numerics
        self._forward = jax_forward(self.program, numerics, remat)
        self._base_forward = jax.jit(jax_forward(self.base_program, numerics))

    def logits(self, adapters: dict, ids):
        return self._forward(nest_params({**self.frozen, **adapters}), ids)

    def __call__(self, ids):
        return self.logits(self.adapters, jnp.asarray(np.asarray(ids), jnp.int32))

    def reference(self, ids):
        return self._base_forward(nest_params(self.frozen), ids)

    def torch_adapters(self) -> dict[str, torch.Tensor]:
        return {n: torch.from_numpy(np.array(v)) for n, v in self.adapters.items()}

    def save_adapter(self, folder) -> Path:
        wmap, origin = self._wmap(self.checkpoint), str(self.checkpoint.origin)
        return save_adapter(folder, self.torch_adapters(), self.spec, self.targets, wmap, origin)

    def merged_params(self) -> dict[str, torch.Tensor]:
        base = {n: torch.from_numpy(np.array(v)) for n, v in self.frozen.items()}
        return merge_lora(base, self.torch_adapters(), self.targets, self.spec.scale)


def _numpy(tensor, dtype) -> np.ndarray:
    return tensor.detach().cpu().float().numpy().astype(dtype)


def token_logps(logits, labels):
    """Log-prob of each next label [B, S-1] (zero where ignored) and the label mask."""
    targets = labels[:, 1:]
    mask = targets != IGNORE
    logps = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logps, jnp.maximum(targets, 0)[..., None], axis=-1)[..., 0]
    return picked * mask, mask


def jax_sft_loss(model: JaxLoraModel, adapters, batch):
    """The mean NLL over the labelled tokens (`linnet.train.objectives.sft_loss`)."""
    ids, labels = batch
    picked, mask = token_logps(model.logits(adapters, ids), labels)
    return -picked.sum() / jnp.maximum(mask.sum(), 1)


def jax_dpo_loss(beta: float):
    """DPO's sigmoid loss (`linnet.train.objectives.dpo_loss`): rows are N chosen then N
    rejected, the reference the base params with adapters disabled."""

    def loss(model: JaxLoraModel, adapters, batch):
        ids, labels = batch
        policy = token_logps(model.logits(adapters, ids), labels)[0].sum(axis=1)
        reference = jax.lax.stop_gradient(token_logps(model.reference(ids), labels)[0].sum(axis=1))
        chosen, rejected = jnp.split(policy, 2)
        ref_chosen, ref_rejected = jnp.split(reference, 2)
        margin = (chosen - ref_chosen) - (rejected - ref_rejected)
        return -jax.nn.log_sigmoid(beta * margin).mean()

    return loss


def optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """transformers' defaults as `linnet.train.loop.Trainer` has them, in optax."""
    decay = max(1, config.steps - config.warmup_steps)
    warm = optax.linear_schedule(0.0, config.lr, max(1, config.warmup_steps))
    fall = optax.linear_schedule(config.lr, 0.0, decay)
    schedule = optax.join_schedules([warm, fall], [config.warmup_steps])
    steps = [optax.clip_by_global_norm(config.max_grad_norm)] if config.max_grad_norm else []
    adamw = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=config.weight_decay)
    return optax.chain(*steps, adamw)


def as_jax_batch(batch, bucket: int = 0, limit: int = 0) -> tuple:
    """Torch (ids, labels) from `linnet.train.tokens` as int32 JAX arrays, right-padded to
    a multiple of `bucket` tokens (at most `limit`) so that XLA compiles once per bucket,
    not once per batch length; the padding is after every real token and never labelled,
    so under the causal mask the loss is unchanged."""
    ids, labels = (np.asarray(t) for t in batch)
    width = ids.shape[1]
    if bucket:
        rounded = -(-width // bucket) * bucket
        width = max(width, min(rounded, limit) if limit else rounded)
    pad = [(0, 0), (0, width - ids.shape[1])]
    ids, labels = np.pad(ids, pad), np.pad(labels, pad, constant_values=IGNORE)
    return jnp.asarray(ids, jnp.int32), jnp.asarray(labels, jnp.int32)


class JaxTrainer:
    """Batches in order and repeated, one jitted step (value, grad, update) per batch;
    `losses`, `evals` and `run()` as `linnet.train.loop.Trainer` has them."""

    def __init__(self, model, loss_fn, batches, config: TrainConfig, eval_batches=()):
        if not batches:
            raise LinnetError("no training batches: the data gave no rows")
        self.model, self.loss_fn, self.config = model, loss_fn, config
        limit = model.checkpoint.config["max_positions"]
        self.batches = [as_jax_batch(b, BUCKET, limit) for b in batches]
        self.eval_batches = [as_jax_batch(b, BUCKET, limit) for b in eval_batches]
        self.optimizer = optimizer(config)
        self.opt_state = self.optimizer.init(model.adapters)
        self.losses: list[float] = []
        self.evals: list[tuple[int, float]] = []
        self._step = jax.jit(self._update)
        self._eval = jax.jit(lambda adapters, batch: loss_fn(model, adapters, batch))

    def _update(self, adapters, opt_state, batch):
        value_and_grad = jax.value_and_grad(lambda a: self.loss_fn(self.model, a, batch))
        loss, grads = value_and_grad(adapters)
        updates, opt_state = self.optimizer.update(grads, opt_state, adapters)
        return optax.apply_updates(adapters, updates), opt_state, loss

    def gradients(self, batch) -> dict:
        """The adapters' gradients of one batch's loss (no update)."""
        batch = as_jax_batch(batch)
        return jax.grad(lambda a: self.loss_fn(self.model, a, batch))(self.model.adapters)

    def step(self, batch) -> float:
        adapters, self.opt_state, loss = self._step(self.model.adapters, self.opt_state, batch)
        self.model.adapters = adapters
        return float(loss)

    def evaluate(self) -> float:
        values = [float(self._eval(self.model.adapters, b)) for b in self.eval_batches]
        return sum(values) / len(values)

    def run(self, resume: bool = False) -> list[float]:
        """Steps up to `config.steps`; checkpoints as PyTorch's trainer writes them
        (`save_every`, and at the end with an `out`); `resume`: from the latest one."""
        from linnet.train import jax_checkpoint

        cfg = self.config
        if resume:
            jax_checkpoint.resume_checkpoint(self)
        bar = _progress(cfg, len(self.losses))
        while len(self.losses) < cfg.steps:
            done = len(self.losses)
            self.losses.append(self.step(self.batches[done % len(self.batches)]))
            if cfg.eval_every and self.eval_batches and (done + 1) % cfg.eval_every == 0:
                self.evals.append((done + 1, self.evaluate()))
            if bar is not None:
                bar.set_postfix(loss=f"{self.losses[-1]:.4f}")
                bar.update(1)
            if cfg.out is not None and cfg.save_every and (done + 1) % cfg.save_every == 0:
                jax_checkpoint.save_checkpoint(self, done + 1)
        if bar is not None:
            bar.close()
        if cfg.out is not None and not jax_checkpoint.saved(cfg.out, len(self.losses)):
            jax_checkpoint.save_checkpoint(self, len(self.losses))
        return self.losses


def _progress(config: TrainConfig, start: int):
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.steps, initial=start, desc="train (jax)", unit="step")
