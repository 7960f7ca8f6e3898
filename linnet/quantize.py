"""Quantized weights for the PyTorch front door: `linnet.torch.load(path, dtype="q8_0")`.

    quant = packed_dtype("Q4_K")                  # "q4_k" (None for f32, bf16, ...)
    params = quantize_params(params, "q8_0")      # f32 2-D weights -> PackedWeight
    w = to_packed_weight(packed_arrays, torch.float32, "cpu")

A GGUF file's q8_0, q4_0 and q4_K tensors are kept as they are stored
(`linnet.weights.gguf_packed`); an HF checkpoint's 2-D weights (linears and embeddings)
are quantized on load with the GGUF exporter's own quantizers (q8_0 as the gguf package
does, q4_0 and q4_K from the formats' definitions in `linnet.converters`), so a folder
loaded at q4_k runs the weights its q4_k export would hold: llama.cpp's fallback for rows
that are not whole 256-blocks (q5_0) included. A weight no packed type fits
stays f32.
"""

from __future__ import annotations

import numpy as np
import torch

from linnet.backends.torch.kernels import int8x_reads_q5_0
from linnet.backends.torch.quantized import PackedWeight
from linnet.weights.gguf_packed import PACKED_TYPES, PackedArrays, packed_from_ggml


def packed_dtype(dtype) -> str | None:
    """The packed type a `dtype` names (case-insensitive), else None."""
    if isinstance(dtype, str) and dtype.lower() in PACKED_TYPES:
        return dtype.lower()
    return None


def to_packed_weight(p: PackedArrays, dtype: torch.dtype, device="cpu") -> PackedWeight:
    """q5_0 stays 5-bit where the integer kernel reads it (`kernels.int8x_reads_q5_0`:
    24 bytes a block), else goes to q8_0's layout (36) for the kernels that read that."""
    if p.kind == "q5_0" and not (torch.device(device).type == "cpu" and int8x_reads_q5_0()):
        p = p.as_q8_0()

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


def stored_kind(name: str, t: torch.Tensor, kind: str) -> str | None:
    """The ggml type a `kind` export stores weight `name` in, where it is packed: 2-D
    float weights, `kind` where rows are whole blocks, else llama.cpp's fallback (q4_K:
    q5_0); None (stays float) for position tables, as llama.cpp keeps
    position_embd, and rows no packed type fits."""
    from linnet.converters.gguf_types import fallback

    if isinstance(t, PackedWeight) or t.dim() != 2 or not t.is_floating_point():
        return None
    found = fallback(kind, t.shape[1])
    return found if found in _UNPACKED and "position" not in name else None


_UNPACKED = (*PACKED_TYPES, "q5_0")  # what packed_from_ggml unpacks


def quantize_params(params: dict, kind: str) -> dict:
    """Every quantizable param packed as `kind`; tied params stay one object."""
    done: dict[int, torch.Tensor] = {}
    out = {}
    for name, t in params.items():
        if id(t) not in done:
            stored = stored_kind(name, t, kind)
            if stored is not None:
                x = t.detach().float().cpu().numpy()
                p = packed_from_ggml(ggml_bytes(x, stored), stored, x.shape)
                done[id(t)] = to_packed_weight(p, t.dtype, t.device)
            else:
                done[id(t)] = t
        out[name] = done[id(t)]
    return out
