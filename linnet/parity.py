"""The parity gate: Linnet against transformers on the same weights and dtype.

For each prompt, the last-position logits of both (Linnet through the decode entry, the
path `generate` takes) give four figures: the same first greedy token (yes/no), max |Δ|,
relative error ‖Δ‖₂ / ‖ref‖₂, and the overlap of the two top-5 sets. A prompt passes when
the first token is the same and the figures are within the entry's tolerance for the backend
and dtype; the gate fails closed. Each run can write a parity record (JSON) that the site and
model cards read:

    report = run_gate(folder, entry=entry, dtype="bf16")      # or a .gguf file
    print(format_table(report)); write_record(report)

Backends: "torch" (linnet.torch.load), "jax" (linnet.jax.load), "onnx" (exported to a
temporary folder and run by linnet.onnx.load on onnxruntime). A `.gguf` checkpoint is
compared with transformers' own GGUF loader (dequantized) on the same file.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from linnet.errors import CheckpointError, LinnetError
from linnet.zoo.registry import Entry, Tolerance

BACKENDS = ("torch", "jax", "onnx")
DEFAULT_RESULTS = Path("results") / "parity"
#: For a folder that is no zoo entry: the defaults of entries.toml.
FALLBACK_PROMPTS = ("What is 2 plus 2?", "Say hello.", "Tell me a joke.")


@dataclass
class PromptFigures:
    prompt: str
    tokens: int
    linnet_token: int
    reference_token: int
    same_token: bool
    max_abs: float
    rel: float
    top5: int
    passed: bool = False
    why: str = ""


@dataclass
class Report:
    entry: str | None
    checkpoint: str
    backend: str
    dtype: str
    device: str
    tolerance: Tolerance
    figures: list[PromptFigures]
    weights: str = "real"  # or "tiny-random"
    repo: str | None = None
    revision: str | None = None
    commit: str | None = None
    seconds: float = 0.0
    versions: dict = field(default_factory=dict)
    date: str = ""

    @property
    def passed(self) -> bool:
        return bool(self.figures) and all(f.passed for f in self.figures)


def versions() -> dict:
    import torch
    import transformers

    import linnet

    out = {
        "linnet": getattr(linnet, "__version__", "?"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    try:
        import huggingface_hub

        out["huggingface_hub"] = huggingface_hub.__version__
    except ImportError:  # pragma: no cover
        pass
    return out


def load_reference(
    folder: Path, dtype: str, entry: Entry | None, device: str = "cpu", gguf: Path | None = None
):
    """transformers' model on the same weights and dtype (eager attention), checked to be the
    entry's reference class. `gguf`: a GGUF file in `folder`, dequantized by transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    extra = {}
    if gguf is not None:
        from transformers import GgufConfig

        extra = dict(gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True))
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch_dtype, attn_implementation="eager", **extra
    ).to(device)
    model.eval()
    if entry is not None and entry.reference_class != type(model).__name__:
        raise CheckpointError(
            f"{folder}: transformers loads it as {type(model).__name__}, but zoo entry "
            f"{entry.name} names {entry.reference} as its reference"
        )
    return model


def encode_prompts(tokenizer, prompts, chat: bool):
    """One [1, S] LongTensor per prompt: chat-templated (with the generation prompt) or plain."""
    import torch

    out = []
    for text in prompts:
        if chat:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        out.append(torch.tensor([list(ids)], dtype=torch.long))
    return out


def measure(model, reference, ids, tolerance: Tolerance, label: str) -> PromptFigures:
    """Figures for one prompt: Linnet's decode (a fresh cache) against transformers' forward."""
    import numpy as np
    import torch

    model.reset()
    got = torch.as_tensor(np.asarray(model.decode(ids, 0))[0]).float().to(ids.device)
    with torch.no_grad():
        want = reference(input_ids=ids.to(reference.device)).logits[0, -1].float().to(got.device)
    delta = got - want
    max_abs = float(delta.abs().max())
    rel = float(delta.norm() / want.norm().clamp_min(1e-30))
    top5 = len(set(got.topk(5).indices.tolist()) & set(want.topk(5).indices.tolist()))
    f = PromptFigures(
        prompt=label,
        tokens=int(ids.shape[-1]),
        linnet_token=int(got.argmax()),
        reference_token=int(want.argmax()),
        same_token=int(got.argmax()) == int(want.argmax()),
        max_abs=max_abs,
        rel=rel,
        top5=top5,
    )
    why = []
    if not f.same_token:
        why.append("first token differs")
    if not max_abs <= tolerance.max_abs:  # NaN fails too
        why.append(f"max|Δ| {max_abs:.3g} > {tolerance.max_abs:g}")
    if not rel <= tolerance.rel:
        why.append(f"rel {rel:.3g} > {tolerance.rel:g}")
    if top5 < tolerance.top5:
        why.append(f"top-5 {top5}/5 < {tolerance.top5}")
    f.passed, f.why = not why, "; ".join(why)
    return f


def run_gate(
    folder: str | os.PathLike,
    *,
    entry: Entry | None = None,
    backend: str = "torch",
    dtype: str = "f32",
    device: str = "cpu",
    prompts=None,
    ids=None,
    chat: bool | None = None,
    weights: str = "real",
    model=None,
) -> Report:
    """Run the gate on a checkpoint folder. Text `prompts` (default: the entry's) go through the
    checkpoint's tokenizer and, for chat models, its chat template; `ids` (a list of [1, S]
    LongTensors) skip the tokenizer (random checkpoints have none). `model`: an already
    loaded Linnet model (tests use it to perturb a weight)."""
    from linnet.loading import normalize_dtype

    if backend not in BACKENDS:
        raise LinnetError(f"backend {backend!r}: available are {', '.join(BACKENDS)}")
    t0 = time.perf_counter()
    path = Path(folder)
    gguf = path if path.suffix == ".gguf" else None
    folder = path.parent if gguf else path
    dtype = normalize_dtype(dtype)
    if entry is not None and entry.kind == "encoder":
        raise LinnetError(
            f"{entry.name} is an encoder: this gate compares logits; encoders are checked on "
            "their embeddings by tests/test_encoders.py and tests/test_minilm.py"
        )
    if entry is None:
        from linnet.zoo.registry import registry

        tolerance = registry().defaults.tolerance(backend, dtype)
    else:
        tolerance = entry.tolerance(backend, dtype)
    if ids is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf and gguf.name)
        if chat is None:
            chat = entry.chat if entry else bool(tokenizer.chat_template)
        prompts = list(prompts or (entry.prompts if entry else FALLBACK_PROMPTS))
        ids = encode_prompts(tokenizer, prompts, chat)
    else:
        prompts = prompts or [f"ids[{i}] ({t.shape[-1]} tokens)" for i, t in enumerate(ids)]
    with tempfile.TemporaryDirectory(prefix="linnet-parity-") as tmp:
        if model is None:
            longest = max(t.shape[-1] for t in ids)
            model = load_linnet(path, backend, dtype, device, longest, Path(tmp))
        reference = load_reference(folder, dtype, entry, device, gguf)
        figures = [
            measure(model, reference, t.to(device), tolerance, p)
            for p, t in zip(prompts, ids, strict=True)
        ]
    return Report(
        entry=entry.name if entry else None,
        checkpoint=str(path),
        backend=backend,
        dtype=dtype,
        device=str(device),
        tolerance=tolerance,
        figures=figures,
        weights=weights,
        repo=entry.repo if entry else None,
        seconds=round(time.perf_counter() - t0, 2),
        versions=versions(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def load_linnet(path: Path, backend: str, dtype: str, device: str, positions: int, tmp: Path):
    """Linnet's model of a checkpoint (folder or .gguf) on one backend, with a cache of
    `positions` rows. ONNX goes through an export into `tmp`."""
    if backend == "torch":
        import linnet.torch

        return linnet.torch.load(path, dtype=dtype, device=device, max_positions=positions)
    if device != "cpu":
        raise LinnetError(f"backend {backend}: the parity gate runs it on the CPU only")
    if backend == "jax":
        import linnet.jax

        if path.suffix == ".gguf":
            raise LinnetError(
                "backend jax reads HF folders; export the GGUF with `linnet export hf`"
            )
        return linnet.jax.load(path, dtype=dtype, max_positions=positions)
    import linnet.onnx

    out = linnet.onnx.export(
        path, tmp / "onnx", dtype=dtype, max_positions=positions, progress=False
    )
    return linnet.onnx.load(out)


def format_table(report: Report) -> str:
    head = (
        f"{'prompt':<28} {'tokens':>6} {'linnet':>7} {'ref':>7} {'same':>4} "
        f"{'max |Δ|':>9} {'rel':>9} {'top-5':>5}  result"
    )
    lines = [head]
    for f in report.figures:
        text = f.prompt if len(f.prompt) <= 28 else f.prompt[:27] + "…"
        lines.append(
            f"{text:<28} {f.tokens:>6} {f.linnet_token:>7} {f.reference_token:>7} "
            f"{'yes' if f.same_token else 'NO':>4} {f.max_abs:>9.2e} {f.rel:>9.2e} "
            f"{f.top5:>3}/5  {'ok' if f.passed else 'FAIL: ' + f.why}"
        )
    name = report.entry or report.checkpoint
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(
        f"\nparity {verdict}: {name}, {report.backend} {report.dtype} on {report.device} "
        f"({report.weights} weights); tolerance {report.tolerance.text()}"
    )
    return "\n".join(lines)


def record(report: Report) -> dict:
    out = asdict(report)
    out["tolerance"] = report.tolerance.as_dict()
    out["passed"] = report.passed
    return out


def results_dir(path: str | os.PathLike | None = None) -> Path:
    return Path(path or os.environ.get("LINNET_RESULTS") or DEFAULT_RESULTS)


def record_path(report: Report, folder: str | os.PathLike | None = None) -> Path:
    name = report.entry or Path(report.checkpoint).name
    tag = "tiny" if report.weights != "real" else "real"
    return results_dir(folder) / f"{name}.{tag}.{report.backend}.{report.dtype}.json"


def write_record(report: Report, folder: str | os.PathLike | None = None) -> Path:
    """Write the parity record (JSON) under the results folder; returns its path."""
    path = record_path(report, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record(report), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_records(folder: str | os.PathLike | None = None) -> list[dict]:
    """Every parity record under the results folder (unreadable ones are skipped)."""
    out = []
    root = results_dir(folder)
    for p in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            out.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return out
