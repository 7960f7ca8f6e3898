"""Every tiny decoder on a CUDA device against transformers on the same device and weights
(marked `gpu`: skips without CUDA, run by a session lent a GPU, docs/testing.md).

The CPU suite proves parity on the host; a GPU runs other kernels (cuBLAS, SDPA's CUDA
backends, a captured decode step), so the same bounds are checked there: f32 logits of the
probe batch, and the greedy tokens of a batch of two and of one row (cudagraphs captures a
step per batch shape and per cache, so a second answer of the same shape is checked too).
"""

from __future__ import annotations

import pytest
import torch

import linnet.torch as lt
from tests.tiny_decoders import load_reference, probe_ids, tiny_variants

CUDA_REASON = "parity on a GPU needs a CUDA device"
# (mode, numerics) -> the f32 logit bound, the CPU suite's (tests/backends/test_torch_backend.py)
MODES = {
    ("generated", "equivalent"): 1e-4,
    ("generated", "fast"): 1e-3,
    ("cudagraphs", "equivalent"): 1e-4,
}
NEW_TOKENS = 8


@torch.no_grad()
def _greedy(model, ids):
    return model.generate(
        ids, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
        pad_token_id=0,
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=CUDA_REASON)
@pytest.mark.parametrize("mode,numerics", list(MODES), ids=lambda v: str(v))
@pytest.mark.parametrize("arch,variant", tiny_variants(), ids=lambda v: str(v))
def test_tiny_decoder_on_cuda_matches_transformers(tiny_checkpoint, arch, variant, mode, numerics):
    folder = tiny_checkpoint(arch, variant)
    ref = load_reference(folder, "cuda")
    ids = probe_ids(ref.config.vocab_size).cuda()
    model = lt.load(folder, dtype="f32", device="cuda", mode=mode, numerics=numerics)
    with torch.no_grad():
        expected = ref(input_ids=ids).logits.float()
    delta = float((model.forward(ids).float() - expected).abs().max())
    assert delta <= MODES[(mode, numerics)], f"max |logit delta| {delta:.3g}"
    # batch 2, then batch 1 (a new capture), then batch 1 again over a new cache
    for rows in (ids, ids[:1], ids[:1]):
        assert model.generate(rows, NEW_TOKENS).tolist() == _greedy(ref, rows).tolist()
