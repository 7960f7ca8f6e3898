"""LoRA as a program transform against PEFT on tiny random checkpoints (issue 17): adapters
saved by Linnet load in PEFT with the same logits, PEFT's own adapters load in Linnet, one
step's LoRA gradients equal PEFT's, a merged export reloads in transformers."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from linnet.errors import LinnetError
from linnet.train.adapted import LoraModel
from linnet.train.lora import LoraSpec
from linnet.train.peft_format import PEFT_PREFIX

SPEC = LoraSpec(("layers.*.wq", "layers.*.wv", "layers.1.down"), r=4, alpha=8.0)


def fresh_reference(path):
    """A transformers model of its own (PEFT injects its layers into the model it wraps)."""
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    ).eval()


def probe(seed=0, shape=(2, 12)):
    return torch.randint(0, 150, shape, generator=torch.Generator().manual_seed(seed))


def randomized(model: LoraModel, seed=3) -> LoraModel:
    """Adapters drawn at random (B is zero at init, which would hide a wrong B)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def assert_logits_close(got, want):
    scale = want.abs().max()
    torch.testing.assert_close(got / scale, want / scale, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", ["base", "tied"])
def test_saved_adapter_loads_in_peft_with_same_logits(tiny_checkpoint, tmp_path, variant):
    from peft import PeftModel

    path = tiny_checkpoint("LlamaForCausalLM", variant)
    model = randomized(LoraModel.load(path, SPEC))
    ids = probe()
    folder = model.save_adapter(tmp_path / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert "model.layers.1.self_attn.v_proj" in config["target_modules"]
    assert "model.layers.0.mlp.down_proj" not in config["target_modules"]
    peft = PeftModel.from_pretrained(fresh_reference(path), folder, trust_remote_code=False)
    with torch.no_grad():
        want = peft(input_ids=ids).logits
        base = peft.get_base_model()
        with peft.disable_adapter():
            want_base = base(input_ids=ids).logits
        got = model(ids)
    assert_logits_close(got, want)
    assert_logits_close(model.reference(ids), want_base)
    assert not torch.allclose(got, want_base, atol=1e-3)  # the adapters change the logits


def peft_model(path, seed=3):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], bias="none"
    )
    peft = get_peft_model(fresh_reference(path), config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return peft


def test_peft_adapter_loads_in_linnet_and_gradients_match(tiny_checkpoint, tmp_path):
    path = tiny_checkpoint("LlamaForCausalLM", "base")
    peft = peft_model(path)
    peft.save_pretrained(tmp_path / "peft")
    model = LoraModel.from_peft(path, tmp_path / "peft")
    assert sorted(model.targets) == ["layers.0.wq", "layers.0.wv", "layers.1.wq", "layers.1.wv"]
    ids = probe(1)
    out = peft(input_ids=ids, labels=ids)
    out.loss.backward()
    logits = model(ids)
    vocab = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1)
    )
    loss.backward()
    assert_logits_close(logits.detach(), out.logits.detach())
    want = {
        n.removeprefix(PEFT_PREFIX): p.grad
        for n, p in peft.named_parameters()
        if p.grad is not None
    }
    got = dict(model.module.named_parameters())
    assert len(want) == 8
    for name, grad in want.items():
        module, _, kind = name.rpartition(".lora_")
        layer = module.split(".")[2]
        proj = {"q_proj": "wq", "v_proj": "wv"}[module.rpartition(".")[2]]
        mine = got[f"layers.{layer}.{proj}_lora_{kind[0].lower()}"].grad
        err = ((mine - grad).abs().max() / grad.abs().max()).item()
        assert err <= 1e-4, f"{name}: relative gradient error {err}"


def test_merged_export_reloads_in_transformers(tiny_checkpoint, tmp_path):
    path = tiny_checkpoint("LlamaForCausalLM", "base")
    model = randomized(LoraModel.load(path, SPEC))
    ids = probe(2)
    out = model.export_merged(tmp_path / "merged")
    merged = fresh_reference(out)
    with torch.no_grad():
        assert_logits_close(merged(input_ids=ids).logits, model(ids))
        base = fresh_reference(path)
        same = (
            merged.model.layers[0].mlp.down_proj.weight == base.model.layers[0].mlp.down_proj.weight
        )
        assert bool(same.all())  # untouched weights stay bit-exact
        moved = (
            merged.model.layers[0].self_attn.q_proj.weight
            - base.model.layers[0].self_attn.q_proj.weight
        )
        assert moved.abs().max() > 1e-3


def test_dropout_only_in_training_mode(tiny_checkpoint):
    path = tiny_checkpoint("LlamaForCausalLM", "base")
    spec = LoraSpec(("layers.*.wq",), r=4, alpha=8.0, dropout=0.5)
    model = randomized(LoraModel.load(path, spec))
    ids = probe(3)
    model.module.eval()
    with torch.no_grad():
        first, second = model(ids), model(ids)
        torch.testing.assert_close(first, second, rtol=0, atol=0)
        model.module.train()
        dropped = model(ids)
    assert not torch.allclose(first, dropped, atol=1e-3)


def test_targets_that_match_nothing_or_cannot_be_saved_are_refused(tiny_checkpoint):
    path = tiny_checkpoint("LlamaForCausalLM", "base")
    with pytest.raises(LinnetError, match=r"'layers\.\*\.q_proj' matches no linear weight"):
        LoraModel.load(path, LoraSpec(("layers.*.q_proj",)))
    with pytest.raises(LinnetError, match="rank r=0"):
        LoraSpec(("layers.*.wq",), r=0)
