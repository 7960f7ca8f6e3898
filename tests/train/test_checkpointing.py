"""Activation checkpointing per layer on PyTorch (issue 17): each outlined layer call runs
under torch.utils.checkpoint. The gradients must equal the plain module's, the layers must
really run again in the backward, and the forward must keep fewer tensors for it."""

from __future__ import annotations

import torch

from linnet.train.adapted import LoraModel
from linnet.train.lora import LoraSpec
from linnet.train.module import layer_methods
from linnet.train.objectives import sft_loss
from tests.numeric import assert_close

SPEC = LoraSpec(("layers.*.wq", "layers.*.wv", "layers.*.down"), r=4, alpha=8.0)


def randomized(model: LoraModel, seed=5) -> LoraModel:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def probe(seed=0, shape=(2, 16)):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=gen)


def count_calls(model: LoraModel, helper: str) -> list[int]:
    """Count the calls of a prelude helper inside the generated module (its globals)."""
    namespace = type(model.module).forward.__globals__
    original, calls = namespace[helper], [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    namespace[helper] = counted
    return calls


def saved_bytes_and_loss(model: LoraModel, ids) -> tuple[int, torch.Tensor]:
    """Bytes autograd keeps from the forward for the backward (outside checkpoints), the
    module's own params and buffers (alive anyway) left out."""
    saved = [0]
    own = {t.data_ptr() for t in [*model.module.parameters(), *model.module.buffers()]}

    def pack(t):
        if t.data_ptr() not in own:
            saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = sft_loss(model(ids), ids)
    return saved[0], loss


def gradients(model: LoraModel) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.module.named_parameters() if p.requires_grad}


def test_checkpointed_layers_give_the_same_gradients_and_recompute(tiny_checkpoint):
    path = tiny_checkpoint("LlamaForCausalLM", "base")
    plain = randomized(LoraModel.load(path, SPEC))
    checked = randomized(LoraModel.load(path, SPEC, checkpoint_layers=True))
    assert layer_methods(checked.module) and not layer_methods(plain.module)
    layers = plain.checkpoint.hf_config["num_hidden_layers"]
    norms = count_calls(checked, "rms_norm_ref")
    ids = probe()
    plain_bytes, plain_loss = saved_bytes_and_loss(plain, ids)
    checked_bytes, checked_loss = saved_bytes_and_loss(checked, ids)
    forward_norms = norms[0]
    assert forward_norms == 2 * layers + 1  # two per layer and the final norm
    plain_loss.backward()
    checked_loss.backward()
    assert norms[0] - forward_norms == 2 * layers  # every layer ran again in the backward
    assert checked_bytes < plain_bytes / 2, (checked_bytes, plain_bytes)
    assert_close(checked_loss, plain_loss, atol=1e-6, what="loss")
    want, got = gradients(plain), gradients(checked)
    assert sorted(got) == sorted(want) and len(want) == 3 * 2 * layers
    for name, grad in want.items():
        scale = grad.abs().max().item()
        assert scale > 0, name
        assert_close(got[name] / scale, grad / scale, atol=1e-6, what=f"{name} gradient")


def test_checkpointed_layers_keep_lora_dropout_in_training_only(tiny_checkpoint):
    """Dropout is written into the outlined layer method too, and the recompute in the
    backward draws the same mask (torch restores the RNG state), so gradients match."""
    path = tiny_checkpoint("LlamaForCausalLM", "base")
    spec = LoraSpec(("layers.*.wq",), r=4, alpha=8.0, dropout=0.5)
    plain = randomized(LoraModel.load(path, spec))
    checked = randomized(LoraModel.load(path, spec, checkpoint_layers=True))
    ids = probe(1)
    checked.module.eval()
    with torch.no_grad():
        first = checked(ids)
    checked.module.train()
    plain.module.train()
    torch.manual_seed(7)
    plain_loss = sft_loss(plain(ids), ids)
    torch.manual_seed(7)
    checked_loss = sft_loss(checked(ids), ids)
    with torch.no_grad():
        assert not torch.allclose(checked(ids), first, atol=1e-3)  # dropout is on
    plain_loss.backward()
    checked_loss.backward()
    assert_close(checked_loss, plain_loss, atol=1e-6, what="loss with dropout")
    want, got = gradients(plain), gradients(checked)
    for name, grad in want.items():
        scale = grad.abs().max().item()
        assert_close(got[name] / scale, grad / scale, atol=1e-6, what=f"{name} gradient")
