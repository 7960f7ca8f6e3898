"""GRPO as TRL defines it (loss_type "dapo", one iteration per generation): each prompt's
group of completions sampled with Linnet's own generation from the current adapted
weights, rewards scored, advantages normalized within the group, and

    loss = sum over tokens of -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
           + beta * ratio * (exp(ref - logp) - (ref - logp) - 1),  divided by the completion tokens

with ratio = exp(logp - old_logp) (1 on the step that sampled, as in TRL's default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from linnet.train.rollout import sample_group
from linnet.train.tokens import chat_ids


@dataclass
class GrpoSettings:
    group: int = 4  # completions per prompt
    max_new_tokens: int = 16
    temperature: float = 1.0
    beta: float = 0.0  # KL coefficient (TRL's default: none)
    epsilon: float = 0.2
    epsilon_high: float | None = None  # default: epsilon
    bias_correction_kl: bool = True  # the KL term weighted by the ratio (TRL's default)


def completion_logps(logits: torch.Tensor, completion: torch.Tensor, temperature: float):
    """Log-probs [G, C] of the completion tokens from logits over prompt + completion."""
    width = completion.shape[1]
    scores = logits[:, -width - 1 : -1].float() / temperature
    logps = torch.log_softmax(scores, dim=-1)
    return logps.gather(-1, completion.unsqueeze(-1)).squeeze(-1)


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """TRL's `scale_rewards="group"`: (r - mean) / (std + 1e-4) within one group."""
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


def grpo_token_loss(logps, old_logps, ref_logps, advantages, settings: GrpoSettings):
    """The clipped objective (and KL term) per token [G, C]."""
    high = settings.epsilon_high if settings.epsilon_high is not None else settings.epsilon
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - settings.epsilon, 1 + high)
    adv = advantages.unsqueeze(1)
    loss = -torch.min(ratio * adv, clipped * adv)
    if settings.beta:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        loss = loss + settings.beta * (kl * ratio if settings.bias_correction_kl else kl)
    return loss


def group_token_loss(model, ids, completion, mask, advantages, settings, old_logps=None,
                     ran=None):  # fmt: skip
    """(summed token loss, completion tokens) of one group: `ids` [G, P + C] the prompt
    and completions, `old_logps` those the completions were sampled with (default: the
    current ones, detached); `ran`: the policy's prompt pass (`LoraModel.prompt_pass`)."""
    # zero past each completion's end, as TRL has them (no exp of a stray value overflows)
    extra = {"ran": ran} if ran is not None else {}
    logps = model.completion_logps(ids, completion, settings.temperature, **extra) * mask
    ref = None
    if settings.beta:
        ref = model.completion_logps(ids, completion, settings.temperature, reference=True)
        ref = ref * mask
    old = logps.detach() if old_logps is None else old_logps
    token = grpo_token_loss(logps, old, ref, advantages, settings)
    return (token * mask).sum(), mask.sum()


def completion_mask(completion: torch.Tensor, eos: list[int]) -> torch.Tensor:
    """1 up to and including the first end-of-sequence token of each row."""
    ended = (
        torch.isin(completion, torch.tensor(eos)) if eos else torch.zeros_like(completion).bool()
    )
    after = ended.int().cumsum(1) - ended.int()  # ends seen before this token
    return (after == 0).long()


@dataclass
class GrpoLoss:
    """`loss_fn` for the `Trainer`: a batch is a list of rows ({"prompt", "answer"})."""

    tokenizer: object
    reward: object  # reward(completion text, row) -> float
    settings: GrpoSettings
    eos: list[int]
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    rewards: list = field(default_factory=list)  # mean reward per step
    samples: list = field(default_factory=list)  # each step's completion texts

    def sample(self, model, prompt: list[int], ran=None) -> torch.Tensor:
        """`group` completions [G, C] of one prompt, from the current adapted weights
        (`ran`: the loss's prompt pass, which the rollout starts from)."""
        # a cache just long enough (in blocks of 256, so most prompts reuse the decoder):
        # the model's full length meant zeroing hundreds of MB per rollout
        needed = len(prompt) + self.settings.max_new_tokens
        decoder = model.sampler(positions=-(-needed // 256) * 256)
        s = self.settings
        fill = None if ran is None else lambda d: model.prefill(d, ran, len(prompt))
        return sample_group(decoder, prompt, s.group, s.max_new_tokens, eos=self.eos,
                            temperature=s.temperature, generator=self.generator,
                            prefilled=fill)  # fmt: skip

    def completion_texts(self, completion: torch.Tensor) -> list[str]:
        """Each completion's text up to its first end-of-sequence token, as TRL scores it
        (a finished row keeps being sampled while others run: that tail is no answer)."""
        kept = completion_mask(completion, self.eos).bool()
        rows = [row[keep].tolist() for row, keep in zip(completion, kept)]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def group_loss(self, model, prompt: list[int], completion, rewards, ran=None):
        """Summed token loss of one group and its completion token count."""
        mask = completion_mask(completion, self.eos)
        ids = torch.cat([torch.tensor([prompt] * len(completion)), completion], dim=1)
        advantages = group_advantages(rewards)
        return group_token_loss(model, ids, completion, mask, advantages, self.settings, ran=ran)

    def __call__(self, model, rows):
        total, count, scores, texts_seen = 0.0, 0, [], []
        for row in rows:
            prompt = chat_ids(self.tokenizer, row["prompt"], generation_prompt=True)
            # the loss's prompt pass (autograd on) first: the rollout starts from its cache
            # instead of prefilling the same prompt again (10% of a SmolLM2 step)
            pass_ = getattr(model, "prompt_pass", None)
            ran = pass_(prompt) if pass_ is not None else None
            with torch.no_grad():
                completion = self.sample(model, prompt, ran)
            texts = self.completion_texts(completion)
            rewards = torch.tensor([float(self.reward(t, row)) for t in texts])
            scores += rewards.tolist()
            texts_seen += texts
            summed, tokens = self.group_loss(model, prompt, completion, rewards, ran)
            total, count = total + summed, count + tokens
        self.rewards.append(sum(scores) / len(scores))
        self.samples.append(texts_seen)
        return total / max(int(count), 1)
