"""GRPO on JAX (issue 17): the objective of `linnet.train.grpo` (TRL's, loss_type "dapo")
in jax.numpy, rollouts sampled through Linnet's JAX generation (`linnet.jax`'s decoder over
the merged weights), and a trainer whose step sums each group's token loss and gradients
and divides by the completion tokens of the step, as the PyTorch `GrpoLoss` does.

    trainer = JaxGrpoTrainer(model, tokenizer, rows, config, reward, settings, eos)
    losses = trainer.run()
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

from linnet.backends.jax.prelude import nest_params
from linnet.errors import LinnetError
from linnet.train.grpo import GrpoSettings, completion_mask, group_advantages
from linnet.train.jax_train import JaxTrainer, optimizer
from linnet.train.lora import lora_names
from linnet.train.tokens import chat_ids


def completion_logps(logits, completion, temperature: float):
    """Log-probs [G, C] of the completion tokens from logits over prompt + completion."""
    width = completion.shape[1]
    scores = logits[:, -width - 1 : -1].astype(jnp.float32) / temperature
    logps = jax.nn.log_softmax(scores, axis=-1)
    return jnp.take_along_axis(logps, completion[..., None], axis=-1)[..., 0]


def grpo_token_loss(logps, old_logps, ref_logps, advantages, settings: GrpoSettings):
    """The clipped objective (and KL term) per token [G, C], as `linnet.train.grpo`."""
    high = settings.epsilon_high if settings.epsilon_high is not None else settings.epsilon
    ratio = jnp.exp(logps - old_logps)
    clipped = jnp.clip(ratio, 1 - settings.epsilon, 1 + high)
    adv = advantages[:, None]
    loss = -jnp.minimum(ratio * adv, clipped * adv)
    if settings.beta:
        delta = ref_logps - logps
        kl = jnp.exp(delta) - delta - 1
        loss = loss + settings.beta * (kl * ratio if settings.bias_correction_kl else kl)
    return loss


def group_token_loss(model, adapters, batch, settings: GrpoSettings):
    """The summed token loss of one group: `batch` = (ids [G, P + C], completion [G, C],
    mask [G, C], advantages [G], old log-probs [G, C] or None: the current ones)."""
    ids, completion, mask, advantages, old = batch
    temperature = settings.temperature
    logps = completion_logps(model.logits(adapters, ids), completion, temperature) * mask
    ref = None
    if settings.beta:
        ref = completion_logps(model.reference(ids), completion, temperature) * mask
        ref = jax.lax.stop_gradient(ref)
    old = jax.lax.stop_gradient(logps) if old is None else old
    return (grpo_token_loss(logps, old, ref, advantages, settings) * mask).sum()


def merged_params(model) -> dict:
    """The base params with each target's `scale * B @ A` added, on JAX."""
    merged = dict(model.frozen)
    for t in model.targets:
        a, b = (model.adapters[n] for n in lora_names(t))
        delta = (b.astype(jnp.float32) @ a.astype(jnp.float32)) * model.spec.scale
        merged[t] = (model.frozen[t].astype(jnp.float32) + delta).astype(model.frozen[t].dtype)
    return merged


class JaxSampler:
    """One JAX decoder per cache length, its params replaced by the merged weights before
    each rollout (the compiled decode takes them as an argument: no new compile)."""

    def __init__(self, model):
        self.model, self.decoders = model, {}

    def __call__(self, positions: int):
        from linnet.backends.jax.runners import JitRunner
        from linnet.jax import JaxModel

        ck = self.model.checkpoint
        decoder = self.decoders.get(positions)
        if decoder is None:
            config = {**ck.config, "max_positions": positions}
            runner = JitRunner(ck.source.program(config), self.model.numerics)
            decoder = JaxModel(ck.source, config, self.model.frozen, runner)
            self.decoders[positions] = decoder
        decoder.params = nest_params(merged_params(self.model))
        return decoder


class JaxGrpoTrainer(JaxTrainer):
    """A batch is a list of rows ({"prompt", "answer"}); each is sampled `group` times."""

    def __init__(self, model, tokenizer, rows, config, reward, settings, eos, seed=0):
        if not rows:
            raise LinnetError("no training batches: the data gave no rows")
        self.model, self.loss_fn, self.config = model, None, config
        self.batches = [
            rows[i : i + config.batch_size] for i in range(0, len(rows), config.batch_size)
        ]
        self.eval_batches, self.losses, self.evals = [], [], []
        self.optimizer = optimizer(config)
        self.opt_state = self.optimizer.init(model.adapters)
        self.tokenizer, self.reward, self.settings, self.eos = tokenizer, reward, settings, eos
        self.sampler, self.seed = JaxSampler(model), seed
        self.rewards: list[float] = []
        self.samples: list[list[str]] = []
        self.sampled = 0  # groups drawn so far: each draws from its own key
        loss = lambda a, batch: group_token_loss(model, a, batch, settings)  # noqa: E731
        self._group = jax.jit(jax.value_and_grad(loss))
        self._apply = jax.jit(self._apply_grads)

    def _apply_grads(self, adapters, opt_state, grads):
        updates, opt_state = self.optimizer.update(grads, opt_state, adapters)
        return optax.apply_updates(adapters, updates), opt_state

    def sample(self, prompt: list[int]) -> np.ndarray:
        """`group` completions [G, max_new_tokens] (eos-padded) of one prompt."""
        s = self.settings
        decoder = self.sampler(-(-(len(prompt) + s.max_new_tokens) // 256) * 256)
        out = decoder.generate(
            np.array([prompt] * s.group), s.max_new_tokens, eos_token_id=self.eos,
            do_sample=True, temperature=s.temperature, seed=self.seed + self.sampled,
        )  # fmt: skip
        self.sampled += 1
        completion = np.asarray(out)[:, len(prompt) :]
        fill = self.eos[0] if self.eos else 0  # past an eos the mask is 0: any id does
        return np.pad(completion, [(0, 0), (0, s.max_new_tokens - completion.shape[1])],
                      constant_values=fill)  # fmt: skip

    def group_batch(self, row) -> tuple:
        prompt = chat_ids(self.tokenizer, row["prompt"], generation_prompt=True)
        completion = self.sample(prompt)
        texts = self.tokenizer.batch_decode(completion, skip_special_tokens=True)
        rewards = [float(self.reward(t, row)) for t in texts]
        mask = completion_mask(torch.from_numpy(completion), self.eos).numpy()
        advantages = group_advantages(torch.tensor(rewards)).numpy()
        ids = np.concatenate([np.array([prompt] * len(completion)), completion], axis=1)
        arrays = (ids, completion, mask.astype(np.float32), advantages, None)
        return tuple(None if a is None else jnp.asarray(a) for a in arrays), texts, rewards

    def step(self, rows) -> float:
        total, count, grads, scores, texts_seen = 0.0, 0, None, [], []
        for row in rows:
            batch, texts, rewards = self.group_batch(row)
            summed, g = self._group(self.model.adapters, batch)
            total, count = total + float(summed), count + int(batch[2].sum())
            grads = g if grads is None else jax.tree_util.tree_map(jnp.add, grads, g)
            scores, texts_seen = scores + rewards, texts_seen + texts
        count = max(count, 1)
        grads = jax.tree_util.tree_map(lambda x: x / count, grads)
        self.model.adapters, self.opt_state = self._apply(
            self.model.adapters, self.opt_state, grads
        )
        self.rewards.append(sum(scores) / len(scores))
        self.samples.append(texts_seen)
        return total / count
