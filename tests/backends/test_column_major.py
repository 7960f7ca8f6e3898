"""Large f32 linear weights on the CPU held column-major in generated code
(linnet/backends/torch/runners.py: column_major_linears; docs/gpt-oss.md "Benchmark"):
only a weight that nothing but `linear` reads moves, the model's logits stay transformers'."""

from __future__ import annotations

import pytest
import torch

import linnet.torch as lt
from linnet.backends.torch import runners
from tests.numeric import assert_close
from tests.tiny_decoders import probe_ids, reference_logits
from tests.tiny_gpt_oss import build_gpt_oss


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_gpt_oss("spread", tmp_path_factory.mktemp("gpt-oss-layout"))


def _is_column_major(w: torch.Tensor) -> bool:
    return w.stride() == (1, w.shape[0])


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
    ids = probe_ids(256)
    want = reference_logits(folder, ids)
    assert_close(model.forward(ids), want, atol=1e-4, what="forward")
    model.reset()
    last = model.decode(ids[:, :10], 0)
    for pos in range(10, ids.shape[1]):
        last = model.decode(ids[:, pos : pos + 1], pos)
        assert_close(last, want[:, pos], atol=1e-4, what=f"decode at {pos}")


def test_below_the_threshold_nothing_moves(folder):
    model = lt.load(folder, dtype="f32", mode="generated")
    assert all(p.is_contiguous() for p in model.runner.module.parameters())
