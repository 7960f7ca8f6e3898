"""The losses, as TRL computes them.

- SFT: the mean negative log-likelihood over the labelled tokens of the batch.
- DPO (sigmoid): -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), the log-probs
  summed over each completion, averaged over the pairs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linnet.train.tokens import IGNORE


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next label [B, S-1] (zero where ignored) and the label mask."""
    targets = labels[:, 1:]
    mask = targets != IGNORE
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logps.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return picked * mask, mask


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return mean_nll(*token_logps(logits, labels))


def mean_nll(picked: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SFT's loss from `token_logps`' two results."""
    return -picked.sum() / mask.sum().clamp(min=1)


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return token_logps(logits, labels)[0].sum(dim=1)


def dpo_loss(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> torch.Tensor:
    """`policy`, `reference`: summed log-probs [2N] (N chosen, then N rejected)."""
    chosen, rejected = policy.chunk(2)
    ref_chosen, ref_rejected = reference.chunk(2)
    margin = (chosen - ref_chosen) - (rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()
