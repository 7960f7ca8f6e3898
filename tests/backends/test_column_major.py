"""Large f32 linear weights on the CPU held column-major in generated code
(linnet/backends/torch/runners.py: column_major_linears; docs/gpt-oss.md "Benchmark"):
only a weight that nothing but `linear` reads moves, the model's logits stay transformers'."""

from __future__ import annotations

import pytest
import torch

import linnet.torch as lt
from linnet.backends.torch import kernels, runners
from tests.numeric import assert_close
from tests.tiny_decoders import probe_ids, reference_logits
from tests.tiny_gpt_oss import build_gpt_oss


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_gpt_oss("spread", tmp_path_factory.mktemp("gpt-oss-layout"))


def _is_column_major(w: torch.Tensor) -> bool:
    return w.stride() == (1, w.shape[0])


def _matches_transformers(model, folder, ids) -> None:
    """Forward, the prefill of 10 tokens and every later decode step within 1e-4."""
    want = reference_logits(folder, ids)
    assert_close(model.forward(ids), want, atol=1e-4, what="forward")
    model.reset()
    last = model.decode(ids[:, :10], 0)
    assert_close(last, want[:, 9], atol=1e-4, what="prefill")
    for pos in range(10, ids.shape[1]):
        last = model.decode(ids[:, pos : pos + 1], pos)
        assert_close(last, want[:, pos], atol=1e-4, what=f"decode at {pos}")


def test_lm_head_column_major_embedding_not_logits_unchanged(folder, monkeypatch):
    """The tiny vocabulary (256) over the lowered threshold: lm_head moves, the embedding
    (gathered by token) and the small projections stay row-major; forward and each decode
    step within 1e-4 of transformers."""
    monkeypatch.setattr(runners, "COLUMN_MAJOR_MIN_ROWS", 256)
    model = lt.load(folder, dtype="f32", mode="generated")
    module = model.runner.module
    assert _is_column_major(module.lm_head)
    assert model.params["lm_head"].data_ptr() == module.lm_head.data_ptr()  # held once
    assert module.embed.is_contiguous()
    moved = [n for n, p in module.named_parameters() if p.dim() == 2 and not p.is_contiguous()]
    assert moved == ["lm_head"]
    _matches_transformers(model, folder, probe_ids(256))


def test_below_the_threshold_nothing_moves(folder):
    model = lt.load(folder, dtype="f32", mode="generated")
    assert all(p.is_contiguous() for p in model.runner.module.parameters())


def test_tall_projections_move_with_their_parts_wide_ones_stay(folder, monkeypatch):
    """Over the lowered tall threshold: the fused qkv (taller than wide) moves, and its parts
    q, k, v stay views of it (held once: the module's and the model's params alike); the
    square o projection and the embedding stay row-major; logits within 1e-4 of
    transformers for the forward and every decode step."""
    monkeypatch.setattr(runners, "COLUMN_MAJOR_MIN_TALL", 1024)
    model = lt.load(folder, dtype="f32", mode="generated")
    layer = model.runner.module.layers[0]
    assert layer.wq_wk_wv.shape[0] > layer.wq_wk_wv.shape[1]
    assert _is_column_major(layer.wq_wk_wv)
    whole = layer.wq_wk_wv
    for part, lo in (("wq", 0), ("wk", layer.wq.shape[0])):
        got = getattr(layer, part)
        assert got.data_ptr() == whole[lo:].data_ptr() and got.stride() == whole.stride()
        assert model.params[f"layers.0.{part}"].data_ptr() == got.data_ptr()
    assert layer.wo.shape[0] == layer.wo.shape[1] and layer.wo.is_contiguous()
    assert model.runner.module.embed.is_contiguous()
    _matches_transformers(model, folder, probe_ids(256))


def test_tied_head_moves_with_its_embedding(tmp_path, monkeypatch, amd_tuning):
    """A tied lm_head (SmolLM2-like): the one weight that `linear` and the embedding's
    `take` both read moves (held once), the gather reads its rows strided, and forward,
    prefill, every decode step and the greedy tokens stay transformers'. Where Linnet's
    f32 GEMV reads decode's linears (AMD's choices, kernels/cpu_tuning.h) every f32 weight
    stays row-major instead, with the same tokens."""
    from tests.tiny_decoders import build_tiny, reference_greedy

    monkeypatch.setattr(runners, "COLUMN_MAJOR_MIN_ROWS", 256)
    tied = build_tiny("llama", "tied", tmp_path)
    model = lt.load(tied, dtype="f32", mode="generated", numerics="fast")
    embed = model.runner.module.embed
    assert model.params["embed"].data_ptr() == embed.data_ptr()
    moved = [n for n, w in model.runner.module.state_dict().items() if _is_column_major(w)]
    if kernels.f32_gemv_preferred():
        assert embed.is_contiguous() and not moved
    else:
        assert _is_column_major(embed)
    vocab = embed.shape[0]
    _matches_transformers(model, tied, probe_ids(vocab))
    prompt = probe_ids(vocab, (1, 8), seed=5)
    assert model.generate(prompt, 6).tolist() == reference_greedy(tied, prompt, 6).tolist()
