"""Parity with transformers on tiny random checkpoints of every decoder architecture.

One harness for all: each (architecture, variant) in `TINY_CONFIGS` is built by
transformers itself, loaded by `linnet.torch.load`, and compared on the same
weights: forward logits, greedy tokens, and prefill + decode against forward.
"""

from __future__ import annotations

import pytest
import torch
from linnet.zoo import source_path

import linnet.torch as lt
from tests.checkpoints import (
    PROBE_SHAPE,
    build_tiny,
    probe_ids,
    reference_greedy,
    reference_logits,
    tiny_variants,
)
from tests.numeric import assert_close

F32_TOL = 1e-4
NEW_TOKENS = 8
VARIANTS = tiny_variants()


def _close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> float:
    """Assert shape, then dtype, then values (NaN fails); return max |Δ|."""
    return assert_close(got, want, atol=tol, what=name, dtype=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache: dict = {}

    def get(arch: str, variant: str):
        if (arch, variant) not in cache:
            path = build_tiny(arch, variant, tmp_path_factory.mktemp(f"{arch}-{variant}"))
            cache[arch, variant] = (path, lt.load(path, dtype="f32"))
        return cache[arch, variant]

    return get


@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_forward_matches_transformers(built, arch, variant):
    path, model = built(arch, variant)
    ids = probe_ids(model.config["vocab"])
    delta = _close("forward logits", model.forward(ids), reference_logits(path, ids), F32_TOL)
    print(f"{arch}/{variant}: forward max |Δ| = {delta:.3g}")


@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_greedy_tokens_match_transformers(built, arch, variant):
    path, model = built(arch, variant)
    ids = probe_ids(model.config["vocab"], (1, 12), seed=3)
    want = reference_greedy(path, ids, NEW_TOKENS)
    assert want.shape[1] > ids.shape[1], "the reference generated nothing"
    # transformers may stop at the config's EOS; compare the tokens it did produce
    got = model.generate(ids, NEW_TOKENS)[:, : want.shape[1]]
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_prefill_then_decode_equals_forward(built, arch, variant):
    _, model = built(arch, variant)
    ids = probe_ids(model.config["vocab"])
    full = model.forward(ids)
    prefill = PROBE_SHAPE[1] - 6
    model.reset()
    steps = [model.decode(ids[:, :prefill], 0)]
    for pos in range(prefill, PROBE_SHAPE[1]):
        if pos + 1 < PROBE_SHAPE[1]:
            steps.append(model.decode(ids[:, pos : pos + 1], pos))
    # step k holds the logits of position prefill - 1 + k
    for k, logits in enumerate(steps):
        _close(f"decode step {k}", logits, full[:, prefill - 1 + k], F32_TOL)


def test_decode_chunks_equal_forward(built):
    """Prefill in uneven chunks (S > 1 at P > 0) crosses Mistral's window too."""
    _, model = built("MistralForCausalLM", "base")
    ids = probe_ids(model.config["vocab"])
    full = model.forward(ids)
    model.reset()
    bounds = [0, 5, 6, 13, PROBE_SHAPE[1]]
    for lo, hi in zip(bounds, bounds[1:]):
        _close(f"chunk {lo}:{hi}", model.decode(ids[:, lo:hi], lo), full[:, hi - 1], F32_TOL)


def test_window_matters(built):
    """A sliding window shorter than the sequence changes the output (so it is tested)."""
    path, model = built("MistralForCausalLM", "base")
    assert model.config["window"] and model.config["window"] < PROBE_SHAPE[1]
    ids = probe_ids(model.config["vocab"])
    unwindowed = lt.load_source(
        source_path("llama"), dict(model.config, window=0), dict(model.params)
    )
    assert (unwindowed.forward(ids) - model.forward(ids)).abs().max() > 1e-3
