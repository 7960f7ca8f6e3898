"""LoRA training on SmolLM2-135M-Instruct's real weights (issue 17): SFT, DPO and GRPO, each
by Linnet (PyTorch; JAX for SFT and DPO) and by TRL + PEFT, with the same data, the same
initial adapter (PEFT's, saved once), seed, hyperparameters and step count.

    python bench/train.py                        # everything, writes bench/results/training.json
    python bench/train.py --only sft --methods linnet-torch,trl

Each run is a process of its own (peak RSS is the process's): it records each step's loss
and wall time (the first step apart: it holds JAX's compile), tokens per second (the
positions of the batch, padding included, per steady step), peak RSS, and saves its adapter.
One evaluator then scores every adapter on the held-out rows: Linnet's PyTorch loss (SFT:
mean NLL of completions; DPO: the sigmoid loss against the base), the same code for all.
GRPO reports the mean reward per step (1-digit multiplications, exact-answer reward).
The loss-curve plot needs matplotlib (`--plot`); without it the plot is skipped and said so.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import machine, provenance, versions  # noqa: E402

KINDS = ("sft", "dpo", "grpo")
BOTH = ("linnet-torch", "trl", "linnet-jax")  # JAX last: its compile is the longest
METHODS = {"sft": BOTH, "dpo": BOTH, "grpo": BOTH}
SETTINGS = dict(
    r=8, alpha=16, targets=["q_proj", "v_proj"], lr=1e-3, batch=2, seed=0, pack=64,
    steps={"sft": 4, "dpo": 3, "grpo": 3}, train_rows=8, heldout_rows=4, beta=0.1,
    group=4, max_new_tokens=6, temperature=1.0, digits=1,
)  # fmt: skip
LINNET_TARGETS = ("layers.*.wq", "layers.*.wv")


def rows_for(kind: str, count: int, seed: int) -> list[dict]:
    from linnet.train import datasets

    if kind == "sft":
        return datasets.instruction_pairs(count, seed)
    if kind == "dpo":
        return datasets.preference_pairs(count, seed)
    return datasets.multiplication_prompts(count, seed, digits=SETTINGS["digits"])


def initial_adapter(checkpoint: Path, out: Path) -> Path:
    """PEFT's initial adapter for the settings (seeded), the start of every run."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SETTINGS["seed"])
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32, trust_remote_code=False
    )
    config = LoraConfig(r=SETTINGS["r"], lora_alpha=SETTINGS["alpha"], lora_dropout=0.0,
                        target_modules=SETTINGS["targets"])  # fmt: skip
    get_peft_model(model, config).save_pretrained(out)
    return out


# -- the workers: one process per (kind, method) -------------------------------------------


def timed(step, times: list, cpu: list):
    """`step` recording its wall time and its thread's CPU time (with one PyTorch thread
    the whole step runs on this thread; CPU time is what a shared machine's load distorts
    least)."""

    def run(batch):
        start, start_cpu = time.perf_counter(), time.thread_time()
        loss = step(batch)
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        return loss

    return run


def linnet_run(kind: str, method: str, checkpoint: Path, initial: Path, out: Path) -> dict:
    import torch

    from linnet.commands.run import eos_ids
    from linnet.parity import load_tokenizer
    from linnet.train.datasets import exact_answer_reward
    from linnet.train.grpo import GrpoSettings
    from linnet.train.loop import TrainConfig
    from linnet.train.trainers import dpo_trainer, grpo_trainer, sft_trainer

    torch.manual_seed(SETTINGS["seed"])
    tok = load_tokenizer(checkpoint)
    if method == "linnet-jax":
        from linnet.train.jax_train import JaxLoraModel as Model
    else:
        from linnet.train.adapted import LoraModel as Model
    model = Model.from_peft(checkpoint, initial)
    s = SETTINGS
    config = TrainConfig(steps=s["steps"][kind], lr=s["lr"], batch_size=s["batch"])
    rows = rows_for(kind, s["train_rows"], s["seed"])
    if kind == "sft":
        trainer = sft_trainer(model, tok, rows, config, pack=s["pack"])
    elif kind == "dpo":
        trainer = dpo_trainer(model, tok, rows, config, beta=s["beta"])
    else:
        config.batch_size = 1  # one prompt, `group` completions per step
        grpo = GrpoSettings(s["group"], s["max_new_tokens"], s["temperature"], 0.0)
        reward = lambda text, row: exact_answer_reward(text, row["answer"])  # noqa: E731
        trainer = grpo_trainer(model, tok, rows, config, reward, grpo, eos_ids(checkpoint, tok))
    times: list[float] = []
    cpu: list[float] = []
    trainer.step = timed(trainer.step, times, cpu)
    losses = trainer.run()
    shapes = [b[0].shape for b in trainer.batches[: len(losses)]] if kind != "grpo" else []
    tokens = [int(rows) * int(width) for rows, width in shapes]
    model.save_adapter(out / "adapter")
    return {"losses": losses, "step_times": times, "step_cpu": cpu, "tokens": tokens,
            "rewards": list(getattr(trainer, "rewards", []))}  # fmt: skip


def trl_run(kind: str, checkpoint: Path, initial: Path, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, TrainerCallback

    from tests.train.trl_reference import _recording, common_args, tokenizer

    torch.manual_seed(SETTINGS["seed"])
    s = SETTINGS
    base = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    )
    model = PeftModel.from_pretrained(base, initial, is_trainable=True, trust_remote_code=False)
    args = common_args(out / "run", s["steps"][kind], s["lr"], s["batch"])
    rows = rows_for(kind, s["train_rows"], s["seed"])
    trainer_cls, config, extra = _trl_config(kind, args)
    times: list[float] = []
    cpu: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start, self.start_cpu = time.perf_counter(), time.thread_time()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)
            cpu.append(time.thread_time() - self.start_cpu)

    trainer = _recording(trainer_cls)(
        model=model, args=config, train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer(checkpoint), callbacks=[Clock()], **extra,
    )  # fmt: skip
    trainer.recorded = []
    trainer.train()
    model.save_pretrained(out / "adapter")
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"losses": trainer.recorded, "step_times": times, "step_cpu": cpu, "tokens": [],
            "rewards": rewards}  # fmt: skip


def _trl_config(kind: str, args: dict):
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from linnet.train.datasets import exact_answer_reward

    s = SETTINGS
    if kind == "sft":
        config = SFTConfig(**args, packing=True, packing_strategy="wrapped",
                           max_length=s["pack"], completion_only_loss=True)  # fmt: skip
        return SFTTrainer, config, {}
    if kind == "dpo":
        config = DPOConfig(**args, beta=s["beta"], loss_type=["sigmoid"], max_length=512)
        return DPOTrainer, config, {}
    args["per_device_train_batch_size"] = s["group"]  # one prompt's group per step
    config = GRPOConfig(**args, num_generations=s["group"], beta=0.0,
                        temperature=s["temperature"], max_completion_length=s["max_new_tokens"],
                        loss_type="dapo")  # fmt: skip

    def reward(completions, answer, **kw):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [exact_answer_reward(t, a) for t, a in zip(texts, answer)]

    return GRPOTrainer, config, {"reward_funcs": reward}


def worker(kind: str, method: str, checkpoint: Path, initial: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if method == "trl":
        result = trl_run(kind, checkpoint, initial, out)
    else:
        result = linnet_run(kind, method, checkpoint, initial, out)
    result["wall_s"] = time.perf_counter() - start
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (out / "result.json").write_text(json.dumps(result))


# -- the GRPO reward run: does the mean reward rise? --------------------------------------

GRPO_RUN = dict(
    steps=20, group=8, max_new_tokens=8, temperature=1.0, lr=1e-3, prompts_per_step=1,
    beta=0.0, digits=1, r=8, alpha=16, seed=0, eval_prompts=8,
)  # fmt: skip


def reward_rate(model, tok, rows, eos, settings, seed: int) -> float:
    """Mean exact-answer reward of `group` samples per row (no training), seeded."""
    import torch

    from linnet.train.grpo import GrpoLoss

    sampler = GrpoLoss(tok, None, settings, eos)
    sampler.generator.manual_seed(seed)
    scores = []
    for row in rows:
        prompt = _prompt_ids(tok, row)
        with torch.no_grad():
            texts = sampler.completion_texts(sampler.sample(model, prompt))
        scores += [_reward(t, row) for t in texts]
    return sum(scores) / len(scores)


def _prompt_ids(tok, row):
    from linnet.train.tokens import chat_ids

    return chat_ids(tok, row["prompt"], generation_prompt=True)


def _reward(text, row):
    from linnet.train.datasets import exact_answer_reward

    return exact_answer_reward(text, row["answer"])


def grpo_reward_run(checkpoint: Path, steps: int) -> dict:
    """Linnet's PyTorch GRPO on SmolLM2, one prompt's group per step: each step's mean
    reward, loss and time, and the reward rate of held-out prompts before and after."""
    from linnet.commands.run import eos_ids
    from linnet.parity import load_tokenizer
    from linnet.train.adapted import LoraModel
    from linnet.train.datasets import multiplication_prompts
    from linnet.train.grpo import GrpoSettings
    from linnet.train.loop import TrainConfig
    from linnet.train.lora import LoraSpec
    from linnet.train.trainers import grpo_trainer

    g = GRPO_RUN
    tok = load_tokenizer(checkpoint)
    eos = eos_ids(checkpoint, tok)
    spec = LoraSpec(LINNET_TARGETS, r=g["r"], alpha=g["alpha"])
    model = LoraModel.load(checkpoint, spec, seed=g["seed"])
    settings = GrpoSettings(g["group"], g["max_new_tokens"], g["temperature"], g["beta"])
    rows = multiplication_prompts(steps * g["prompts_per_step"], g["seed"], digits=g["digits"])
    held = multiplication_prompts(g["eval_prompts"], g["seed"] + 1000, digits=g["digits"])
    before = reward_rate(model, tok, held, eos, settings, seed=1)
    config = TrainConfig(steps=steps, lr=g["lr"], batch_size=g["prompts_per_step"])
    trainer = grpo_trainer(model, tok, rows, config, _reward, settings, eos)
    times: list[float] = []
    cpu: list[float] = []
    trainer.step = timed(trainer.step, times, cpu)
    losses = trainer.run()
    after = reward_rate(model, tok, held, eos, settings, seed=1)
    return {"losses": losses, "rewards": trainer.rewards, "step_times": times, "step_cpu": cpu,
            "heldout_reward_before": before, "heldout_reward_after": after,
            "samples": [texts[:4] for texts in trainer.samples]}  # fmt: skip


def write_grpo_run(out: Path, checkpoint: Path, steps: int) -> dict:
    before = machine()
    run = grpo_reward_run(checkpoint, steps)
    half = len(run["rewards"]) // 2
    record = {
        "suite": "training-grpo-run", "model": "smollm2",
        "checkpoint": "smollm2-135m-instruct-f32", **provenance(),
        "machine": before, "machine_after": machine(),
        "threads": _threads(), "settings": {**GRPO_RUN, "steps": steps},
        "method": "Linnet's PyTorch GRPO (LoRA on q and v, PEFT's init), one prompt's group "
        "per step; rewards: the exact-answer reward (the completion's final answer: the last "
        "'Answer: N', else its last number); "
        "held-out: the mean reward of `group` samples on each of `eval_prompts` other "
        "prompts, the same sampling seed before and after training",
        **run,
        "first_half_mean_reward": statistics.mean(run["rewards"][:half]),
        "second_half_mean_reward": statistics.mean(run["rewards"][half:]),
    }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    return record


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def set_steps(count: int | None) -> None:
    """The same step count for every kind and method (children read it from the
    environment): more steady steps settle the median step time. The training rows grow
    with it, so no run repeats its data."""
    import os

    if count:
        os.environ["LINNET_BENCH_STEPS"] = str(count)
    if os.environ.get("LINNET_BENCH_STEPS"):
        steps = int(os.environ["LINNET_BENCH_STEPS"])
        SETTINGS["steps"] = {kind: steps for kind in SETTINGS["steps"]}
        SETTINGS["train_rows"] = max(8, steps * SETTINGS["batch"])


def set_threads(count: int | None) -> None:
    """The same PyTorch thread count for every run (children read it from the
    environment): on shared cores two threads that wait on each other at every op ran
    up to 8 times slower than one."""
    import os

    if count:
        os.environ["LINNET_BENCH_THREADS"] = str(count)
    if os.environ.get("LINNET_BENCH_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["LINNET_BENCH_THREADS"]))


# -- the parent: runs, one evaluator, the record ------------------------------------------


def summary(result: dict, tokens: list[int]) -> dict:
    """Figures of one run: steady step time (the first step apart), tokens/s, the curve."""
    times = result["step_times"]
    steady = times[1:] or times
    step_s = statistics.median(steady)
    per_step = statistics.mean(tokens[1:] or tokens) if tokens else None
    out = {
        "step_s": round(step_s, 4),
        "first_step_s": round(times[0], 3),
        "tokens_s": round(per_step / step_s, 1) if per_step else None,
        "peak_rss_mb": round(result["peak_rss_mb"], 1),
        "wall_s": round(result["wall_s"], 2),
        "final_loss": result["losses"][-1],
        "losses": result["losses"],
        "step_times": [round(t, 4) for t in times],
    }
    if result.get("step_cpu"):  # the thread's CPU time per step (records since 2026-12-02)
        out["cpu_step_s"] = round(
            statistics.median(result["step_cpu"][1:] or result["step_cpu"]), 4
        )
        out["step_cpu"] = [round(t, 4) for t in result["step_cpu"]]
    if result["rewards"]:
        out["rewards"] = result["rewards"]
        out["mean_reward"] = statistics.mean(result["rewards"])
    return out


def heldout_loss(kind: str, checkpoint: Path, adapter: Path) -> float:
    """One evaluator for every run: Linnet's PyTorch loss of the adapter on held-out rows."""
    import torch

    from linnet.parity import load_tokenizer
    from linnet.train.adapted import LoraModel
    from linnet.train.loop import TrainConfig
    from linnet.train.trainers import dpo_trainer, sft_trainer

    s = SETTINGS
    tok = load_tokenizer(checkpoint)
    model = LoraModel.from_peft(checkpoint, adapter)
    rows = rows_for(kind, s["heldout_rows"], s["seed"] + 1000)
    config = TrainConfig(steps=1, batch_size=s["batch"])
    if kind == "sft":
        trainer = sft_trainer(model, tok, rows, config, pack=s["pack"], eval_rows=rows)
    else:
        trainer = dpo_trainer(model, tok, rows, config, beta=s["beta"], eval_rows=rows)
    with torch.no_grad():
        return trainer.evaluate()


def run_one(kind, method, checkpoint, initial, work: Path) -> dict:
    out = work / f"{kind}-{method}"
    cmd = [sys.executable, __file__, "--worker", kind, method, str(checkpoint), str(initial),
           str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)}
    return json.loads((out / "result.json").read_text())


def measure(kinds, methods, checkpoint: Path, work: Path, save) -> dict:
    """Every run, kind by kind (Linnet's PyTorch run first: its batches count the tokens);
    `save(runs)` after each, so a stopped benchmark keeps what it measured."""
    runs: dict = {}
    for kind in kinds:
        initial = initial_adapter(checkpoint, work / f"initial-{kind}")
        runs[kind], tokens = {}, []
        for method in [m for m in METHODS[kind] if m in methods]:
            print(f"{kind} {method} ...", flush=True)
            result = run_one(kind, method, checkpoint, initial, work)
            if "error" not in result:
                tokens = tokens or result["tokens"]
                result = summary(result, tokens)
                if kind != "grpo":
                    adapter = work / f"{kind}-{method}" / "adapter"
                    result["heldout_loss"] = heldout_loss(kind, checkpoint, adapter)
            runs[kind][method] = result
            add_speedups(runs[kind])
            print(f"  {json.dumps({k: v for k, v in result.items() if k != 'step_times'})}")
            save(runs)
    return runs


def add_speedups(cells: dict) -> None:
    trl = cells.get("trl", {})
    for method, cell in cells.items():
        if method != "trl" and "step_s" in cell and "step_s" in trl:
            cell["vs"] = {"trl": round(trl["step_s"] / cell["step_s"], 3)}
            if "cpu_step_s" in cell and "cpu_step_s" in trl:
                cell["vs"]["trl_cpu"] = round(trl["cpu_step_s"] / cell["cpu_step_s"], 3)


def plot(runs: dict, path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return "skipped: matplotlib is not installed"
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.5))
    styles = {"linnet-torch": "o-", "linnet-jax": "s--", "trl": "x:"}  # equal curves overlap
    for ax, (kind, cells) in zip(axes if len(runs) > 1 else [axes], runs.items()):
        for method, cell in cells.items():
            if "losses" in cell:
                steps = range(1, len(cell["losses"]) + 1)
                ax.plot(steps, cell["losses"], styles.get(method, ".-"), label=method, alpha=0.8)
        ax.set_title(f"LoRA {kind.upper()} on SmolLM2-135M")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
    fig.tight_layout()
    matplotlib.rcParams["svg.hashsalt"] = "linnet"  # the same record draws the same file
    fig.savefig(path, format=path.suffix.lstrip(".") or "svg", metadata={"Date": None})
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", nargs=5, metavar=("KIND", "METHOD", "CKPT", "INITIAL", "OUT"))
    ap.add_argument("--only", default=",".join(KINDS))
    ap.add_argument("--methods", default="linnet-torch,linnet-jax,trl")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "training.json")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "training-loss.svg")
    ap.add_argument(
        "--plot-only", action="store_true", help="only redraw --plot from the record at --out"
    )
    ap.add_argument("--threads", type=int, help="PyTorch threads in every run")
    ap.add_argument("--steps", type=int, help="steps of every kind (default: SETTINGS)")
    ap.add_argument("--note", default="", help="a line kept in the record (e.g. the load)")
    ap.add_argument(
        "--grpo-run",
        type=int,
        metavar="STEPS",
        help="only the GRPO reward run (bench/results/training/grpo_run.json)",
    )
    a = ap.parse_args()
    set_threads(a.threads)
    set_steps(a.steps)
    if a.worker:
        kind, method, ckpt, initial, out = a.worker
        return worker(kind, method, Path(ckpt), Path(initial), Path(out))
    if a.plot_only:
        record = json.loads(a.out.read_text())
        record["plot"] = plot(record["runs"], a.plot)
        a.out.write_text(json.dumps(record, indent=2) + "\n")
        return print(f"drew {record['plot']}")
    from tests.checkpoints import build_smollm2

    checkpoint = build_smollm2()
    if a.grpo_run:
        # a folder of its own: the site reads every bench/results/*.json as a suite it knows
        out = ROOT / "bench" / "results" / "training" / "grpo_run.json"
        record = write_grpo_run(out, checkpoint, a.grpo_run)
        print(f"wrote {out}: rewards {record['rewards']}")
        return
    kinds = [k for k in a.only.split(",") if k]
    methods = [m for m in a.methods.split(",") if m]
    before = machine()

    def save(runs: dict) -> None:
        write_record(a.out, before, runs, a.note)

    with tempfile.TemporaryDirectory(prefix="linnet-bench-train-") as work:
        runs = measure(kinds, methods, checkpoint, Path(work), save)
    record = write_record(a.out, before, runs, a.note)
    record["plot"] = plot(runs, a.plot)
    a.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {a.out}; plot: {record['plot']}")


def write_record(out: Path, before: dict, runs: dict, note: str = "") -> dict:
    record = {
        **({"note": note} if note else {}),
        "suite": "training",
        "model": "smollm2",
        "checkpoint": "smollm2-135m-instruct-f32",
        **provenance(),
        "machine": before,
        "machine_after": machine(),
        "versions": versions(["torch", "jax", "optax", "trl", "peft", "transformers"]),
        "settings": SETTINGS,
        "threads": _threads(),
        "method": "one process per run; step time: median wall time of the steps after the "
        "first; tokens/s: positions of Linnet's batch (padding included) per steady step; "
        "held-out loss: Linnet's PyTorch loss of each saved adapter on the held-out rows",
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
