"""The LM head cut off the training module (linnet/train/head.py) and the shared-prompt
rollouts (linnet/train/rollout.py), issue 17: the log-probs, losses and LoRA gradients
computed at the read positions only equal those of the whole forward's logits (the module
with its head, `cut_head=False`), for SFT's labels, DPO's reference and GRPO's tempered
completions; a group sampled from one prefill draws the tokens `generate` draws."""

from __future__ import annotations

import pytest
import torch

from linnet.train.adapted import LoraModel
from linnet.train.datasets import exact_answer_reward, final_answer
from linnet.train.grpo import GrpoLoss, GrpoSettings, completion_logps
from linnet.train.head import split_head
from linnet.train.lora import LoraSpec
from linnet.train.objectives import mean_nll, sft_loss, token_logps
from linnet.train.rollout import sample_group
from linnet.train.tokens import IGNORE
from tests.numeric import assert_close

SPEC = LoraSpec(("layers.*.wq", "layers.*.wv"), r=4, alpha=8.0)


def pair(folder, spec=SPEC):
    """The same adapters (random, so B is not zero) on a cut and an uncut model."""
    cut = LoraModel.load(folder, spec, seed=3)
    gen = torch.Generator().manual_seed(4)
    adapters = {n: torch.randn(p.shape, generator=gen) * 0.1 for n, p in cut.adapters().items()}
    uncut = LoraModel.load(folder, spec, adapters=adapters, cut_head=False)
    with torch.no_grad():
        for name, p in cut.module.named_parameters():
            if name in adapters:
                p.copy_(adapters[name])
    return cut, uncut


def labelled(seed=0, shape=(3, 14)):
    """Ids and labels: a different labelled span per row, the last columns unlabelled."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 256, shape, generator=gen)
    labels = torch.full(shape, IGNORE)
    for row, (start, end) in enumerate([(3, 9), (5, 11), (2, 4)]):
        labels[row, start:end] = ids[row, start:end]
    return ids, labels


def grads(model) -> dict:
    out = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
    model.module.zero_grad()
    return out


def assert_grads_equal(got: dict, want: dict):
    assert got.keys() == want.keys() and want
    for name in want:
        scale = want[name].abs().max().item()
        assert scale > 0, name
        assert_close(got[name], want[name], atol=1e-5 * scale, rtol=0, what=name)


@pytest.mark.parametrize("variant", ["base", "tied"])
def test_cut_model_gives_the_whole_forward(tiny_checkpoint, variant):
    cut, uncut = pair(tiny_checkpoint("llama", variant))
    assert cut.head is not None and uncut.head is None
    assert cut.head_spec.weight == ("embed" if variant == "tied" else "lm_head")
    ids, labels = labelled()
    want = uncut(ids)
    assert_close(cut(ids), want, atol=1e-5 * want.abs().max().item(), rtol=0, what="logits")
    assert_close(cut.reference(ids), uncut.reference(ids), atol=1e-5 * want.abs().max().item(),
                 rtol=0, what="reference logits")  # fmt: skip


@pytest.mark.parametrize("variant", ["base", "tied"])
def test_sft_loss_and_gradients_at_labelled_rows(tiny_checkpoint, variant):
    cut, uncut = pair(tiny_checkpoint("llama", variant))
    ids, labels = labelled()
    want = sft_loss(uncut(ids), labels)
    want.backward()
    got = mean_nll(*cut.label_logps(ids, labels))
    got.backward()
    assert_close(got, want, atol=1e-6 * abs(want.item()), rtol=0, what="SFT loss")
    assert_grads_equal(grads(cut), grads(uncut))
    picked, mask = cut.label_logps(ids, labels, reference=True)
    want_picked, want_mask = token_logps(uncut.reference(ids), labels)
    assert torch.equal(mask, want_mask) and not picked.requires_grad
    assert_close(picked, want_picked, atol=1e-5, rtol=1e-5, what="reference log-probs")


def test_sequence_sums_weighted_per_row(tiny_checkpoint):
    """A per-row weighting of the summed log-probs (what DPO's loss does) has the gradients
    of the whole forward's: each row's gradient reaches its own hidden states only."""
    cut, uncut = pair(tiny_checkpoint("llama", "tied"))
    ids, labels = labelled(1)
    weights = torch.tensor([0.7, -1.3, 2.0])
    want = (token_logps(uncut(ids), labels)[0].sum(1) * weights).sum()
    want.backward()
    got = (cut.label_logps(ids, labels)[0].sum(1) * weights).sum()
    got.backward()
    assert_close(got, want, atol=1e-5 * abs(want.item()), rtol=0, what="weighted sums")
    assert_grads_equal(grads(cut), grads(uncut))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_logps_and_gradients(tiny_checkpoint, temperature):
    cut, uncut = pair(tiny_checkpoint("llama", "base"))
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(2, 256, (4, 13), generator=gen)
    completion = ids[:, -5:]
    upstream = torch.randn(4, 5, generator=gen)
    want = completion_logps(uncut(ids), completion, temperature)
    (want * upstream).sum().backward()
    got = cut.completion_logps(ids, completion, temperature)
    (got * upstream).sum().backward()
    assert_close(got, want, atol=1e-5, rtol=1e-5, what="completion log-probs")
    assert_grads_equal(grads(cut), grads(uncut))
    ref = cut.completion_logps(ids, completion, temperature, reference=True)
    want_ref = completion_logps(uncut.reference(ids), completion, temperature)
    assert_close(ref, want_ref, atol=1e-5, rtol=1e-5, what="reference log-probs")


@pytest.mark.parametrize("variant,width", [("base", 5), ("tied", 5), ("base", 1)])
def test_shared_prompt_runs_once(tiny_checkpoint, variant, width):
    """A group's rows that share their prompt (GRPO's): the prompt runs once at batch 1
    through the adapted `decode` and its cache serves every row (train/prefix.py), with
    the whole forward's log-probs and LoRA gradients, and the reference's log-probs."""
    cut, uncut = pair(tiny_checkpoint("llama", variant))
    gen = torch.Generator().manual_seed(6)
    prompt = torch.randint(2, 256, (1, 9), generator=gen).repeat(4, 1)
    completion = torch.randint(2, 256, (4, width), generator=gen)
    ids = torch.cat([prompt, completion], dim=1)
    upstream = torch.randn(4, width, generator=gen)
    want = completion_logps(uncut(ids), completion, 0.7)
    (want * upstream).sum().backward()
    got = cut.completion_logps(ids, completion, 0.7)
    (got * upstream).sum().backward()
    assert_close(got, want, atol=1e-5, rtol=1e-5, what="completion log-probs")
    assert_grads_equal(grads(cut), grads(uncut))
    shapes = calls(cut._prefix[False])
    with torch.no_grad():
        cut.completion_logps(ids, completion, 0.7)
    assert shapes == [(1, 9)] + ([(4, width - 1)] if width > 1 else [])  # the prompt once
    ref = cut.completion_logps(ids, completion, 0.7, reference=True)
    want_ref = completion_logps(uncut.reference(ids), completion, 0.7)
    assert cut._prefix[True] is not None
    assert_close(ref, want_ref, atol=1e-5, rtol=1e-5, what="reference log-probs")


def calls(runner) -> list:
    """The token shapes `runner`'s decode is called with, from now on."""
    shapes, decode = [], runner.module.decode
    runner.module.decode = lambda tokens, *a, **k: (
        shapes.append(tuple(tokens.shape)) or decode(tokens, *a, **k)
    )
    return shapes


@pytest.mark.parametrize("variant", ["base", "tied"])
def test_shared_start_of_dpo_rows_runs_once(tiny_checkpoint, variant):
    """DPO's rows (chosen, rejected; pairs of a batch) share their chat template's start:
    it runs once at batch 1, the rows' rest at batch 4 (train/prefix.py), with the whole
    forward's log-probs and LoRA gradients; the reference's too, its start's cache kept."""
    cut, uncut = pair(tiny_checkpoint("llama", variant))
    gen = torch.Generator().manual_seed(8)
    ids = torch.cat([torch.randint(2, 256, (1, 12), generator=gen).repeat(4, 1),
                     torch.randint(2, 256, (4, 9), generator=gen)], dim=1)  # fmt: skip
    labels = torch.full(ids.shape, IGNORE)
    for row, (start, end) in enumerate([(13, 18), (14, 20), (12, 16), (15, 19)]):
        labels[row, start:end] = ids[row, start:end]  # the last column unlabelled
    weights = torch.tensor([0.7, -1.3, 2.0, 0.4])
    want = token_logps(uncut(ids), labels)[0]
    (want.sum(1) * weights).sum().backward()
    got, mask = cut.label_logps(ids, labels)
    (got.sum(1) * weights).sum().backward()
    assert_close(got, want, atol=1e-5, rtol=1e-5, what="labelled log-probs")
    assert torch.equal(mask, labels[:, 1:] != IGNORE)
    assert_grads_equal(grads(cut), grads(uncut))
    shapes = calls(cut._prefix[False])
    with torch.no_grad():
        cut.label_logps(ids, labels)
    assert shapes == [(1, 12), (4, 19 - 12)]  # the start once, the rest to the last label
    want_ref = token_logps(uncut.reference(ids), labels)[0]
    ref = cut.label_logps(ids, labels, reference=True)[0]
    shapes = calls(cut._prefix[True])
    again = cut.label_logps(ids, labels, reference=True)[0]
    assert_close(ref, want_ref, atol=1e-5, rtol=1e-5, what="reference log-probs")
    assert torch.equal(again, ref) and not again.requires_grad
    assert shapes == [(4, 7)]  # the reference's start ran once, its cache kept


def test_a_trained_head_is_not_cut(tiny_checkpoint):
    folder = tiny_checkpoint("llama", "base")
    model = LoraModel.load(folder, LoraSpec(("layers.*.wq", "lm_head"), r=2))
    assert model.head is None  # its LoRA branch sits after the linear: no plain tail
    program = LoraModel.load(folder, SPEC).program
    cut, spec = split_head(program)
    assert spec.weight == "lm_head" and spec.dtype == "f32"
    assert not any(n.op == "linear" and n.inputs[1] is cut.graphs["forward"].params["lm_head"]
                   for n in cut.graphs["forward"].nodes)  # fmt: skip


def test_group_from_one_prefill_draws_what_generate_draws(tiny_checkpoint):
    model = LoraModel.load(tiny_checkpoint("llama", "tied"), SPEC)
    decoder = model.sampler(positions=32)
    prompt = [5, 17, 99, 3, 41, 8]
    want = decoder.generate(torch.tensor([prompt] * 5), 7, do_sample=True, temperature=8.0,
                            generator=torch.Generator().manual_seed(11))  # fmt: skip
    got = sample_group(decoder, prompt, 5, 7, eos=[], temperature=8.0,
                       generator=torch.Generator().manual_seed(11))  # fmt: skip
    assert got.shape == (5, 7)
    assert torch.equal(got, want[:, len(prompt) :])
    assert len({tuple(r) for r in got.tolist()}) > 1  # the rows were sampled apart


@pytest.mark.parametrize("variant", ["base", "tied"])
def test_rollout_starts_from_the_loss_prompt_pass(tiny_checkpoint, variant):
    """GRPO's rollout and loss share one prompt pass (`prompt_pass`): the decoder filled
    from it draws the tokens of its own prefill, and the loss's log-probs and gradients
    from it are those of the shared-prompt runner's own pass; the prompt runs once."""
    model, _ = pair(tiny_checkpoint("llama", variant))
    prompt = [5, 17, 99, 3, 41, 8, 23, 77]
    decoder = model.sampler(positions=32)
    want = sample_group(decoder, prompt, 5, 7, eos=[], temperature=8.0,
                        generator=torch.Generator().manual_seed(11))  # fmt: skip
    ran = model.prompt_pass(prompt)
    got = sample_group(decoder, prompt, 5, 7, eos=[], temperature=8.0,
                       generator=torch.Generator().manual_seed(11),
                       prefilled=lambda d: model.prefill(d, ran, len(prompt)))  # fmt: skip
    assert torch.equal(got, want) and len({tuple(r) for r in got.tolist()}) > 1
    ids = torch.cat([torch.tensor([prompt] * 5), got], dim=1)
    upstream = torch.randn(got.shape, generator=torch.Generator().manual_seed(2))
    expected = model.completion_logps(ids, got, 0.7)
    (expected * upstream).sum().backward()
    want_grads = grads(model)
    shapes = calls(model._prefix[False])
    logps = model.completion_logps(ids, got, 0.7, ran=ran)
    (logps * upstream).sum().backward()
    assert shapes == [(5, 6)]  # only the completions: the prompt ran in `prompt_pass`
    assert_close(logps, expected, atol=1e-6, rtol=0, what="log-probs")
    assert_grads_equal(grads(model), want_grads)


def test_reward_reads_the_final_answer():
    assert final_answer("7 x 5 = 35") == "35"
    assert exact_answer_reward("7 x 5 = 35", "35") == 1.0
    assert exact_answer_reward("7 x 5 = 35", "7") == 0.0
    assert exact_answer_reward("Answer: 1,234. Since 617 x 2", "1234") == 1.0
    assert exact_answer_reward("The answer is 40, I think 35", "40") == 1.0
    assert exact_answer_reward("It is 36.", "35") == 0.0
    assert exact_answer_reward("no idea", "35") == 0.0


class WordTokenizer:
    """One word per id; id 0 is the end of sequence (a special token, dropped)."""

    words = ["<eos>", "7 x 5 = 35", " and", " 12"]

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(self.words[i] for i in row if i or not skip_special_tokens) for row in rows]


def test_rewards_read_each_completion_up_to_its_end():
    """A row that ended keeps being sampled while the others run; that tail is no answer."""
    loss = GrpoLoss(WordTokenizer(), None, GrpoSettings(group=2), eos=[0])
    texts = loss.completion_texts(torch.tensor([[1, 0, 2, 3], [1, 2, 3, 0]]))
    assert texts == ["7 x 5 = 35", "7 x 5 = 35 and 12"]
    assert [exact_answer_reward(t, "35") for t in texts] == [1.0, 0.0]
