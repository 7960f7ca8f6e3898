"""Real weights: SmolLM2-135M-Instruct (f32) trained by Linnet and by TRL + PEFT on the
project's generated sets, step for step (issue 17). Slow: it takes the SmolLM2 fixture."""

from __future__ import annotations

from linnet.train.adapted import LoraModel
from linnet.train.data import read_jsonl, write_jsonl
from linnet.train.datasets import instruction_pairs, preference_pairs
from linnet.train.loop import TrainConfig
from linnet.train.trainers import dpo_trainer, sft_trainer
from tests.train.test_trl_parity import assert_steps_match
from tests.train.trl_reference import sft_rows, tokenizer, trl_dpo, trl_sft

STEPS, LR = 3, 1e-3


def test_sft_on_smollm2_equals_trl(smollm2_checkpoint, tmp_path):
    rows = sft_rows(instruction_pairs(6, seed=0))
    want = trl_sft(smollm2_checkpoint, rows, tmp_path, steps=STEPS, lr=LR, batch=2)
    model = LoraModel.from_peft(smollm2_checkpoint, tmp_path / "initial")
    data = read_jsonl(write_jsonl(tmp_path / "sft.jsonl", rows), "sft")
    config = TrainConfig(steps=STEPS, lr=LR, batch_size=2)
    got = sft_trainer(model, tokenizer(smollm2_checkpoint), data, config).run()
    assert_steps_match(got, want, first=STEPS)


def test_dpo_on_smollm2_equals_trl(smollm2_checkpoint, tmp_path):
    rows = preference_pairs(6, seed=0)
    want = trl_dpo(smollm2_checkpoint, rows, tmp_path, steps=STEPS, lr=LR, batch=2)
    model = LoraModel.from_peft(smollm2_checkpoint, tmp_path / "initial")
    data = read_jsonl(write_jsonl(tmp_path / "dpo.jsonl", rows), "dpo")
    config = TrainConfig(steps=STEPS, lr=LR, batch_size=2)
    got = dpo_trainer(model, tokenizer(smollm2_checkpoint), data, config, beta=0.1).run()
    assert_steps_match(got, want, first=STEPS)
    assert abs(got[-1] - 0.6931471805599453) > 1e-4  # the policy moved off the reference
