"""Gradients through the generated PyTorch code against transformers' autograd on the same
tiny random checkpoints (issue 17): every param's gradient of one causal-LM loss, mapped to
HF names through the weights map, within 1e-4 relative (f32)."""

from __future__ import annotations

import pytest
import torch

from linnet.train.module import trainable_module
from linnet.weights.checkpoint import open_checkpoint
from linnet.weights.maps.loading import find_weights_map
from tests.checkpoints import load_reference

VARIANTS = [
    ("LlamaForCausalLM", "base"),
    ("LlamaForCausalLM", "tied"),
    ("Qwen2ForCausalLM", "base"),
]


def causal_loss(logits, ids):
    vocab = logits.shape[-1]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1)
    )


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def linnet_grads(path, ids, trainable=lambda name: True):
    ck = open_checkpoint(path, dtype="f32")
    module = trainable_module(ck.source.program(ck.config), ck.torch_params(), trainable=trainable)
    loss = causal_loss(module(ids), ids)
    loss.backward()
    grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    return loss, grads, module


def reference_grads(path, ids):
    ref = load_reference(path)
    ref.zero_grad()
    with torch.enable_grad():
        out = ref(input_ids=ids, labels=ids)
        out.loss.backward()
    grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    ref.zero_grad()
    return out.loss, grads


@pytest.mark.parametrize("arch,variant", VARIANTS, ids=lambda x: x)
def test_every_gradient_matches_transformers(tiny_checkpoint, arch, variant):
    path = tiny_checkpoint(arch, variant)
    ids = torch.randint(0, 150, (2, 16), generator=torch.Generator().manual_seed(0))
    loss, grads, _ = linnet_grads(path, ids)
    ref_loss, ref = reference_grads(path, ids)
    assert relative_error(loss.detach(), ref_loss.detach()) <= 1e-5
    hf = find_weights_map(arch).to_hf(grads)
    assert set(hf) <= set(ref) and len(hf) >= len(ref) - 1  # a tied head: one name fewer
    for name, grad in hf.items():
        err = relative_error(grad, ref[name])
        assert err <= 1e-4, f"{name}: relative gradient error {err}"


def test_frozen_params_get_no_gradient_and_inputs_stay(tiny_checkpoint):
    path = tiny_checkpoint("LlamaForCausalLM", "base")
    ids = torch.randint(0, 200, (1, 8), generator=torch.Generator().manual_seed(1))
    ck = open_checkpoint(path, dtype="f32")
    params = ck.torch_params()
    before = params["layers.0.wq"].clone()
    module = trainable_module(
        ck.source.program(ck.config), params, trainable=lambda n: n == "layers.0.wq"
    )
    causal_loss(module(ids), ids).backward()
    with torch.no_grad():
        module.layers[0].wq.add_(1.0)  # an optimizer step on the trained copy
    got = {n for n, p in module.named_parameters() if p.grad is not None}
    assert got == {"layers.0.wq"}
    torch.testing.assert_close(params["layers.0.wq"], before, rtol=0, atol=0)
