"""The two sides of the gate: Linnet's model on one backend and transformers' on the same
weights and dtype, and what kind of model a checkpoint is.

    kind = checkpoint_kind(path)                               # decoder, encoder or vision
    model = load_linnet(path, "torch", "f32", "cpu", 64, tmp)
    reference = load_reference(folder, "f32", entry, kind=kind)

Backends: "torch" (linnet.torch.load), "jax" (linnet.jax.load), "onnx" (exported to a
temporary folder and run by linnet.onnx.load on onnxruntime). A `.gguf` checkpoint is
compared with transformers' own GGUF loader (dequantized) on the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

from linnet.errors import CheckpointError, LinnetError
from linnet.remote_code import refuse_remote_code
from linnet.zoo.registry import Entry

BACKENDS = ("torch", "jax", "onnx")
#: Kinds whose reference is a diffusers model (the others: transformers).
DIFFUSERS_KINDS = ("image-decoder", "unet")


def checkpoint_kind(path: Path) -> str:
    """What the checkpoint's source has: `decode` without a cache (image-decoder, with or
    without `encode`), `encode` and `decode` (speech), `decode` with a cache (decoder),
    `embed` (encoder), `embed_text` (image-text), else an image model (vision). Reads the
    config and headers only."""
    from linnet.weights.planning import plan_checkpoint

    if path.suffix == ".gguf":
        return "decoder"
    _, source, _, _ = plan_checkpoint(path)
    entries = source.entries
    if "decode" in entries:
        if not source.module.states:  # a VAE's decode (and encode) keep no cache
            return "image-decoder"
        return "speech" if "encode" in entries else "decoder"
    if "embed" in entries:
        return "encoder"
    if "predict_masks" in entries:  # SAM (issue 15)
        return "segmenter"
    if "timestep" in source.entry_inputs("forward"):
        return "unet"
    return "image-text" if "embed_text" in entries else "vision"


def load_linnet(
    path: Path, backend: str, dtype: str, device: str, positions: int, tmp: Path, mode=None
):
    """Linnet's model of a checkpoint (folder or .gguf) on one backend, with a cache of
    `positions` rows (PyTorch in `mode`, interpret by default). ONNX goes through an export
    into `tmp`."""
    if backend == "torch":
        import linnet.torch

        return linnet.torch.load(
            path, dtype=dtype, device=device, max_positions=positions, mode=mode or "interpret"
        )
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

    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    extra = {}
    if gguf is not None:
        from transformers import GgufConfig

        extra = dict(gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True))
    refuse_remote_code(folder)
    if entry is not None and not entry.reference_class:
        raise CheckpointError(
            f"zoo entry {entry.name} names no reference class: the gate has nothing to "
            "compare Linnet with"
        )
    cls = _reference_class(folder, entry, kind)
    if kind in DIFFUSERS_KINDS:  # diffusers: its own loading arguments, no attention choice
        extra, torch_dtype = dict(torch_dtype=torch_dtype), None
    else:
        extra.update(dtype=torch_dtype, attn_implementation="eager")
    try:
        model = cls.from_pretrained(folder, trust_remote_code=False, **extra)
    except (OSError, ValueError) as err:  # fail closed, naming the folder: no reference, no gate
        why = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
        raise CheckpointError(f"{folder}: transformers cannot load the reference ({why})") from err
    model = model.to(device)
    model.eval()
    if entry is not None and entry.reference_class != type(model).__name__:
        raise CheckpointError(
            f"{folder}: transformers loads it as {type(model).__name__}, but zoo entry "
            f"{entry.name} names {entry.reference} as its reference"
        )
    return model


def _reference_class(folder: Path, entry: Entry | None, kind: str):
    """The transformers (image decoders: diffusers) class that loads the reference of this
    kind of model."""
    import transformers

    if kind == "decoder":
        return transformers.AutoModelForCausalLM
    if kind == "encoder":
        return transformers.AutoModel
    if kind in DIFFUSERS_KINDS:
        return _diffusers_class(folder, entry, kind)
    config = _read_config(folder) if entry is None else {}
    name = entry.reference_class if entry else (config.get("architectures") or [None])[0]
    cls = getattr(transformers, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise CheckpointError(f"{folder}/config.json: {name!r} is no model class of transformers")
    return cls


def _diffusers_class(folder: Path, entry: Entry | None, kind: str):
    """diffusers' model class of an image decoder: the entry's, else config.json's
    `_class_name`; diffusers missing is a CheckpointError (no reference, no gate)."""
    try:
        import diffusers
    except ImportError as err:
        raise CheckpointError(
            f"{folder}: the {kind} gate compares with diffusers, which is not "
            "installed (pip install 'linnet[diffusion]')"
        ) from err
    name = entry.reference_class if entry else _read_config(folder).get("_class_name")
    cls = getattr(diffusers, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.ModelMixin)):
        raise CheckpointError(f"{folder}/config.json: {name!r} is no model class of diffusers")
    return cls


def _read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))
