"""The gate run: load both sides of a checkpoint, measure them by kind, report.

    report = run_gate(folder, entry=entry, dtype="bf16")      # or a .gguf file
    report = run_gate(folder, ids=[ids], weights="tiny-random", backend="onnx")

The kind (the entry's `kind`, or what the checkpoint's source has) picks the measure:
decoders on prompts (linnet.parity.decoder), encoders on one padded batch of sentences
(linnet.parity.encoder), vision models on random pixels (linnet.parity.vision), speech on
audio it makes (linnet.parity.speech), image-text models on random pixels and token ids,
image decoders on random latents and UNets on random latents and text states
(linnet.parity.images).
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from linnet.errors import LinnetError
from linnet.parity.decoder import measure_decoder
from linnet.parity.encoder import measure_encoder, pad_batch
from linnet.parity.images import measure_image_decoder, measure_image_text, measure_unet
from linnet.parity.models import BACKENDS, checkpoint_kind, load_linnet, load_reference
from linnet.parity.prompts import encode_prompts, load_tokenizer
from linnet.parity.report import OutputFigures, PromptFigures, Report, versions
from linnet.parity.speech import check_speech_folder, measure_speech
from linnet.parity.vision import measure_vision, random_pixels
from linnet.zoo.registry import PROMPTLESS, Entry, Tolerance

#: Greedy tokens of Linnet's answer a record keeps per text prompt (the site's samples).
SAMPLE_TOKENS = 24
#: For a folder that is no zoo entry: the defaults of entries.toml.
FALLBACK_PROMPTS = ("What is 2 plus 2?", "Say hello.", "Tell me a joke.")
FALLBACK_SENTENCES = ("A man is eating food.", "The quick brown fox jumps over the lazy dog.")


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
    mode: str | None = None,
) -> Report:
    """Run the gate on a checkpoint folder. Text `prompts` (default: the entry's) go through the
    checkpoint's tokenizer and, for chat models, its chat template; `ids` (a list of [1, S]
    LongTensors) skip the tokenizer (random checkpoints have none; encoders pad them into
    one batch). Vision models take random pixels. `model`: an already loaded Linnet model
    (tests use it to perturb a weight). `mode`: PyTorch's (interpret by default, generated,
    compile)."""
    if backend not in BACKENDS:
        raise LinnetError(f"backend {backend!r}: available are {', '.join(BACKENDS)}")
    if mode is not None and backend != "torch":
        raise LinnetError(f"mode {mode!r} is PyTorch's; backend {backend} has one mode")
    t0 = time.perf_counter()
    gate = Gate.of(Path(folder), entry, backend, dtype, device, model, weights)
    gate.mode = mode
    with tempfile.TemporaryDirectory(prefix="linnet-parity-") as tmp:
        gate.tmp = Path(tmp)
        figures = gate.run(prompts, ids, chat)
        samples = gate.samples()
    plan = checkpoint_plan(gate.path)
    if not figures:  # fail closed: a gate that compared nothing has passed nothing
        raise LinnetError(f"{gate.path}: the parity gate compared no output with transformers")
    return Report(
        samples=samples,
        plan=plan,
        mode=mode,
        entry=entry.name if entry else None,
        checkpoint=str(gate.path),
        backend=backend,
        dtype=gate.dtype,
        device=str(device),
        tolerance=gate.tolerance,
        figures=figures,
        weights=weights,
        kind=gate.kind,
        repo=entry.repo if entry else None,
        seconds=round(time.perf_counter() - t0, 2),
        versions=versions(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def tolerance_for(
    entry: Entry | None, kind: str, backend: str, dtype: str, weights: str = "real"
) -> Tolerance:
    """The entry's tolerance, else the registry's default for this kind of model (on tiny
    random weights the tiny limits, where zoo/entries.toml states them)."""
    if entry is not None:
        return entry.tolerance(backend, dtype, weights)
    from linnet.zoo.registry import registry

    return registry().kind_defaults[kind].tolerance(backend, dtype, weights)


def checkpoint_plan(path: Path) -> str:
    """`linnet plan`'s text for the checkpoint (headers only): how each tensor maps onto the
    source; the record keeps it and the site shows it."""
    if path.suffix == ".gguf":
        from linnet.weights.gguf_reader import plan_text

        return plan_text(path)
    from linnet.weights.planning import plan_checkpoint

    return plan_checkpoint(path)[0].format()


def check_inputs(prompts: list, ids: list) -> None:
    """Fail closed on inputs that would compare nothing: no prompt, or one without tokens."""
    if not ids:
        raise LinnetError("no prompts to compare: the parity gate needs at least one")
    if len(prompts) != len(ids):
        raise LinnetError(f"{len(prompts)} prompt labels for {len(ids)} token id lists")
    for label, t in zip(prompts, ids):
        if t.shape[-1] == 0:
            raise LinnetError(f"prompt {label!r} has no tokens: there is nothing to compare")


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
    tokenizer: object = None  # set when the prompts were text
    texts: tuple = ()  # (prompt, ids) of the text prompts, for samples
    mode: str | None = None  # PyTorch's mode; None: interpret

    @classmethod
    def of(cls, path: Path, entry, backend, dtype, device, model, weights="real") -> Gate:
        """The gate of a checkpoint folder or .gguf file (its folder holds the tokenizer)."""
        from linnet.core.dtypes import normalize_dtype

        gguf = path if path.suffix == ".gguf" else None
        dtype = normalize_dtype(dtype)
        kind = entry.kind if entry else checkpoint_kind(path)
        tolerance = tolerance_for(entry, kind, backend, dtype, weights)
        folder = path.parent if gguf else path
        return cls(path, folder, gguf, entry, kind, backend, dtype, device, tolerance, model)

    def linnet(self, positions: int | None = None):
        if self.model is None:
            args = (self.backend, self.dtype, self.device, positions, self.tmp)
            self.model = load_linnet(self.path, *args, mode=self.mode)
        return self.model

    def reference(self):
        return load_reference(
            self.folder, self.dtype, self.entry, self.device, self.gguf, self.kind
        )

    def run(self, prompts, ids, chat) -> list:
        """The figures of this kind: decoders and encoders on prompts, the others on inputs
        the gate makes (pixels, audio, token ids, latents)."""
        if self.kind in PROMPTLESS:
            if prompts or ids is not None:
                raise LinnetError(
                    f"a {self.kind} model's gate makes its own inputs: it takes no prompts"
                )
            return getattr(self, self.kind.replace("-", "_"))()
        if ids is None:
            prompts, ids = self.tokenize(prompts, chat)
        else:
            prompts = prompts or [f"ids[{i}] ({t.shape[-1]} tokens)" for i, t in enumerate(ids)]
        check_inputs(prompts, ids)
        measure = self.encoder if self.kind == "encoder" else self.decoder
        return measure(prompts, ids)

    def tokenize(self, prompts, chat):
        """(prompts, ids): the entry's prompts (or the fallback) through the tokenizer."""
        tokenizer = self.tokenizer = load_tokenizer(self.folder, self.gguf and self.gguf.name)
        entry = self.entry
        if chat is None:
            chat = entry.chat if entry else self.kind == "decoder" and bool(tokenizer.chat_template)
        fallback = FALLBACK_SENTENCES if self.kind == "encoder" else FALLBACK_PROMPTS
        prompts = list(prompts or (entry.prompts if entry else fallback))
        ids = encode_prompts(tokenizer, prompts, chat)
        self.texts = tuple(zip(prompts, ids))
        return prompts, ids

    def decoder(self, prompts, ids) -> list[PromptFigures]:
        model = self.linnet(max(t.shape[-1] for t in ids) + SAMPLE_TOKENS)
        reference = self.reference()
        return [
            measure_decoder(model, reference, t.to(self.device), self.tolerance, p)
            for p, t in zip(prompts, ids, strict=True)
        ]

    def samples(self) -> list[str]:
        """Linnet's greedy text for each text prompt of a decoder (what `linnet run` prints),
        shown by the site beside the figures; none for token ids or other kinds."""
        if self.kind != "decoder" or self.tokenizer is None:
            return []
        out = []
        for prompt, ids in self.texts:
            eos = self.tokenizer.eos_token_id
            tokens = self.model.generate(ids.numpy(), SAMPLE_TOKENS, eos_token_id=eos)
            new = [int(t) for t in tokens[0, ids.shape[-1] :]]
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            out.append(f"{prompt}\n→ {text.strip()}")
        return out

    def encoder(self, prompts, ids) -> list[OutputFigures]:
        from linnet.weights.planning import plan_checkpoint

        pad_id = plan_checkpoint(self.path)[2].get("pad_id", 0)
        batch, mask = pad_batch(ids, pad_id)
        model, reference = self.linnet(), self.reference()
        return measure_encoder(model, reference, batch, mask, self.tolerance, prompts)

    def vision(self) -> list[OutputFigures]:
        from linnet.weights.planning import plan_checkpoint

        _, source, config, _ = plan_checkpoint(self.path)
        pixels = random_pixels(config)
        model, reference = self.linnet(), self.reference()
        entries = source.entries_for(config)
        return measure_vision(model, reference, pixels, self.tolerance, entries)

    def speech(self) -> list[OutputFigures]:
        from linnet.weights.planning import plan_checkpoint

        check_speech_folder(self.folder)  # before loading anything: fail on what is missing
        _, _, config, hf_config = plan_checkpoint(self.path)
        model, reference = self.linnet(), self.reference()
        return measure_speech(model, reference, self.folder, hf_config, config, self.tolerance)

    def image_text(self) -> list[OutputFigures]:
        from linnet.weights.planning import plan_checkpoint

        config = plan_checkpoint(self.path)[2]
        model, reference = self.linnet(), self.reference()
        return measure_image_text(model, reference, config, self.tolerance)

    def image_decoder(self) -> list[OutputFigures]:
        from linnet.weights.planning import plan_checkpoint

        config = plan_checkpoint(self.path)[2]
        model, reference = self.linnet(), self.reference()
        return measure_image_decoder(model, reference, config, self.tolerance)

    def segmenter(self) -> list[OutputFigures]:  # SAM (issue 15): linnet/parity/segment.py
        from linnet.parity.segment import measure_segmenter
        from linnet.weights.planning import plan_checkpoint

        config = plan_checkpoint(self.path)[2]
        return measure_segmenter(self.linnet(), self.reference(), config, self.tolerance)

    def unet(self) -> list[OutputFigures]:
        from linnet.weights.planning import plan_checkpoint

        config = plan_checkpoint(self.path)[2]
        model, reference = self.linnet(), self.reference()
        return measure_unet(model, reference, config, self.tolerance)
