"""LoRA training on JAX (issue 17): `jax.grad` through the generated JAX forward, optax
AdamW. Per-step SFT and DPO losses against TRL + PEFT from PEFT's own initial adapter (as
tests/train/test_trl_parity.py does for PyTorch), one step's LoRA gradients against PEFT,
and rematerialisation: the same gradients with fewer saved residuals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from linnet.backends.jax.codegen import generate_entries, prepare
from linnet.train.jax_train import JaxLoraModel, jax_sft_loss, mark_layer_outputs
from linnet.train.loop import TrainConfig
from linnet.train.lora import LoraSpec
from linnet.train.peft_format import PEFT_PREFIX
from linnet.train.trainers import dpo_trainer, sft_trainer
from tests.numeric import assert_close
from tests.train.test_lora import peft_model, probe
from tests.train.test_trl_parity import LR, assert_steps_match, linnet_rows
from tests.train.trl_reference import (
    chat_rows,
    sft_rows,
    tiny_with_tokenizer,
    tokenizer,
    trl_dpo,
    trl_sft,
)


@pytest.fixture(scope="module")
def chat_model(tiny_checkpoint, tmp_path_factory):
    return tiny_with_tokenizer(tiny_checkpoint, tmp_path_factory.mktemp("chat-jax"))


@pytest.mark.parametrize("pack,completion_only", [(0, True), (32, False)], ids=["padded", "packed"])
def test_jax_sft_losses_equal_trl(chat_model, tmp_path, pack, completion_only):
    rows = sft_rows(chat_rows(24))
    kw = dict(steps=4, lr=LR, batch=2)
    want = trl_sft(chat_model, rows, tmp_path, pack=pack, completion_only=completion_only, **kw)
    model = JaxLoraModel.from_peft(chat_model, tmp_path / "initial")
    config = TrainConfig(steps=4, lr=LR, batch_size=2)
    data = linnet_rows(tmp_path, rows, "sft")
    trainer = sft_trainer(
        model, tokenizer(chat_model), data, config, completion_only=completion_only, pack=pack
    )
    got = trainer.run()
    assert type(trainer).__name__ == "JaxTrainer" and len(want) == 4
    assert_steps_match(got, want)
    assert len(set(round(x, 3) for x in got)) > 1  # the losses move


def test_jax_dpo_losses_equal_trl(chat_model, tmp_path):
    rows = chat_rows(24, seed=1)
    want = trl_dpo(chat_model, rows, tmp_path, steps=4, lr=LR, batch=2, beta=0.1)
    model = JaxLoraModel.from_peft(chat_model, tmp_path / "initial")
    config = TrainConfig(steps=4, lr=LR, batch_size=2)
    data = linnet_rows(tmp_path, rows, "dpo")
    got = dpo_trainer(model, tokenizer(chat_model), data, config, beta=0.1).run()
    assert len(want) == 4
    assert_steps_match(got, want)
    assert abs(got[0] - 0.6931471805599453) < 1e-6  # log 2: the policy starts as the reference


def test_jax_lora_gradients_match_peft(tiny_checkpoint, tmp_path):
    path = tiny_checkpoint("LlamaForCausalLM", "base")
    peft = peft_model(path)
    peft.save_pretrained(tmp_path / "peft")
    ids = probe(1)
    out = peft(input_ids=ids, labels=ids)
    out.loss.backward()
    model = JaxLoraModel.from_peft(path, tmp_path / "peft")
    batch = (jnp.asarray(ids.numpy(), jnp.int32),) * 2
    loss, grads = jax.value_and_grad(lambda a: jax_sft_loss(model, a, batch))(model.adapters)
    assert_close(float(loss), out.loss.item(), atol=1e-5 * out.loss.item(), what="loss")
    want = {
        n.removeprefix(PEFT_PREFIX): p.grad
        for n, p in peft.named_parameters()
        if p.grad is not None
    }
    assert len(want) == 8
    for name, grad in want.items():
        module, _, kind = name.rpartition(".lora_")
        layer = module.split(".")[2]
        proj = {"q_proj": "wq", "v_proj": "wv"}[module.rpartition(".")[2]]
        mine = np.asarray(grads[f"layers.{layer}.{proj}_lora_{kind[0].lower()}"])
        scale = grad.abs().max().item()
        assert scale > 0, name
        assert_close(mine / scale, grad.numpy() / scale, atol=1e-4, what=f"{name} gradient")


def residual_bytes(model: JaxLoraModel, batch) -> int:
    """Bytes the VJP keeps from the forward for the backward (its closure's arrays)."""
    _, vjp = jax.vjp(lambda a: jax_sft_loss(model, a, batch), model.adapters)
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(vjp))


def test_remat_gives_the_same_gradients_and_keeps_less(tiny_checkpoint):
    path = tiny_checkpoint("LlamaForCausalLM", "base")
    spec = LoraSpec(("layers.*.wq", "layers.*.wv"), r=4, alpha=8.0)
    plain = JaxLoraModel.load(path, spec, seed=3)
    remat = JaxLoraModel.load(path, spec, seed=3, remat=True)
    gen = np.random.default_rng(4)  # B random too: at init it is zero
    adapters = {
        n: jnp.asarray(gen.normal(size=v.shape) * 0.1, v.dtype) for n, v in plain.adapters.items()
    }
    plain.adapters = remat.adapters = adapters
    ids = jnp.asarray(probe(5, (2, 16)).numpy(), jnp.int32)
    batch = (ids, ids)
    want = jax.grad(lambda a: jax_sft_loss(plain, a, batch))(adapters)
    got = jax.grad(lambda a: jax_sft_loss(remat, a, batch))(adapters)
    for name in adapters:
        scale = float(jnp.abs(want[name]).max())
        assert scale > 0, name
        assert_close(got[name] / scale, want[name] / scale, atol=1e-6, what=f"{name} gradient")
    assert residual_bytes(remat, batch) < residual_bytes(plain, batch)


def test_remat_marks_one_output_per_layer(tiny_checkpoint):
    from linnet.weights.checkpoint import open_checkpoint

    path = tiny_checkpoint("LlamaForCausalLM", "base")
    ck = open_checkpoint(path, dtype="f32")
    program = ck.source.program(ck.config)
    entry = prepare(program, "forward")
    text = generate_entries(program, {"forward": entry}, "equivalent", {})
    marked = mark_layer_outputs(text, entry.graph)
    assert marked.count('"linnet_layer")') == ck.hf_config["num_hidden_layers"]


def test_jax_adapter_saves_in_peft_format_with_peft_logits(tiny_checkpoint, tmp_path):
    """A JAX-trained adapter goes through the same PEFT writer: PEFT's logits equal JAX's."""
    from peft import PeftModel

    from tests.train.test_lora import fresh_reference

    path = tiny_checkpoint("LlamaForCausalLM", "base")
    model = JaxLoraModel.load(path, LoraSpec(("layers.*.wq",), r=4, alpha=8.0))
    gen = np.random.default_rng(6)
    model.adapters = {
        n: jnp.asarray(gen.normal(size=v.shape) * 0.1, v.dtype) for n, v in model.adapters.items()
    }
    ids = probe(2)
    folder = model.save_adapter(tmp_path / "adapter")
    peft = PeftModel.from_pretrained(fresh_reference(path), folder, trust_remote_code=False)
    with torch.no_grad():
        want = peft(input_ids=ids).logits.numpy()
    got = np.asarray(model(ids))
    scale = np.abs(want).max()
    assert_close(got / scale, want / scale, atol=1e-5, what="logits")


def test_jax_resume_continues_as_one_run(chat_model, tmp_path):
    """A JAX run stopped after a checkpoint and resumed gives the uninterrupted run's
    losses and adapters (the optimizer state and schedule come back, not only the
    adapters), in the PyTorch trainer's checkpoint layout."""
    import shutil

    rows = [{k: r[k] for k in ("prompt", "completion")} for r in chat_rows(12)]
    spec = LoraSpec(("layers.*.wq", "layers.*.wv"), r=4, alpha=8.0)

    def run(out, resume=False):
        model = JaxLoraModel.load(chat_model, spec, seed=0)
        config = TrainConfig(steps=6, lr=1e-2, batch_size=2, save_every=3, out=out)
        trainer = sft_trainer(model, tokenizer(chat_model), rows, config)
        return trainer.run(resume=resume), model.torch_adapters()

    straight, adapters = run(tmp_path / "a")
    assert (tmp_path / "a" / "checkpoint-3" / "adapter_model.safetensors").is_file()
    shutil.rmtree(tmp_path / "a" / "checkpoint-6")  # as if stopped after step 3
    resumed, again = run(tmp_path / "a", resume=True)
    assert_close(torch.tensor(resumed), torch.tensor(straight), atol=0, rtol=1e-6, what="loss")
    moved = False
    for name, tensor in adapters.items():
        assert_close(again[name], tensor, atol=1e-7, rtol=1e-5, what=name)
        moved |= bool(tensor.abs().max() > 0) and "lora_b" in name
    assert moved  # B starts at zero: it trained
