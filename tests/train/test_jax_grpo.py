"""GRPO on JAX (issue 17): one group's loss and LoRA gradients on fixed completions (clipped
ratios, the KL term, completions of different lengths) equal the PyTorch GRPO's, whose
loss tests/train/test_grpo.py checks against TRL's; the rollout decoder (Linnet's JAX
generation) follows the adapters; `linnet train grpo --backend jax` samples and scores."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from linnet.train.adapted import LoraModel
from linnet.train.datasets import exact_answer_reward, multiplication_prompts
from linnet.train.grpo import (
    GrpoSettings,
    completion_logps,
    group_advantages,
    group_token_loss,
    grpo_token_loss,
)
from linnet.train.jax_grpo import JaxSampler
from linnet.train.jax_grpo import group_token_loss as jax_group_token_loss
from linnet.train.jax_train import JaxLoraModel
from linnet.train.loop import TrainConfig
from linnet.train.lora import LoraSpec
from linnet.train.trainers import grpo_trainer
from tests.numeric import assert_close
from tests.train.test_grpo import fixed_inputs
from tests.train.trl_reference import tiny_with_tokenizer, tokenizer

SPEC = LoraSpec(("layers.*.wq", "layers.*.wv"), r=4, alpha=8.0)


@pytest.fixture(scope="module")
def chat_model(tiny_checkpoint, tmp_path_factory):
    return tiny_with_tokenizer(tiny_checkpoint, tmp_path_factory.mktemp("chat-jax-grpo"))


def trained_pair(path, seed=3):
    """A PyTorch and a JAX LoRA model holding the same random (nonzero) adapters."""
    torch_model = LoraModel.load(path, SPEC, seed=0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in torch_model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return torch_model, JaxLoraModel.load(path, SPEC, adapters=torch_model.adapters())


@pytest.mark.parametrize("beta,temperature", [(0.0, 1.0), (0.04, 0.7)])
def test_jax_group_loss_and_gradients_equal_torch(chat_model, beta, temperature):
    torch_model, jax_model = trained_pair(chat_model)
    prompt, completion, mask, rewards, gen = fixed_inputs()
    settings = GrpoSettings(group=len(completion), beta=beta, temperature=temperature)
    ids = torch.cat([prompt, completion], dim=1)
    with torch.no_grad():
        now = completion_logps(torch_model(ids), completion, temperature) * mask
    old = (now + torch.randn(now.shape, generator=gen) * 0.3) * mask  # ratios past the clip
    advantages = group_advantages(rewards)
    summed, count = group_token_loss(torch_model, ids, completion, mask, advantages, settings, old)
    (summed / count).backward()
    want_grads = {n: p.grad for n, p in torch_model.module.named_parameters() if p.requires_grad}

    batch = tuple(jnp.asarray(t.numpy()) for t in (ids, completion, mask.float(), advantages, old))
    import jax

    got, grads = jax.value_and_grad(
        lambda a: jax_group_token_loss(jax_model, a, batch, settings) / float(count)
    )(jax_model.adapters)
    # the token terms cancel (advantages sum to zero): bound by their mean size, not the sum
    with torch.no_grad():
        logps = completion_logps(torch_model(ids), completion, temperature) * mask
        ref = completion_logps(torch_model.reference(ids), completion, temperature) * mask
        token = grpo_token_loss(logps, old, ref, advantages, settings)
    scale = ((token.abs() * mask).sum() / mask.sum()).item()
    assert abs(float(got) - (summed / count).item()) <= 1e-4 * scale, (float(got), scale)
    for name, want in want_grads.items():
        have = torch.from_numpy(np.array(grads[name]))
        assert_close(have, want, atol=1e-4 * want.abs().max().item(), rtol=0, what=name)


def test_jax_sampler_decodes_with_the_current_adapters(chat_model):
    _, model = trained_pair(chat_model)
    sampler = JaxSampler(model)
    ids = np.random.default_rng(1).integers(2, 256, (3, 9))
    first = sampler(16)
    for step in range(2):
        model.adapters = {n: v * (1.5 + step) for n, v in model.adapters.items()}
        decoder = sampler(16)
        assert decoder is first  # reused: the merged weights replaced, not rebuilt
        decoder.reset()
        got = torch.from_numpy(np.array(decoder.decode(ids, 0)))
        want = torch.from_numpy(np.array(model(ids)[:, -1]))
        scale = want.abs().max().item()
        base = torch.from_numpy(np.array(model.reference(jnp.asarray(ids))[:, -1]))
        assert not (want - base).abs().max() <= 1e-3 * scale  # the adapters matter
        assert_close(got, want, atol=1e-5 * scale, rtol=0, what="decode logits")


def test_jax_grpo_trainer_samples_and_scores(chat_model):
    rows = multiplication_prompts(4, seed=0)
    model = JaxLoraModel.load(chat_model, SPEC)
    settings = GrpoSettings(group=3, max_new_tokens=5)

    def reward(text, row):  # the tiny model cannot multiply: reward the words it writes
        return float(len(text.split())) + exact_answer_reward(text, row["answer"])

    config = TrainConfig(steps=2, lr=1e-2, batch_size=2)
    trainer = grpo_trainer(model, tokenizer(chat_model), rows, config, reward, settings, eos=[])
    assert type(trainer).__name__ == "JaxGrpoTrainer"
    losses = trainer.run()
    assert len(losses) == 2 and len(trainer.rewards) == 2
    assert all(len(texts) == 6 for texts in trainer.samples)  # 2 prompts x 3
    assert all(r == 5.0 for r in trainer.rewards)  # no eos: every completion has 5 words
    assert all(abs(x) < 1e-3 for x in losses)  # equal rewards: zero advantages
