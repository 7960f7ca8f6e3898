"""Real weights at q8_0: SmolLM2-135M-Instruct quantized on load (weight-only, packed;
docs/torch.md "Quantized weights") picks transformers' first token (the f32 model) on
every chat prompt."""

from __future__ import annotations

import pytest
import torch

import linnet.backends.torch.quantized as quantized
import linnet.torch as lt
from linnet.backends.torch import kernels
from linnet.backends.torch.quantized import PackedWeight
from tests.checkpoints import load_reference


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
def test_q8_0_first_token_matches_transformers(
    smollm2_checkpoint, chat_prompts, monkeypatch, numerics
):
    """On Linnet's C++ kernel where this CPU runs it: the PyTorch path is made to fail for
    prompts the kernel takes (up to KERNEL_MAX_ROWS tokens). `fast` on a CPU with
    AVX512-VNNI: the integer kernel (x rounded to int8 per 32-block), counted."""
    if kernels.cpu_supported():
        assert kernels.load() is not None, "the C++ kernels did not build (see the warning)"
        assert all(ids.numel() <= quantized.KERNEL_MAX_ROWS for ids in chat_prompts)
        monkeypatch.setattr(quantized, "_blocked_linear", _refuse)
    reference = load_reference(smollm2_checkpoint)
    int8 = []
    offered = kernels.int8x_linear_op
    monkeypatch.setattr(kernels, "int8x_linear_op", lambda: int8.append(offered()) or int8[-1])
    model = lt.load(smollm2_checkpoint, dtype="q8_0", mode="generated", numerics=numerics)
    packed = [n for n, p in model.params.items() if isinstance(p, PackedWeight)]
    assert len(packed) == 1 + 30 * 7  # the tied embedding and every linear of 30 layers
    for ids in chat_prompts:
        ids = ids.reshape(1, -1)
        with torch.no_grad():
            want = reference(input_ids=ids).logits[:, -1].float()
        model.reset()
        got = model.decode(ids, 0)
        delta = (got - want).abs().max().item()
        print(f"{ids.shape[1]} tokens: first token {int(got.argmax())} "
              f"(transformers {int(want.argmax())}), max |Δ| {delta:.3g}")  # fmt: skip
        assert int(got.argmax()) == int(want.argmax())
    # fast asks for the integer kernel, which it gets exactly where the CPU runs one (VNNI or
    # AVX2); `all` of no calls is True, so equivalent must not ask at all
    native = kernels.load() is not None and bool(kernels.load().int8x_native())
    assert bool(int8) == (numerics == "fast")
    if int8:
        assert all(op is not None for op in int8) == native


def _refuse(*args):
    raise AssertionError("the PyTorch path ran where the kernel should have")


def test_q4_k_gguf_imported_packed_equals_dequantized_import(smollm2_checkpoint, tmp_path):
    """SmolLM2's q4_k export (Q4_K where rows are whole 256-blocks: the 30 `down`
    matrices; Q5_0 elsewhere, llama.cpp's fallback) imported packed, every matrix (Q5_0
    5-bit where the integer kernel reads it, else as q8_0), runs the dequantized import's
    model."""
    import linnet.gguf

    gguf = linnet.gguf.export(smollm2_checkpoint, tmp_path / "q4_k.gguf", dtype="q4_k")
    want_model = lt.load(gguf, mode="generated")
    model = lt.load(gguf, dtype="q4_k", mode="generated")
    matrices = [p for p in model.params.values() if p.dim() == 2]
    kinds = [p.kind if isinstance(p, PackedWeight) else "f32" for p in matrices]
    fallback = "q5_0" if kernels.int8x_reads_q5_0() else "q8_0"
    assert kinds.count("q4_k") == 30 and set(kinds) == {"q4_k", fallback}, set(kinds)
    ids = torch.tensor([[1, 4093, 28, 2683, 314, 253, 1345, 30, 2]])
    want, got = want_model.forward(ids), model.forward(ids)
    delta = (got - want).abs().max().item()
    assert delta <= 1e-5 * want.abs().max().item(), delta
