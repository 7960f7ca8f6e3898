"""Export to Hugging Face safetensors, named exactly as the original checkpoint.

    import linnet.hf, linnet.torch
    model = linnet.torch.load("path/to/checkpoint")
    linnet.hf.export(model, "out/", dtype="bf16", tokenizer="path/to/checkpoint")
    linnet.hf.export("model.gguf", "out/")       # or straight from a folder or a GGUF file

`model` is a loaded model (`linnet.torch.load`, `linnet.gguf.load`) or a path: an HF
folder, a `.gguf` file (or, with the zoo, an entry name). From a path, tensors stream one
at a time from disk (peak memory near the largest tensor). See docs/exports.md.
"""

from __future__ import annotations

from pathlib import Path


def export(
    model,
    out_dir: str | Path,
    *,
    dtype=None,
    max_shard_size: int | str = "5GB",
    tokenizer: str | Path | None = None,
    architecture: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Write `model` as an HF checkpoint folder: sharded safetensors (with the index past
    one shard), config.json, generation_config.json, tokenizer files and chat template.

    dtype: "f32", "f16" or "bf16" (default: the stored dtype). max_shard_size: "5GB",
    "500MiB" or bytes. tokenizer: a folder to copy tokenizer files from (a path source
    brings its own). architecture: the HF architecture, for a model without an HF config.
    The folder is written under a temporary name and renamed when complete.
    """
    from linnet.converters.hf_export import export_hf
    from linnet.targets import open_weights

    weights = open_weights(model, architecture=architecture, tokenizer=tokenizer)
    return export_hf(
        weights,
        out_dir,
        dtype=dtype,
        max_shard_size=max_shard_size,
        overwrite=overwrite,
        progress=progress,
    )
