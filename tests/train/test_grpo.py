"""GRPO against TRL (issue 17): the loss of one step on fixed completions (clipped ratios,
KL to the adapters-disabled reference, completions of different lengths) equals TRL's
`_compute_loss`; a short run through `linnet train grpo`'s trainer samples with Linnet's
generation and records rewards."""

from __future__ import annotations

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
from linnet.train.loop import TrainConfig
from linnet.train.lora import LoraSpec
from linnet.train.trainers import grpo_trainer
from tests.train.trl_reference import tiny_with_tokenizer, tokenizer, trl_grpo_trainer

G, P, C = 4, 6, 7


@pytest.fixture(scope="module")
def chat_model(tiny_checkpoint, tmp_path_factory):
    return tiny_with_tokenizer(tiny_checkpoint, tmp_path_factory.mktemp("chat"))


def fixed_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(2, 256, (1, P), generator=gen).repeat(G, 1)
    completion = torch.randint(2, 256, (G, C), generator=gen)
    lengths = torch.tensor([C, C - 2, 3, C - 1])
    mask = (torch.arange(C)[None, :] < lengths[:, None]).long()
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])
    return prompt, completion, mask, rewards, gen


def randomize_adapters(peft, gen):
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


@pytest.mark.parametrize("beta,temperature", [(0.0, 1.0), (0.04, 0.7)])
def test_one_step_loss_equals_trl(chat_model, tmp_path, beta, temperature):
    trainer = trl_grpo_trainer(
        chat_model, tmp_path, group=G, beta=beta, temperature=temperature, completion_length=C
    )
    prompt, completion, mask, rewards, gen = fixed_inputs()
    randomize_adapters(trainer.model, gen)
    trainer.model.save_pretrained(tmp_path / "adapter")
    model = LoraModel.from_peft(chat_model, tmp_path / "adapter")
    settings = GrpoSettings(group=G, beta=beta, temperature=temperature)
    ids = torch.cat([prompt, completion], dim=1)
    with torch.no_grad():
        now = completion_logps(model(ids), completion, temperature) * mask
        ref = completion_logps(model.reference(ids), completion, temperature) * mask
    old = (now + torch.randn(now.shape, generator=gen) * 0.3) * mask  # ratios past the clip
    advantages = group_advantages(rewards)
    summed, count = group_token_loss(model, ids, completion, mask, advantages, settings, old)
    got = (summed / count).item()

    inputs = {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    if beta:
        with torch.no_grad(), trainer.model.disable_adapter():
            logits = trainer.model(input_ids=ids).logits
        inputs["ref_per_token_logps"] = completion_logps(logits, completion, temperature) * mask
        torch.testing.assert_close(ref, inputs["ref_per_token_logps"], rtol=0, atol=1e-4)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    want = trainer._compute_loss(trainer.model, inputs).item()
    # the token terms cancel (advantages sum to zero): bound by their mean size, not the sum
    with torch.no_grad():
        logps = completion_logps(model(ids), completion, temperature) * mask
        token = grpo_token_loss(logps, old, ref if beta else None, advantages, settings)
    scale = ((token.abs() * mask).sum() / mask.sum()).item()
    assert abs(got - want) <= 1e-4 * scale, (got, want, scale)
    ratio = torch.exp(now - old)[mask.bool()]
    assert ((ratio < 0.8) | (ratio > 1.2)).any()  # the clip takes part


def test_grpo_trainer_samples_and_scores(chat_model):
    rows = multiplication_prompts(4, seed=0)
    model = LoraModel.load(chat_model, LoraSpec(("layers.*.wq", "layers.*.wv"), r=4, alpha=8.0))
    settings = GrpoSettings(group=3, max_new_tokens=5)
    tok = tokenizer(chat_model)

    def reward(text, row):  # the tiny model cannot multiply: reward the words it writes
        return float(len(text.split())) + exact_answer_reward(text, row["answer"])

    trainer = grpo_trainer(
        model, tok, rows, TrainConfig(steps=2, lr=1e-2, batch_size=2), reward, settings, eos=[]
    )
    losses = trainer.run()
    assert len(losses) == 2 and len(trainer.rewards) == 2
    assert all(r == 5.0 for r in trainer.rewards)  # no eos: every completion has 5 words
    assert all(abs(x) < 1e-3 for x in losses)  # equal rewards: zero advantages


def test_sampler_decodes_with_the_current_adapters(chat_model):
    """The rollout decoder is built once and follows the adapters as they train: its decode
    logits equal the adapted training forward's after the adapters change in place."""
    model = LoraModel.load(chat_model, LoraSpec(("layers.*.wq", "layers.*.wv"), r=4, alpha=8.0))
    ids = torch.randint(2, 256, (3, 9), generator=torch.Generator().manual_seed(1))
    first = model.sampler(positions=16)
    gen = torch.Generator().manual_seed(2)
    for _step in range(2):  # as an optimizer step would: the leaves change in place
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        decoder = model.sampler(positions=16)
        assert decoder is first  # reused, not rebuilt
        decoder.reset()
        got = decoder.decode(ids, 0)
        with torch.no_grad():
            want = model(ids)[:, -1]
        scale = want.abs().max().item()
        assert not (want - model.reference(ids)[:, -1]).abs().max() <= 1e-3 * scale
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * scale)
    longer = model.sampler(positions=64)  # a longer cache: a new decoder, same weights
    assert longer is not first and longer.max_positions == 64
    longer.reset()
    torch.testing.assert_close(longer.decode(ids, 0), want, rtol=0, atol=1e-5 * scale)
