"""GRPO's rollouts: one prompt sampled `group` times, its prefill run once (issue 17).

A group's rows share their prompt, so the prompt's keys and values are the same in every
row: `sample_group` prefills the prompt at batch 1, copies the cache's rows `group` times
along its batch axis, and samples from there, as `Decoder.generate` would from a
[group, P] batch (the same tokens and the same draws from `generator`: only the rounding
of the prefill's matmuls can differ). The prefill was most of a rollout's time: a
SmolLM2 prompt with its chat template is about 44 tokens, a completion 6 to 16.

Numerics: the decoder is `linnet.runtime.TorchModel` in `generated` mode, f32 weights (the
merged LoRA targets copied in) and `numerics="equivalent"`, as the loss; the sampling is
`pick` (softmax of logits / temperature, `torch.multinomial`).
"""

from __future__ import annotations

import numpy as np
import torch

from linnet.backends.torch.arrays import pick
from linnet.rows import row_axes


def widen_cache(decoder, group: int) -> None:
    """Each batch-1 state of `decoder` repeated `group` times along its batch axis."""
    axes = row_axes(decoder._state_types())
    with torch.inference_mode():  # as the decoder made them
        for name, state in decoder.state.items():
            decoder.state[name] = state.repeat_interleave(group, dim=axes[name])


def sample_group(decoder, prompt: list[int], group: int, max_new_tokens: int, *, eos,
                 temperature: float, generator, prefilled=None) -> torch.Tensor:  # fmt: skip
    """`group` sampled completions [group, n <= max_new_tokens] of `prompt`, stopping
    when every row has met an `eos` id (later tokens of a finished row are kept: the
    caller masks past each row's first end). `prefilled(decoder)`: fills the decoder's
    cache with the prompt and gives its last logits [1, V] (GRPO: the loss's own prompt
    pass), instead of the decoder's prefill."""
    if prefilled is None:
        decoder.reset()
        logits = decoder.decode(torch.tensor([prompt]), 0)
    else:
        logits = prefilled(decoder)
    logits = logits.expand(group, -1)
    widen_cache(decoder, group)
    tokens, done = [], np.zeros(group, dtype=bool)
    for step in range(max_new_tokens):
        token = pick(logits, True, temperature, None, generator)
        tokens.append(token[:, None])
        done |= np.isin(token.numpy(), eos)
        if done.all():
            break
        if step + 1 < max_new_tokens:
            logits = decoder.decode(token[:, None], decoder.position)
    return torch.cat(tokens, dim=1)
