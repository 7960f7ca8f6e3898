"""`SerialRows`, the exact fallback of the row contract, on a Llama and on a Mistral whose
sliding window (8) is shorter than the prompts:
prompts prefilled in chunks into rows, interleaved with steps of the other rows, give each
prompt transformers' greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.checkpoints import reference_greedy

NEW_TOKENS = 10


@pytest.mark.parametrize(
    "arch,variant",
    [("llama", "base"), ("mistral", "base")],
    ids=["llama", "mistral-window-8"],
)
def test_interleaved_rows_give_transformers_greedy_tokens(tiny_checkpoint, arch, variant):
    import linnet.torch
    from linnet.serve.serial_rows import SerialRows

    folder = tiny_checkpoint(arch, variant)
    model = linnet.torch.load(folder, mode="interpret")
    vocab = model.config["vocab"]
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (19, 3, 11)]
    rows = SerialRows(model, 3)
    got = {r: [] for r in range(3)}
    # row 0 prefills in chunks of 7 while rows 1 and 2, already started, keep stepping
    for r in (1, 2):
        got[r].append(int(np.argmax(rows.prefill(r, prompts[r]))))
    for start in range(0, len(prompts[0]), 7):
        logits = rows.prefill(0, prompts[0][start : start + 7])
        step = rows.step([1, 2], [got[1][-1], got[2][-1]])
        for r, row_logits in zip((1, 2), step):
            got[r].append(int(np.argmax(row_logits)))
    got[0].append(int(np.argmax(logits)))
    while min(len(t) for t in got.values()) < NEW_TOKENS:
        live = [r for r in got if len(got[r]) < NEW_TOKENS]
        for r, row_logits in zip(live, rows.step(live, [got[r][-1] for r in live])):
            got[r].append(int(np.argmax(row_logits)))
    for r, prompt in enumerate(prompts):
        want = reference_greedy(folder, torch.tensor([prompt]), NEW_TOKENS)[0, len(prompt) :]
        assert got[r] == want.tolist(), f"row {r}"
        assert rows.length(r) == len(prompt) + NEW_TOKENS - 1  # the last token is not fed


def test_a_freed_row_starts_fresh_and_lengths_are_checked(tiny_checkpoint):
    import linnet.torch
    from linnet.errors import LinnetError
    from linnet.serve.serial_rows import SerialRows

    model = linnet.torch.load(tiny_checkpoint("llama"), mode="interpret")
    rows = SerialRows(model, 2, positions=16)
    first = rows.prefill(0, [5, 6, 7])
    rows.prefill(0, [8, 9])
    rows.free(0)
    assert rows.length(0) == 0
    np.testing.assert_array_equal(rows.prefill(0, [5, 6, 7]), first)
    with pytest.raises(LinnetError, match="pass its 16"):
        rows.prefill(1, list(range(17)))
    with pytest.raises(LinnetError, match="row 2"):
        rows.step([2], [1])
