"""`linnet train` as a user calls it, the generated sets, bad data named by line, and
checkpoints with resume (issue 17)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from click.testing import CliRunner

from linnet.cli import main
from linnet.train.adapted import LoraModel
from linnet.train.data import DataError, read_jsonl, write_jsonl
from linnet.train.datasets import exact_answer_reward, multiplication_prompts
from linnet.train.loop import TrainConfig
from linnet.train.lora import LoraSpec
from linnet.train.trainers import sft_trainer
from tests.train.trl_reference import chat_rows, tiny_with_tokenizer, tokenizer


@pytest.fixture(scope="module")
def chat_model(tiny_checkpoint, tmp_path_factory):
    return tiny_with_tokenizer(tiny_checkpoint, tmp_path_factory.mktemp("chat"))


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("kind", ["sft", "dpo", "grpo"])
def test_generated_sets_read_back(tmp_path, kind):
    result = invoke("train", "data", kind, tmp_path / "d.jsonl", "--count", 12)
    assert result.exit_code == 0, result.output
    rows = read_jsonl(tmp_path / "d.jsonl", kind)
    assert len(rows) == 12
    assert len({json.dumps(r["prompt"]) for r in rows}) > 1


def test_multiplication_answers_are_products():
    for row in multiplication_prompts(20, seed=3):
        words = row["prompt"][0]["content"].replace("?", "").split()
        a, b = int(words[2]), int(words[4])
        assert row["answer"] == str(a * b)
        assert exact_answer_reward(f"It is {a * b}.", row["answer"]) == 1.0
        assert exact_answer_reward(f"It is {a * b + 1}.", row["answer"]) == 0.0


BAD = {
    "missing": ('{"prompt": [{"role": "user", "content": "w3"}]}', r"d\.jsonl:2: missing field"),
    "not json": ("{not json", r"d\.jsonl:2: not JSON"),
    "no role": ('{"messages": [{"content": "w3"}]}', r"d\.jsonl:2: messages\[0\] has no 'role'"),
    "too long": (None, r"d\.jsonl:2: \d+ tokens, longer than the model's 128 positions"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_rows_are_named_by_line(chat_model, tmp_path, case):
    line, message = BAD[case]
    if line is None:
        long = " ".join(f"w{i % 250 + 2}" for i in range(200))
        line = json.dumps({"messages": [{"role": "user", "content": long}]})
    good = json.dumps({"messages": [{"role": "user", "content": "w5 w6"}]})
    (tmp_path / "d.jsonl").write_text(good + "\n" + line + "\n")
    result = invoke(
        "train", "sft", chat_model, "--data", tmp_path / "d.jsonl", "--steps", 1, "--quiet"
    )
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    import re

    assert re.search(message, result.output), result.output


def test_empty_file_is_refused(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match=r"d\.jsonl: the data file is empty"):
        read_jsonl(tmp_path / "d.jsonl", "dpo")


def test_sft_command_writes_checkpoints_and_a_peft_adapter(chat_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = write_jsonl(
        tmp_path / "sft.jsonl", [{k: r[k] for k in ("prompt", "completion")} for r in chat_rows(8)]
    )
    out = tmp_path / "run"
    args = ["--data", data, "--eval-data", data, "--steps", 4, "--save-every", 2, "--lr", 1e-2]
    result = invoke("train", "sft", chat_model, *args, "--eval-every", 2, "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert "eval at step 4" in result.output
    assert (out / "checkpoint-2" / "trainer_state.pt").is_file()
    base = AutoModelForCausalLM.from_pretrained(
        chat_model, dtype=torch.float32, trust_remote_code=False
    )
    peft = PeftModel.from_pretrained(base, out / "adapter", trust_remote_code=False)
    moved = [p for n, p in peft.named_parameters() if "lora_B" in n]
    assert moved and all(p.abs().max() > 0 for p in moved)  # B starts at zero: it trained


def test_resume_continues_as_one_run(chat_model, tmp_path):
    rows = [{k: r[k] for k in ("prompt", "completion")} for r in chat_rows(12)]
    spec = LoraSpec(("layers.*.wq", "layers.*.wv"), r=4, alpha=8.0)

    def run(out, resume=False):
        model = LoraModel.load(chat_model, spec, seed=0)
        config = TrainConfig(steps=6, lr=1e-2, batch_size=2, save_every=3, out=out)
        trainer = sft_trainer(model, tokenizer(chat_model), rows, config)
        return trainer.run(resume=resume), model.adapters()

    straight, adapters = run(tmp_path / "a")
    shutil.rmtree(tmp_path / "a" / "checkpoint-6")  # as if stopped after step 3
    resumed, again = run(tmp_path / "a", resume=True)
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(straight), rtol=1e-6, atol=0)
    for name, tensor in adapters.items():
        torch.testing.assert_close(again[name], tensor, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend,trainer", [("torch", "Trainer"), ("jax", "JaxGrpoTrainer")])
def test_grpo_command_runs_on_generated_multiplications(chat_model, tmp_path, backend, trainer):
    data = tmp_path / "grpo.jsonl"
    assert invoke("train", "data", "grpo", data, "--count", 4).exit_code == 0
    args = ["--data", data, "--steps", 2, "--group", 2, "--max-new-tokens", 3, "--quiet"]
    result = invoke("train", "grpo", chat_model, *args, "--backend", backend)
    assert result.exit_code == 0, result.output
    assert f"trained by {trainer} on {backend}" in result.output
    assert "mean reward: first step 0.000" in result.output  # random weights never multiply


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_jax_backend_command_trains_as_the_torch_one(chat_model, tmp_path, kind):
    """`--backend jax` (with remat) prints the losses PyTorch (with checkpointed layers)
    prints, within 1e-4 relative, and writes an adapter that PEFT loads and that moved."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = tmp_path / f"{kind}.jsonl"
    assert invoke("train", "data", kind, data, "--count", 8).exit_code == 0
    args = ["--data", data, "--steps", 3, "--lr", 1e-2, "--quiet", "--checkpoint-layers"]
    shown = {}
    for backend in ("torch", "jax"):
        out = tmp_path / backend
        result = invoke("train", kind, chat_model, *args, "--backend", backend, "--out", out)
        assert result.exit_code == 0, result.output
        assert f"on {backend}" in result.output
        line = next(x for x in result.output.splitlines() if x.startswith("step 3: loss"))
        shown[backend] = [float(x) for x in re.findall(r"\d+\.\d+", line)]  # last, first
    assert len(shown["jax"]) == len(shown["torch"]) == 2
    for got, want in zip(shown["jax"], shown["torch"]):
        assert abs(got - want) <= 1e-4 * abs(want), shown
    base = AutoModelForCausalLM.from_pretrained(
        chat_model, dtype=torch.float32, trust_remote_code=False
    )
    peft = PeftModel.from_pretrained(base, tmp_path / "jax" / "adapter", trust_remote_code=False)
    moved = [p for n, p in peft.named_parameters() if "lora_B" in n]
    assert moved and all(p.abs().max() > 0 for p in moved)
