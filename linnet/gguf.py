"""GGUF (llama.cpp): export and import.

    import linnet.gguf
    linnet.gguf.export("path/to/checkpoint", "model.f16.gguf", dtype="f16")
    model = linnet.gguf.load("model.Q4_1.gguf")        # dequantized, on PyTorch
    logits = model.forward(ids)

Names, metadata keys and the Q/K permutation come from the weights maps
(`weights_maps/*.toml`, `[gguf]`). See docs/exports.md.
"""

from __future__ import annotations

from pathlib import Path

DTYPES = ("f32", "f16", "bf16", "q8_0")


def export(
    model,
    out_path: str | Path,
    *,
    dtype: str = "f16",
    tokenizer: str | Path | bool | None = None,
    architecture: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Write `model` (a loaded model, an HF folder, a .gguf file) as one GGUF file.

    dtype: "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K",
    "q6_K", "q4_K_M" or "q5_K_M", any case (1-D tensors stay f32; the _M mixes give some
    tensors q6_K as llama.cpp does, see docs/exports.md). tokenizer: a folder
    whose tokenizer.json (and chat template) to embed, or False for none (llama.cpp then
    takes token ids only); a path source brings its own. The file is written under a
    temporary name and renamed when complete.
    """
    from linnet.converters.gguf_export import export_gguf
    from linnet.targets import open_weights

    folder = tokenizer if isinstance(tokenizer, (str, Path)) else None
    weights = open_weights(model, architecture=architecture, tokenizer=folder)
    return export_gguf(
        weights,
        out_path,
        dtype=dtype,
        tokenizer=tokenizer is not False,
        overwrite=overwrite,
        progress=progress,
    )


def load(
    path: str | Path,
    *,
    dtype=None,
    device="cpu",
    numerics: str = "equivalent",
    max_positions: int | None = None,
):
    """A GGUF file (f32, f16, bf16, q8_0, q4_0, q4_1, ...: dequantized with the gguf
    package, the Q/K permutation undone) as a Linnet model with `forward`, `decode`,
    `reset` and `generate`. dtype: "f32" (default), "bf16" or "f16"."""
    import linnet.torch

    return linnet.torch.load(
        path, dtype=dtype, device=device, numerics=numerics, max_positions=max_positions
    )
