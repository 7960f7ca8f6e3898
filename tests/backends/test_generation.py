"""generate() on every backend (one loop, `linnet/generation.py`): greedy equals
transformers, sampling is reproducible from its seed and top_k=1 is greedy, and an EOS
token stops every row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import linnet.jax
import linnet.onnx
import linnet.torch
from tests.checkpoints import probe_ids, reference_greedy

NEW = 6


@pytest.fixture(scope="module")
def models(tiny_checkpoint, tmp_path_factory):
    folder = tiny_checkpoint("llama", "base")
    out = linnet.onnx.export(folder, tmp_path_factory.mktemp("gen") / "onnx", progress=False)
    return folder, {
        "torch": linnet.torch.load(folder),
        "jax": linnet.jax.load(folder),
        "onnx": linnet.onnx.load(out),
    }


def seeded(backend: str, seed: int) -> dict:
    return (
        {"generator": torch.Generator().manual_seed(seed)} if backend == "torch" else {"seed": seed}
    )


@pytest.mark.parametrize("backend", ["torch", "jax", "onnx"])
def test_greedy_equals_transformers(models, backend):
    folder, by_backend = models
    ids = probe_ids(256, (2, 7), seed=11)
    want = reference_greedy(folder, ids, NEW)
    got = by_backend[backend].generate(ids.numpy(), NEW)
    assert np.asarray(got).tolist() == want.tolist()


@pytest.mark.parametrize("backend", ["torch", "jax", "onnx"])
def test_sampling_is_seeded_and_top1_is_greedy(models, backend):
    _, by_backend = models
    model = by_backend[backend]
    ids = probe_ids(256, (2, 5), seed=12).numpy()
    sample = dict(do_sample=True, temperature=5.0)
    first = np.asarray(model.generate(ids, NEW, **sample, **seeded(backend, 1)))
    again = np.asarray(model.generate(ids, NEW, **sample, **seeded(backend, 1)))
    other = [np.asarray(model.generate(ids, NEW, **sample, **seeded(backend, s))) for s in (2, 3)]
    assert (first == again).all()
    assert any((first != o).any() for o in other)  # hot sampling wanders off greedy
    greedy = np.asarray(model.generate(ids, NEW))
    top1 = np.asarray(model.generate(ids, NEW, do_sample=True, top_k=1, **seeded(backend, 4)))
    assert (top1 == greedy).all()


@pytest.mark.parametrize("backend", ["torch", "jax", "onnx"])
def test_eos_stops_when_every_row_has_ended(models, backend):
    _, by_backend = models
    model = by_backend[backend]
    ids = probe_ids(256, (1, 5), seed=13).numpy()
    greedy = np.asarray(model.generate(ids, NEW))
    stop = int(greedy[0, 5 + 2])  # the third new token
    seen = []
    out = np.asarray(model.generate(ids, NEW, eos_token_id=stop, on_token=seen.append))
    first = list(greedy[0, 5:]).index(stop)
    assert out.shape[1] == 5 + first + 1 and int(out[0, -1]) == stop
    assert len(seen) == first + 1


@pytest.mark.parametrize("mode", ["interpret", "generated"])
def test_only_the_entries_asked_for_are_loaded(models, mode):
    """`entries=["decode"]` (what `linnet run` loads): generation is transformers' greedy,
    the other entries are absent with an error that says so, and a name the source lacks
    is refused at load."""
    from linnet.errors import LinnetError

    folder, _ = models
    model = linnet.torch.load(folder, mode=mode, entries=["decode"])
    assert model.entries == ["decode"] and list(model.runner.inputs) == ["decode"]
    ids = probe_ids(256, (2, 7), seed=11)
    assert model.generate(ids, NEW).tolist() == reference_greedy(folder, ids, NEW).tolist()
    with pytest.raises(LinnetError, match="`forward` was not loaded"):
        model.forward(ids)
    with pytest.raises(LinnetError, match="no entry nope"):
        linnet.torch.load(folder, entries=["decode", "nope"])
