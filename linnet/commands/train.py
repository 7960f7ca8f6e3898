"""`linnet train sft|dpo|grpo NAME_OR_PATH --data FILE.jsonl`: LoRA training from the same
source (docs/training.md), and `linnet train data KIND FILE` to write a generated set.

    linnet train sft path/to/checkpoint --data sft.jsonl --steps 30 --out runs/sft
    linnet train dpo smollm2-135m-instruct --data dpo.jsonl --lora-r 16 --out runs/dpo --resume
"""

from __future__ import annotations

from pathlib import Path

import click

from linnet.errors import LinnetError


@click.group()
def train() -> None:
    """Train LoRA adapters (SFT, DPO, GRPO) with Linnet's PyTorch code, or its JAX code."""


def _options(fn):
    options = [
        click.argument("target"),
        click.option("--data", required=True, type=click.Path(path_type=Path), help="JSONL"),
        click.option("--eval-data", type=click.Path(path_type=Path), help="held-out JSONL"),
        click.option("--lora-r", default=8, show_default=True, type=click.IntRange(1)),
        click.option("--lora-alpha", default=16.0, show_default=True, type=float),
        click.option("--lora-dropout", default=0.0, show_default=True, type=float),
        click.option(
            "--targets",
            default="layers.*.wq,layers.*.wv",
            show_default=True,
            help="comma-separated param patterns the adapters go on",
        ),
        click.option("--steps", default=30, show_default=True, type=click.IntRange(1)),
        click.option("--lr", default=2e-4, show_default=True, type=float),
        click.option("--batch-size", default=2, show_default=True, type=click.IntRange(1)),
        click.option("--eval-every", default=10, show_default=True, type=click.IntRange(0)),
        click.option("--save-every", default=0, show_default=True, type=click.IntRange(0)),
        click.option("--out", type=click.Path(path_type=Path), help="checkpoints and adapter"),
        click.option("--resume", is_flag=True, help="continue from the latest checkpoint"),
        click.option("--seed", default=0, show_default=True, type=int),
        click.option("--quiet", is_flag=True, help="no progress bar"),
        click.option(
            "--backend", type=click.Choice(["torch", "jax"]), default="torch", show_default=True
        ),
        click.option(
            "--checkpoint-layers",
            is_flag=True,
            help="recompute each layer in the backward (torch.utils.checkpoint / jax.checkpoint)",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _setup(o: dict, kind: str):
    """The LoRA model, tokenizer, rows and config that every trainer starts from."""
    import torch

    from linnet.parity import load_tokenizer
    from linnet.targets import locate
    from linnet.train.data import read_jsonl
    from linnet.train.loop import TrainConfig
    from linnet.train.lora import LoraSpec

    if o["resume"] and o["out"] is None:
        raise click.UsageError("--resume needs --out (where the checkpoints are)")
    found = locate(o["target"], identify=False)
    if not found.checkpoint.is_dir():
        raise LinnetError(f"{found.checkpoint}: training needs an HF checkpoint folder")
    rows = read_jsonl(o["data"], kind)
    evals = read_jsonl(o["eval_data"], kind) if o["eval_data"] else []
    torch.manual_seed(o["seed"])
    targets = tuple(t.strip() for t in o["targets"].split(",") if t.strip())
    spec = LoraSpec(targets, o["lora_r"], o["lora_alpha"], o["lora_dropout"])
    model = _model(found.checkpoint, spec, o)
    config = TrainConfig(
        steps=o["steps"],
        lr=o["lr"],
        batch_size=o["batch_size"],
        eval_every=o["eval_every"],
        save_every=o["save_every"],
        out=o["out"],
        progress=not o["quiet"],
    )
    return model, load_tokenizer(found.checkpoint), rows, evals, config


def _model(path, spec, o: dict):
    """A LoraModel (PyTorch) or a JaxLoraModel (`--backend jax`)."""
    if o["backend"] == "jax":
        from linnet.train.jax_train import JaxLoraModel

        return JaxLoraModel.load(path, spec, seed=o["seed"], remat=o["checkpoint_layers"])
    from linnet.train.adapted import LoraModel

    return LoraModel.load(path, spec, seed=o["seed"], checkpoint_layers=o["checkpoint_layers"])


def _finish(trainer, o: dict) -> None:
    losses = trainer.run(resume=o["resume"])
    click.echo(f"step {len(losses)}: loss {losses[-1]:.4f} (first {losses[0]:.4f})")
    click.echo(
        f"trained by {type(trainer).__name__} on {getattr(trainer.model, 'backend', 'torch')}"
    )
    for step, value in trainer.evals:
        click.echo(f"eval at step {step}: loss {value:.4f}")
    if o["out"] is not None:
        path = trainer.model.save_adapter(Path(o["out"]) / "adapter")
        click.echo(f"wrote {path} (PEFT adapter)")


@train.command("sft")
@_options
@click.option("--pack", default=0, show_default=True, type=click.IntRange(0), help="row length")
@click.option("--all-tokens", is_flag=True, help="loss on prompts too (default: completions)")
def sft(**o) -> None:
    """Supervised fine-tuning on {"messages"} or {"prompt", "completion"} rows."""
    from linnet.train.trainers import sft_trainer

    model, tokenizer, rows, evals, config = _setup(o, "sft")
    trainer = sft_trainer(
        model,
        tokenizer,
        rows,
        config,
        completion_only=not o["all_tokens"],
        pack=o["pack"],
        eval_rows=evals,
    )
    _finish(trainer, o)


@train.command("dpo")
@_options
@click.option("--beta", default=0.1, show_default=True, type=float)
def dpo(**o) -> None:
    """Direct preference optimization on {"prompt", "chosen", "rejected"} rows."""
    from linnet.train.trainers import dpo_trainer

    model, tokenizer, rows, evals, config = _setup(o, "dpo")
    trainer = dpo_trainer(model, tokenizer, rows, config, beta=o["beta"], eval_rows=evals)
    _finish(trainer, o)


@train.command("grpo")
@_options
@click.option("--group", default=4, show_default=True, type=click.IntRange(2))
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=1.0, show_default=True, type=float)
@click.option("--beta", default=0.0, show_default=True, type=float, help="KL coefficient")
def grpo(**o) -> None:
    """GRPO on {"prompt", "answer"} rows, rewarded 1 when the first number is the answer."""
    from linnet.commands.run import eos_ids
    from linnet.train.datasets import exact_answer_reward
    from linnet.train.grpo import GrpoSettings
    from linnet.train.trainers import grpo_trainer

    model, tokenizer, rows, _, config = _setup(o, "grpo")
    if any("answer" not in r for r in rows):
        raise LinnetError(f"{o['data']}: every GRPO row needs an 'answer' for the reward")
    settings = GrpoSettings(o["group"], o["max_new_tokens"], o["temperature"], o["beta"])
    eos = eos_ids(Path(model.checkpoint.origin), tokenizer)
    reward = lambda text, row: exact_answer_reward(text, str(row["answer"]))  # noqa: E731
    trainer = grpo_trainer(model, tokenizer, rows, config, reward, settings, eos)
    _finish(trainer, o)
    click.echo(f"mean reward: first step {trainer.rewards[0]:.3f}, last {trainer.rewards[-1]:.3f}")


@train.command("data")
@click.argument("kind", type=click.Choice(["sft", "dpo", "grpo"]))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--count", default=64, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
def data(kind: str, out: Path, count: int, seed: int) -> None:
    """Write a generated JSONL set: instruction pairs, preference pairs or multiplications."""
    from linnet.train import datasets
    from linnet.train.data import write_jsonl

    make = {
        "sft": datasets.instruction_pairs,
        "dpo": datasets.preference_pairs,
        "grpo": datasets.multiplication_prompts,
    }[kind]
    path = write_jsonl(out, make(count, seed))
    click.echo(f"wrote {path}: {count} {kind} rows")
