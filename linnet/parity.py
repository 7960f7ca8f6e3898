"""The parity gate: Linnet against transformers on the same weights and dtype.

One gate, one measure function per kind of model (the entry's `kind`, or what the
checkpoint's source has: `decode` for decoders, `embed` for encoders, else vision):

* decoder: for each prompt, the last-position logits of both (Linnet through the decode
  entry, the path `generate` takes) give four figures: the same first greedy token (yes/no),
  max |Δ|, relative error ‖Δ‖₂ / ‖ref‖₂, and the overlap of the two top-5 sets;
* encoder: the prompts (sentences) as one padded batch; per prompt, `embed` against
  sentence-transformers' mean pooling over transformers' `AutoModel` last_hidden_state
  (max |Δ|, rel, cosine) and `forward` against last_hidden_state at the real tokens;
* vision: a batch of 2 images of deterministic random pixels at the config's size (no image
  files offline); every entry the class has (`forward`, `pool`, `classify`) against
  transformers' last_hidden_state, pooler_output and logits (max |Δ|, rel), and for
  `classify` the same top-1 class in every row.

A row passes when its figures are within the entry's tolerance for the backend and dtype;
the gate fails closed. Each run can write a parity record (JSON) that the site and model
cards read:

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
FALLBACK_SENTENCES = ("A man is eating food.", "The quick brown fox jumps over the lazy dog.")


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
class OutputFigures:
    """Encoders and vision: one output of Linnet against transformers' for one input."""

    prompt: str  # the sentence, or the pixels ("random pixels [2, 3, 224, 224], seed 0")
    output: str  # the entry: embed, forward, pool, classify
    tokens: int  # encoders: the sentence's real tokens; vision: 0
    max_abs: float
    rel: float
    cosine: float | None = None  # embed: least cosine similarity over the rows
    top1: int | None = None  # classify: rows whose top-1 class agrees (of `rows`)
    rows: int = 1
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
    figures: list[PromptFigures] | list[OutputFigures]
    weights: str = "real"  # or "tiny-random"
    kind: str = "decoder"  # or "encoder", "vision"
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
    folder: Path,
    dtype: str,
    entry: Entry | None,
    device: str = "cpu",
    gguf: Path | None = None,
    kind: str = "decoder",
):
    """transformers' model on the same weights and dtype (eager attention), checked to be the
    entry's reference class: a CausalLM (decoders), the base model `AutoModel` gives
    (encoders), or the entry's class, else the checkpoint's architecture (vision).
    `gguf`: a GGUF file in `folder`, dequantized by transformers."""
    import torch
    import transformers

    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    extra = {}
    if gguf is not None:
        from transformers import GgufConfig

        extra = dict(gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True))
    if kind == "decoder":
        cls = transformers.AutoModelForCausalLM
    elif kind == "encoder":
        cls = transformers.AutoModel
    else:
        name = entry.reference_class if entry else _read_config(folder)["architectures"][0]
        cls = getattr(transformers, name)
    model = cls.from_pretrained(folder, dtype=torch_dtype, attn_implementation="eager", **extra).to(
        device
    )
    model.eval()
    if entry is not None and entry.reference_class != type(model).__name__:
        raise CheckpointError(
            f"{folder}: transformers loads it as {type(model).__name__}, but zoo entry "
            f"{entry.name} names {entry.reference} as its reference"
        )
    return model


def _read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def checkpoint_kind(path: Path) -> str:
    """decoder, encoder or vision: what the checkpoint's source has (`decode`, `embed`,
    else an image model). Reads the config and headers only."""
    from linnet.loading import plan_checkpoint

    if path.suffix == ".gguf":
        return "decoder"
    _, source, _, _ = plan_checkpoint(path)
    if "decode" in source.entries:
        return "decoder"
    return "encoder" if "embed" in source.entries else "vision"


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
    got = torch.tensor(np.asarray(model.decode(ids, 0))[0]).float().to(ids.device)
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


def judge(f: OutputFigures, tolerance: Tolerance) -> OutputFigures:
    """Set f.passed and f.why: max |Δ| and rel within the tolerance (NaN fails), the cosine
    (where measured) at least the tolerance's, every row's top-1 class the same."""
    why = []
    if not f.max_abs <= tolerance.max_abs:
        why.append(f"max|Δ| {f.max_abs:.3g} > {tolerance.max_abs:g}")
    if not f.rel <= tolerance.rel:
        why.append(f"rel {f.rel:.3g} > {tolerance.rel:g}")
    if f.cosine is not None and not f.cosine >= tolerance.cosine:
        why.append(f"cosine {f.cosine:.8f} < {tolerance.cosine:g}")
    if f.top1 is not None and f.top1 < f.rows:
        why.append(f"top-1 class differs in {f.rows - f.top1} of {f.rows} rows")
    f.passed, f.why = not why, "; ".join(why)
    return f


def compare(got, want, label: str, output: str, tolerance: Tolerance, **extra) -> OutputFigures:
    """Figures of two tensors of the same shape (any backend's output as `got`)."""
    import numpy as np
    import torch

    got = torch.tensor(np.asarray(got)).float()
    want = want.detach().float().cpu()
    if tuple(got.shape) != tuple(want.shape):
        raise LinnetError(
            f"`{output}` gives {tuple(got.shape)}, transformers {tuple(want.shape)}: "
            "the source and the reference disagree on the output's shape"
        )
    delta = got - want
    rel = float(delta.norm() / want.norm().clamp_min(1e-30))
    f = OutputFigures(label, output, max_abs=float(delta.abs().max()), rel=rel, **extra)
    return judge(f, tolerance)


def pad_batch(ids: list, pad_id: int):
    """[B, S] ids padded on the right with pad_id and the [B, S] mask of the real tokens,
    from one [1, S_i] (or [S_i]) LongTensor per sentence."""
    import torch

    rows = [torch.as_tensor(t).reshape(-1) for t in ids]
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)], mask[i, : len(r)] = r, 1
    return out, mask


def mean_pooling(hidden, mask):
    """sentence-transformers' `Pooling(mode="mean")`: the average of the rows the mask keeps."""
    weight = mask[..., None].to(hidden.dtype)
    return (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)


def measure_encoder(model, reference, ids, mask, tolerance, labels) -> list[OutputFigures]:
    """Per sentence: `embed` against mean pooling over transformers' last_hidden_state (max
    |Δ|, rel, cosine), and `forward` against last_hidden_state at its real tokens."""
    import numpy as np
    import torch

    with torch.no_grad():
        hidden = reference(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    want_embed = mean_pooling(hidden, mask)
    got_embed = torch.tensor(np.asarray(model.embed(ids, mask))).float()
    got_hidden = torch.tensor(np.asarray(model.run("forward", ids, mask))).float()
    out = []
    for i, label in enumerate(labels):
        n = int(mask[i].sum())
        cos = torch.nn.functional.cosine_similarity(got_embed[i], want_embed[i], dim=0)
        extra = dict(tokens=n, cosine=float(cos))
        out.append(compare(got_embed[i], want_embed[i], label, "embed", tolerance, **extra))
        got, want = got_hidden[i, :n], hidden[i, :n]
        out.append(compare(got, want, label, "forward", tolerance, tokens=n))
    return out


def random_pixels(config: dict, batch: int = 2, seed: int = 0):
    """Deterministic random pixels [batch, channels, size, size] (N(0, 1), what normalized
    images look like) at the source config's image size: the gate has no image files."""
    import torch

    size, channels = config.get("image_size", 224), config.get("channels", 3)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, size, size, generator=g)


def reference_vision(reference, pixels) -> dict:
    """transformers' output per Linnet entry: the base model's last_hidden_state (forward)
    and pooler_output (pool; ResNet's [B, C, 1, 1] flattened), the logits (classify)."""
    import torch

    with torch.no_grad():
        out = reference.base_model(pixel_values=pixels)
        refs = {"forward": out.last_hidden_state}
        if getattr(out, "pooler_output", None) is not None:
            refs["pool"] = out.pooler_output.flatten(1)
        if reference.base_model is not reference:  # a task model: its head's logits
            refs["classify"] = reference(pixel_values=pixels).logits
    return refs


def measure_vision(model, reference, pixels, tolerance, entries) -> list[OutputFigures]:
    """Every entry the config has against transformers' output; `classify`: top-1 too."""
    import numpy as np
    import torch

    refs = reference_vision(reference, pixels)
    label = f"random pixels {list(pixels.shape)}, seed 0"
    out = []
    for name in entries:
        if name not in refs:
            raise LinnetError(
                f"entry `{name}`: transformers' {type(reference).__name__} "
                "gives no output to compare it with"
            )
        got, want = torch.tensor(np.asarray(model.run(name, pixels))).float(), refs[name]
        extra = dict(tokens=0, rows=int(pixels.shape[0]))
        if name == "classify":
            extra["top1"] = int((got.argmax(-1) == want.argmax(-1)).sum())
        out.append(compare(got, want, label, name, tolerance, **extra))
    return out


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
    LongTensors) skip the tokenizer (random checkpoints have none; encoders pad them into
    one batch). Vision models take random pixels. `model`: an already loaded Linnet model
    (tests use it to perturb a weight)."""
    from linnet.core.dtypes import normalize_dtype

    if backend not in BACKENDS:
        raise LinnetError(f"backend {backend!r}: available are {', '.join(BACKENDS)}")
    t0 = time.perf_counter()
    path = Path(folder)
    gguf = path if path.suffix == ".gguf" else None
    folder = path.parent if gguf else path
    dtype = normalize_dtype(dtype)
    kind = entry.kind if entry else checkpoint_kind(path)
    if entry is None:
        from linnet.zoo.registry import registry

        tolerance = registry().kind_defaults[kind].tolerance(backend, dtype)
    else:
        tolerance = entry.tolerance(backend, dtype)
    gate = Gate(path, folder, gguf, entry, kind, backend, dtype, device, tolerance, model)
    with tempfile.TemporaryDirectory(prefix="linnet-parity-") as tmp:
        gate.tmp = Path(tmp)
        figures = gate.run(prompts, ids, chat)
    return Report(
        entry=entry.name if entry else None,
        checkpoint=str(path),
        backend=backend,
        dtype=dtype,
        device=str(device),
        tolerance=tolerance,
        figures=figures,
        weights=weights,
        kind=kind,
        repo=entry.repo if entry else None,
        seconds=round(time.perf_counter() - t0, 2),
        versions=versions(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


@dataclass
class Gate:
    """One gate run: the checkpoint, what it is compared as, and a folder for exports."""

    path: Path
    folder: Path
    gguf: Path | None
    entry: Entry | None
    kind: str
    backend: str
    dtype: str
    device: str
    tolerance: Tolerance
    model: object = None  # Linnet's model, when the caller loaded it
    tmp: Path = Path(".")

    def linnet(self, positions: int | None = None):
        if self.model is None:
            args = (self.backend, self.dtype, self.device, positions, self.tmp)
            self.model = load_linnet(self.path, *args)
        return self.model

    def reference(self):
        return load_reference(
            self.folder, self.dtype, self.entry, self.device, self.gguf, self.kind
        )

    def run(self, prompts, ids, chat) -> list:
        """The figures of this kind: vision on random pixels, the others on prompts."""
        if self.kind == "vision":
            return self.vision()
        if ids is None:
            prompts, ids = self.tokenize(prompts, chat)
        else:
            prompts = prompts or [f"ids[{i}] ({t.shape[-1]} tokens)" for i, t in enumerate(ids)]
        measure = self.encoder if self.kind == "encoder" else self.decoder
        return measure(prompts, ids)

    def tokenize(self, prompts, chat):
        """(prompts, ids): the entry's prompts (or the fallback) through the tokenizer."""
        from transformers import AutoTokenizer

        gguf = self.gguf
        tokenizer = AutoTokenizer.from_pretrained(self.folder, gguf_file=gguf and gguf.name)
        entry = self.entry
        if chat is None:
            chat = entry.chat if entry else self.kind == "decoder" and bool(tokenizer.chat_template)
        fallback = FALLBACK_SENTENCES if self.kind == "encoder" else FALLBACK_PROMPTS
        prompts = list(prompts or (entry.prompts if entry else fallback))
        return prompts, encode_prompts(tokenizer, prompts, chat)

    def decoder(self, prompts, ids) -> list[PromptFigures]:
        model = self.linnet(max(t.shape[-1] for t in ids))
        reference = self.reference()
        return [
            measure(model, reference, t.to(self.device), self.tolerance, p)
            for p, t in zip(prompts, ids, strict=True)
        ]

    def encoder(self, prompts, ids) -> list[OutputFigures]:
        from linnet.loading import plan_checkpoint

        pad_id = plan_checkpoint(self.path)[2].get("pad_id", 0)
        batch, mask = pad_batch(ids, pad_id)
        model, reference = self.linnet(), self.reference()
        return measure_encoder(model, reference, batch, mask, self.tolerance, prompts)

    def vision(self) -> list[OutputFigures]:
        from linnet.loading import plan_checkpoint

        _, source, config, _ = plan_checkpoint(self.path)
        pixels = random_pixels(config)
        model, reference = self.linnet(), self.reference()
        entries = source.entries_for(config)
        return measure_vision(model, reference, pixels, self.tolerance, entries)


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

        return linnet.jax.load(path, dtype=dtype, max_positions=positions)
    import linnet.onnx

    out = linnet.onnx.export(
        path, tmp / "onnx", dtype=dtype, max_positions=positions, progress=False
    )
    return linnet.onnx.load(out)


def format_table(report: Report) -> str:
    lines = _decoder_rows(report) if report.kind == "decoder" else _output_rows(report)
    name = report.entry or report.checkpoint
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(
        f"\nparity {verdict}: {name}, {report.backend} {report.dtype} on {report.device} "
        f"({report.weights} weights); tolerance {report.tolerance.text()}"
    )
    if report.kind == "vision":
        lines.append("input: deterministic random pixels (no image files offline)")
    return "\n".join(lines)


def _short(text: str, width: int = 28) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _decoder_rows(report: Report) -> list[str]:
    head = (
        f"{'prompt':<28} {'tokens':>6} {'linnet':>7} {'ref':>7} {'same':>4} "
        f"{'max |Δ|':>9} {'rel':>9} {'top-5':>5}  result"
    )
    lines = [head]
    for f in report.figures:
        lines.append(
            f"{_short(f.prompt):<28} {f.tokens:>6} {f.linnet_token:>7} {f.reference_token:>7} "
            f"{'yes' if f.same_token else 'NO':>4} {f.max_abs:>9.2e} {f.rel:>9.2e} "
            f"{f.top5:>3}/5  {'ok' if f.passed else 'FAIL: ' + f.why}"
        )
    return lines


def _output_rows(report: Report) -> list[str]:
    """Encoders and vision: one line per input and output."""
    first = "input" if report.kind == "vision" else "prompt"
    head = f"{first:<28} {'output':<8} {'tokens':>6} {'max |Δ|':>9} {'rel':>9} {'cosine':>10} "
    lines = [head + f"{'top-1':>5}  result"]
    for f in report.figures:
        cosine = f"{f.cosine:.8f}" if f.cosine is not None else "-"
        top1 = f"{f.top1}/{f.rows}" if f.top1 is not None else "-"
        tokens = str(f.tokens) if f.tokens else "-"
        lines.append(
            f"{_short(f.prompt):<28} {f.output:<8} {tokens:>6} {f.max_abs:>9.2e} {f.rel:>9.2e} "
            f"{cosine:>10} {top1:>5}  {'ok' if f.passed else 'FAIL: ' + f.why}"
        )
    return lines


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
