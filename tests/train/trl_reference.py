"""TRL + PEFT runs on a tiny checkpoint with the settings Linnet's trainers mirror: LoRA
(dropout 0) on q and v, AdamW, linear schedule, clipping at 1.0, f32 on the CPU, batches
in file order. Each records the loss of every step (full precision, not the rounded log)
and saves PEFT's initial adapter so that Linnet starts from the same weights."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from tests.tiny_tokenizer import add_tiny_tokenizer

LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
PAD = "w1"


def tiny_with_tokenizer(tiny_checkpoint, tmp_path: Path) -> Path:
    import shutil

    folder = tmp_path / "tiny-chat"
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM", "base"), folder)
    return add_tiny_tokenizer(folder, chat=True)


def words(rng: random.Random, count: int) -> str:
    return " ".join(f"w{rng.randrange(2, 256)}" for _ in range(count))


def chat_rows(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        prompt = [{"role": "user", "content": words(rng, rng.randrange(3, 9))}]
        rows.append(
            {
                "prompt": prompt,
                "completion": [{"role": "assistant", "content": words(rng, rng.randrange(2, 7))}],
                "chosen": [{"role": "assistant", "content": words(rng, rng.randrange(2, 7))}],
                "rejected": [{"role": "assistant", "content": words(rng, rng.randrange(2, 7))}],
            }
        )
    return rows


def tokenizer(folder):
    """The tiny tokenizer with a pad token (TRL needs one; padding is never labelled)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    if tok.pad_token is None:
        tok.pad_token = PAD if PAD in tok.get_vocab() else tok.eos_token
    return tok


def _recording(base):
    class Recording(base):
        recorded: list

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training:
                loss = out[0] if isinstance(out, tuple) else out
                self.recorded.append(loss.detach().item())
            return out

    return Recording


def common_args(out: Path, steps: int, lr: float, batch: int) -> dict:
    return dict(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=lr,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_grad_norm=1.0,
        weight_decay=0.0,
        train_sampling_strategy="sequential",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
    )


def _run(trainer_cls, config, folder, rows, adapter_dir: Path) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    )
    trainer = _recording(trainer_cls)(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer(folder),
        peft_config=LoraConfig(**LORA),
    )
    trainer.recorded = []
    trainer.model.save_pretrained(adapter_dir)  # the initial adapter, for Linnet
    trainer.train()
    return trainer.recorded


def sft_rows(rows, messages=False) -> list[dict]:
    """Prompt-completion rows, or with `messages` the whole conversation in one field."""
    if messages:
        return [{"messages": r["prompt"] + r["completion"]} for r in rows]
    return [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows]


def trl_sft(folder, rows, out: Path, *, steps, lr, batch, pack=0, completion_only=True):
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(
        **common_args(out / "run", steps, lr, batch),
        packing=bool(pack),
        packing_strategy="wrapped",
        max_length=pack or 128,
        completion_only_loss=completion_only,
    )
    return _run(SFTTrainer, config, folder, rows, out / "initial")


def trl_dpo(folder, rows, out: Path, *, steps, lr, batch, beta=0.1):
    from trl import DPOConfig, DPOTrainer

    rows = [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows]
    config = DPOConfig(
        **common_args(out / "run", steps, lr, batch),
        beta=beta,
        loss_type=["sigmoid"],
        max_length=128,
    )
    return _run(DPOTrainer, config, folder, rows, out / "initial")


def trl_grpo_trainer(folder, out: Path, *, group, beta, temperature, completion_length):
    """TRL's GRPOTrainer over a PEFT LoRA model (its reward and data unused: the test
    hands `_compute_loss` fixed completions)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        **common_args(out / "run", 1, 1e-3, group),
        num_generations=group,
        beta=beta,
        temperature=temperature,
        max_completion_length=completion_length,
        loss_type="dapo",
    )
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    )
    prompt = [{"role": "user", "content": "w5 w6"}]
    return GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=config,
        train_dataset=Dataset.from_list([{"prompt": prompt}] * group),
        processing_class=tokenizer(folder),
        peft_config=LoraConfig(**LORA),
    )
