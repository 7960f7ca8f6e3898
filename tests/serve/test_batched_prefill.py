"""Prompts prefilled together (`RowDecoder.prefill_together`, one `decode_rows` call for
several rows) give transformers' greedy tokens, on every backend: three prompts of 9, 3
and 14 tokens share calls (chunks of 8, each call as long as the shortest part left) while
a fourth row, already decoding, sits in their span with little room left (its writes cap
the count) and keeps stepping between the calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import linnet.jax
import linnet.onnx
import linnet.torch as lt
from tests.checkpoints import reference_greedy, reference_logits
from tests.numeric import assert_close

F32_TOL = 1e-4
NEW = 5
CHUNK = 8
POSITIONS = 27  # cache slots: the decoding row (22 tokens and growing) leaves 5 to 2 of room
LENGTHS = {0: 9, 1: 22, 2: 3, 3: 14}  # row 1 decodes while the others prefill


def schedule(rows, prompts: dict) -> tuple[dict, dict, list]:
    """(row -> greedy tokens, row -> logits of its first token, per call: the counts fed and
    the shortest part offered)."""
    tokens = {r: [] for r in prompts}
    first = {}
    tokens[1].append(int(rows.prefill(1, prompts[1]).argmax()))
    fed = {r: 0 for r in (0, 2, 3)}
    counts = []
    while any(fed[r] < len(prompts[r]) for r in fed):
        live = [r for r in fed if fed[r] < len(prompts[r])]
        took, logits = rows.prefill_together(
            live, [prompts[r][fed[r] : fed[r] + CHUNK] for r in live]
        )
        counts.append((took, min(len(prompts[r]) - fed[r] for r in live)))
        for r, count, row_logits in zip(live, took, logits):
            fed[r] += count
            if fed[r] == len(prompts[r]):
                first[r] = row_logits
                tokens[r].append(int(row_logits.argmax()))
        if len(tokens[1]) < NEW:
            tokens[1].append(int(rows.step([1], [tokens[1][-1]])[0].argmax()))
    while any(len(t) < NEW for t in tokens.values()):
        live = [r for r in tokens if len(tokens[r]) < NEW]
        for r, row_logits in zip(live, rows.step(live, [tokens[r][-1] for r in live])):
            tokens[r].append(int(row_logits.argmax()))
    return tokens, first, counts


def load(folder, backend: str, tmp_path):
    if backend.startswith("torch-"):
        return lt.load(folder, max_positions=POSITIONS, mode=backend[len("torch-") :])
    if backend == "jax":
        return linnet.jax.load(folder, max_positions=POSITIONS)
    out = linnet.onnx.export(folder, tmp_path / "onnx", max_positions=POSITIONS, progress=False)
    return linnet.onnx.load(out)


@pytest.mark.parametrize("backend", ["torch-interpret", "torch-generated", "jax", "onnx"])
def test_prompts_prefilled_together_give_transformers_greedy_tokens(
    tiny_checkpoint, tmp_path, backend
):
    folder = tiny_checkpoint("llama")
    model = load(folder, backend, tmp_path / backend)
    rng = np.random.default_rng(7)
    vocab = model.config["vocab"]
    prompts = {r: rng.integers(3, vocab, n).tolist() for r, n in LENGTHS.items()}
    rows = model.rows(4, positions=POSITIONS - 1)
    rows.chunk = CHUNK
    tokens, first, counts = schedule(rows, prompts)
    # the calls were shared, and the decoding row's room cut at least one of them short
    assert counts[0] == ([3, 3, 3], 3)
    assert any(took[0] < min(CHUNK, shortest) for took, shortest in counts)
    for r, prompt in prompts.items():
        want = reference_greedy(folder, torch.tensor([prompt]), NEW)[0, len(prompt) :]
        assert tokens[r] == want.tolist(), f"row {r}"
        if r in first:
            ref = reference_logits(folder, torch.tensor([prompt]))[0, -1].numpy()
            assert_close(first[r], ref, atol=F32_TOL, what=f"row {r} first logits")
        assert rows.length(r) == len(prompt) + NEW - 1


@pytest.mark.parametrize("backend", ["torch-generated", "onnx"])
def test_steps_over_the_middle_rows_keep_their_cache(tiny_checkpoint, tmp_path, backend):
    """Rows 1 and 2 of 4 decode alone (a step computes only the span 1..2: a view on
    PyTorch, a slice put back on ONNX) while rows 0 and 3 hold prompts: transformers' greedy
    tokens for all four."""
    folder = tiny_checkpoint("llama")
    model = load(folder, backend, tmp_path / backend)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, model.config["vocab"], n).tolist() for n in (6, 9, 4, 7)]
    rows = model.rows(4, positions=POSITIONS - 1)
    tokens = [[int(rows.prefill(r, p).argmax())] for r, p in enumerate(prompts)]
    for live in ([1, 2],) * (NEW - 1) + ([0, 3],) * (NEW - 1):
        for r, row_logits in zip(live, rows.step(live, [tokens[r][-1] for r in live])):
            tokens[r].append(int(row_logits.argmax()))
    for r, prompt in enumerate(prompts):
        want = reference_greedy(folder, torch.tensor([prompt]), NEW)[0, len(prompt) :]
        assert tokens[r] == want.tolist(), f"row {r}"
