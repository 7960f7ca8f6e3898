"""The training loop shared by the trainers: AdamW with a linear schedule and gradient
clipping (what transformers' Trainer does by default), batches taken in order and
repeated, periodic evaluation, checkpoints and resume.

    trainer = Trainer(model, loss_fn, batches, TrainConfig(steps=30, lr=2e-4))
    losses = trainer.run()

`loss_fn(model, batch)` returns a scalar tensor. A checkpoint is a folder
`OUT/checkpoint-STEP` with the adapter (PEFT format) and `trainer_state.pt` (optimizer,
schedule, step, losses); `run(resume=True)` continues from the latest one.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from linnet.errors import LinnetError

STATE_FILE = "trainer_state.pt"


@dataclass
class TrainConfig:
    steps: int = 30
    lr: float = 2e-4
    batch_size: int = 2
    max_grad_norm: float = 1.0  # transformers' default; 0 turns clipping off
    weight_decay: float = 0.0
    warmup_steps: int = 0
    eval_every: int = 0  # steps between evaluations; 0: none
    save_every: int = 0  # steps between checkpoints; 0: only at the end (with an out dir)
    out: Path | None = None
    progress: bool = False


def linear_schedule(step: int, warmup: int, total: int) -> float:
    """transformers' `get_linear_schedule_with_warmup` factor."""
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


@dataclass
class Trainer:
    model: object  # a LoraModel: __call__, parameters(), save_adapter
    loss_fn: object
    batches: list
    config: TrainConfig
    eval_batches: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    evals: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.batches:
            raise LinnetError("no training batches: the data gave no rows")
        cfg = self.config
        self.params = self.model.parameters()
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: linear_schedule(s, cfg.warmup_steps, cfg.steps)
        )

    def step(self, batch) -> float:
        self.model.module.train()
        loss = self.loss_fn(self.model, batch)
        loss.backward()
        if self.config.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm)
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad()
        return loss.item()

    def evaluate(self) -> float:
        """The mean loss over the evaluation batches, without gradients or dropout."""
        self.model.module.eval()
        with torch.no_grad():
            values = [self.loss_fn(self.model, b).item() for b in self.eval_batches]
        return sum(values) / len(values)

    def run(self, resume: bool = False) -> list[float]:
        if resume:
            self.resume()
        bar = _progress(self.config, len(self.losses))
        while len(self.losses) < self.config.steps:
            done = len(self.losses)
            self.losses.append(self.step(self.batches[done % len(self.batches)]))
            self._after_step(done + 1, bar)
        if bar is not None:
            bar.close()
        if self.config.out is not None and not _saved(self.config.out, len(self.losses)):
            self.save(len(self.losses))
        return self.losses

    def _after_step(self, step: int, bar) -> None:
        cfg = self.config
        shown = {"loss": f"{self.losses[-1]:.4f}"}
        if cfg.eval_every and self.eval_batches and step % cfg.eval_every == 0:
            self.evals.append((step, self.evaluate()))
            shown["eval"] = f"{self.evals[-1][1]:.4f}"
        if bar is not None:
            bar.set_postfix(shown)
            bar.update(1)
        if cfg.out is not None and cfg.save_every and step % cfg.save_every == 0:
            self.save(step)

    def save(self, step: int) -> Path:
        folder = Path(self.config.out) / f"checkpoint-{step}"
        self.model.save_adapter(folder)
        state = {
            "step": step,
            "losses": self.losses,
            "evals": self.evals,
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
        }
        torch.save(state, folder / STATE_FILE)
        config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.config).items()}
        (folder / "train_config.json").write_text(json.dumps(config, indent=2) + "\n")
        return folder

    def resume(self) -> None:
        """Adapters, optimizer, schedule and losses from the latest checkpoint in `out`."""
        latest = latest_checkpoint(self.config.out)
        if latest is None:
            return
        from linnet.train.peft_format import load_adapter

        names = self.model.program.params
        adapters, _, _ = load_adapter(latest, self.model.wmap(), names)
        params = dict(self.model.module.named_parameters())
        with torch.no_grad():
            for name, tensor in adapters.items():
                params[name].copy_(tensor)
        state = torch.load(latest / STATE_FILE, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.losses, self.evals = list(state["losses"]), [tuple(e) for e in state["evals"]]


def latest_checkpoint(out, state_file: str = STATE_FILE) -> Path | None:
    """The checkpoint of the latest step in `out` that holds `state_file`."""
    if out is None or not Path(out).is_dir():
        return None
    found = [(int(m.group(1)), p) for p in Path(out).iterdir() if (m := _CKPT.fullmatch(p.name))]
    found = [(s, p) for s, p in found if (p / state_file).is_file()]
    return max(found)[1] if found else None


_CKPT = re.compile(r"checkpoint-(\d+)")


def _saved(out, step: int) -> bool:
    return (Path(out) / f"checkpoint-{step}" / STATE_FILE).is_file()


def _progress(config: TrainConfig, start: int):
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.steps, initial=start, desc="train", unit="step")
