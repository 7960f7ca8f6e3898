"""Quantized weights for the PyTorch front door: `linnet.torch.load(path, dtype="q8_0")`.

    quant = packed_dtype("Q4_K")                  # "q4_k" (None for f32, bf16, ...)
    params = quantize_params(params, "q8_0")      # f32 2-D weights -> PackedWeight
    w = to_packed_weight(packed_arrays, torch.float32, "cpu")

A GGUF file's q8_0, q4_0 and q4_K tensors are kept as they are stored
(`linnet.weights.gguf_packed`); an HF checkpoint's 2-D weights (linears and embeddings)
are quantized on load with the GGUF exporter's own quantizers (q8_0 as the gguf package
does, q4_0 and q4_K from the formats' definitions in `linnet.converters`), so a folder
loaded at q4_k runs the weights its q4_k export would hold. A weight whose rows are not
whole blocks stays f32.
"""

from __future__ import annotations

import numpy as np
import torch

from linnet.backends.torch.quantized import PackedWeight
from linnet.weights.gguf_packed import BLOCK, PACKED_TYPES, PackedArrays, packed_from_ggml


def packed_dtype(dtype) -> str | None:
    """The packed type a `dtype` names (case-insensitive), else None."""
    if isinstance(dtype, str) and dtype.lower() in PACKED_TYPES:
        return dtype.lower()
    return None


def to_packed_weight(p: PackedArrays, dtype: torch.dtype, device="cpu") -> PackedWeight:
    def part(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(device)

    return PackedWeight.build(p.kind, part(p.codes), part(p.scale), part(p.offset), dtype=dtype)


def ggml_bytes(x: np.ndarray, kind: str) -> np.ndarray:
    """(rows, cols) f32 quantized to ggml's block bytes."""
    if kind == "q8_0":
        from gguf import GGMLQuantizationType, quants

        return quants.quantize(x, GGMLQuantizationType.Q8_0)
    from linnet.converters.gguf_quants import quantize_rows

    return quantize_rows(x, kind)


def quantizable(name: str, t: torch.Tensor, kind: str) -> bool:
    """2-D float weights with whole blocks per row; position tables stay float, as
    llama.cpp keeps position_embd."""
    if isinstance(t, PackedWeight) or t.dim() != 2 or not t.is_floating_point():
        return False
    return t.shape[1] % BLOCK[kind] == 0 and "position" not in name


def quantize_params(params: dict, kind: str) -> dict:
    """Every quantizable param packed as `kind`; tied params stay one object."""
    done: dict[int, torch.Tensor] = {}
    out = {}
    for name, t in params.items():
        if id(t) not in done:
            if quantizable(name, t, kind):
                x = t.detach().float().cpu().numpy()
                p = packed_from_ggml(ggml_bytes(x, kind), kind, x.shape)
                done[id(t)] = to_packed_weight(p, t.dtype, t.device)
            else:
                done[id(t)] = t
        out[name] = done[id(t)]
    return out
