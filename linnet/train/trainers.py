"""SFT and DPO on a LoRA model: rows to batches, the loss per batch, one `Trainer`.

trainer = sft_trainer(model, tokenizer, rows, TrainConfig(steps=30), pack=256)
trainer = dpo_trainer(model, tokenizer, rows, TrainConfig(steps=30), beta=0.1)
losses = trainer.run()
"""

from __future__ import annotations

from linnet.train.data import DataError
from linnet.train.loop import TrainConfig, Trainer
from linnet.train.objectives import dpo_loss, mean_nll
from linnet.train.tokens import dpo_batches, dpo_example, sft_batches, sft_example


def pad_id(tokenizer) -> int:
    """The tokenizer's pad (or eos) id; padding sits after every real token and is never
    labelled, so under a causal mask any id would do."""
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if value is not None:
            return value
    return 0


def sft_step_loss(model, batch):
    ids, labels = batch
    return mean_nll(*model.label_logps(ids, labels))


def dpo_step_loss(beta: float):
    def loss(model, batch):
        ids, labels = batch
        policy = model.label_logps(ids, labels)[0].sum(dim=1)
        reference = model.label_logps(ids, labels, reference=True)[0].sum(dim=1)
        return dpo_loss(policy, reference, beta)

    return loss


def _trainer(model, torch_loss, jax_loss, batches, config, evals):
    """A `Trainer` for a `LoraModel`, a `JaxTrainer` for a `JaxLoraModel` (backend "jax");
    `jax_loss()` gives the JAX loss (so jax is imported only when it trains)."""
    if getattr(model, "backend", "torch") == "jax":
        from linnet.train.jax_train import JaxTrainer

        return JaxTrainer(model, jax_loss(), batches, config, eval_batches=evals)
    return Trainer(model, torch_loss, batches, config, eval_batches=evals)


def _jax_sft_loss():
    from linnet.train.jax_train import jax_sft_loss

    return jax_sft_loss


def _jax_dpo_loss(beta: float):
    def make():
        from linnet.train.jax_train import jax_dpo_loss

        return jax_dpo_loss(beta)

    return make


def _sft_batches(model, tokenizer, rows, config, completion_only, pack):
    positions = model.checkpoint.config["max_positions"]
    if pack > positions:
        raise DataError(f"packed rows of {pack} tokens: the model has {positions} positions")
    examples = [
        sft_example(tokenizer, r, completion_only=completion_only, max_positions=positions)
        for r in rows
    ]
    return sft_batches(examples, config.batch_size, pad_id(tokenizer), pack)


def sft_trainer(
    model,
    tokenizer,
    rows,
    config: TrainConfig,
    *,
    completion_only: bool = True,
    pack: int = 0,
    eval_rows=(),
) -> Trainer:
    """`pack`: rows of that many tokens, sequences end to end (0: one sequence per row)."""
    batches = _sft_batches(model, tokenizer, rows, config, completion_only, pack)
    evals = (
        _sft_batches(model, tokenizer, eval_rows, config, completion_only, pack)
        if eval_rows
        else []
    )
    return _trainer(model, sft_step_loss, _jax_sft_loss, batches, config, evals)


def _dpo_batches(model, tokenizer, rows, config):
    positions = model.checkpoint.config["max_positions"]
    pairs = [dpo_example(tokenizer, r, max_positions=positions) for r in rows]
    return dpo_batches(pairs, config.batch_size, pad_id(tokenizer))


def dpo_trainer(model, tokenizer, rows, config: TrainConfig, *, beta=0.1, eval_rows=()) -> Trainer:
    batches = _dpo_batches(model, tokenizer, rows, config)
    evals = _dpo_batches(model, tokenizer, eval_rows, config) if eval_rows else []
    return _trainer(model, dpo_step_loss(beta), _jax_dpo_loss(beta), batches, config, evals)


def grpo_trainer(model, tokenizer, rows, config: TrainConfig, reward, settings, eos) -> Trainer:
    """A batch is `config.batch_size` prompts; each is sampled `settings.group` times."""
    if getattr(model, "backend", "torch") == "jax":
        from linnet.train.jax_grpo import JaxGrpoTrainer

        return JaxGrpoTrainer(model, tokenizer, rows, config, reward, settings, eos)
    from linnet.train.grpo import GrpoLoss

    loss = GrpoLoss(tokenizer, reward, settings, eos)
    batches = [rows[i : i + config.batch_size] for i in range(0, len(rows), config.batch_size)]
    trainer = Trainer(model, loss, batches, config)
    trainer.rewards = loss.rewards
    trainer.samples = loss.samples
    return trainer
