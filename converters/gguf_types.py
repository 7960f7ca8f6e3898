"""Which GGUF type each tensor of an export gets, by llama.cpp's rules.

Export dtypes are llama.cpp's type names, lower-cased: f32, f16, bf16, q8_0, the 32-blocks
q4_0 / q4_1 / q5_0 / q5_1, the k-quants q4_k / q5_k / q6_k (every quantizable tensor in
that one type, as `llama-quantize --pure`), and the mixes q4_k_m / q5_k_m, which follow
`llama_tensor_get_type` in llama.cpp's src/llama-quant.cpp for the architectures Linnet
exports (no experts, no Falcon):

- output.weight, and token_embd.weight when the file has no output.weight (tied): q6_K,
  or q8_0 when its rows are not whole 256-blocks;
- attn_v.weight (attn_qkv.weight for fused QKV: GPT-2, Phi-3) and ffn_down.weight of
  layer i: q6_K when `use_more_bits(i, n)`: the first and last eighth of the layers and
  every third layer between; else the base type (q4_K / q5_K);
- everything else the base type.

Then, as llama.cpp's `tensor_type_fallback`: a k-quant whose rows are not whole
256-blocks becomes q5_0 (q4_K), q5_1 (q5_K) or q8_0 (q6_K), and a type whose rows are
not whole 32-blocks becomes f16. 1-D tensors (norms, biases) stay f32, and so do the
tensors llama.cpp never quantizes (position_embd, token_types), and in every dtype the
biases (GPT-OSS's expert biases are 2-D) and the MoE router (`ffn_gate_inp`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FLOATS = ("f32", "f16", "bf16")
QUANTS = ("q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m")
GGUF_DTYPES = (*FLOATS, "q8_0", *QUANTS)
MIX_BASE = {"q4_k_m": "q4_k", "q5_k_m": "q5_k"}
BLOCK = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32}
BLOCK.update(q4_k=256, q5_k=256, q6_k=256)
FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
# general.file_type; a pure k-quant file is written as llama.cpp writes `--pure` Q4_K_S.
FILE_TYPE = {
    "f32": "ALL_F32",
    "f16": "MOSTLY_F16",
    "bf16": "MOSTLY_BF16",
    "q8_0": "MOSTLY_Q8_0",
    "q4_0": "MOSTLY_Q4_0",
    "q4_1": "MOSTLY_Q4_1",
    "q5_0": "MOSTLY_Q5_0",
    "q5_1": "MOSTLY_Q5_1",
    "q4_k": "MOSTLY_Q4_K_S",
    "q5_k": "MOSTLY_Q5_K_S",
    "q6_k": "MOSTLY_Q6_K",
    "q4_k_m": "MOSTLY_Q4_K_M",
    "q5_k_m": "MOSTLY_Q5_K_M",
}
NOT_QUANTIZED = ("position_embd.weight", "token_types.weight")
# Kept f32 in every dtype, as llama.cpp's converter keeps them: anything but a weight (GPT-OSS's
# expert biases are 2-D) and the MoE router.
ALWAYS_F32 = (".bias", ".ffn_gate_inp.weight")
_LAYER = re.compile(r"blk\.(\d+)\.")


def file_type(dtype: str) -> int:
    from gguf import LlamaFileType

    return int(LlamaFileType[FILE_TYPE[dtype]])


def ggml_type(kind: str):
    """The GGMLQuantizationType of a tensor kind (f32 ... q6_k)."""
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[kind.upper()]


def tensor_bytes(kind: str, shape: tuple[int, ...]) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[ggml_type(kind)]
    n = 1
    for dim in shape:
        n *= int(dim)
    return n // block * size


@dataclass(frozen=True)
class Layout:
    """What the mixes need to know of the whole file."""

    n_layers: int  # blocks (blk.N.*)
    n_attn_v: int  # attn_v / attn_qkv tensors
    tied: bool  # no output.weight: token_embd is the head too

    @classmethod
    def of(cls, names: list[str]) -> Layout:
        return cls(
            n_layers=len({m.group(1) for m in map(_LAYER.match, names) if m}),
            n_attn_v=sum(_is_attn_v(n) for n in names),
            tied="output.weight" not in names,
        )


def _is_attn_v(name: str) -> bool:
    return "attn_v.weight" in name or "attn_qkv.weight" in name


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers that keep more bits in the _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name: str) -> int:
    m = _LAYER.match(name)
    if m is None:
        raise ValueError(f"{name}: no layer index (blk.N.)")
    return int(m.group(1))


def mix_kind(name: str, cols: int, dtype: str, layout: Layout) -> str:
    """The type a q4_k_m / q5_k_m mix gives tensor `name` (before the fallbacks)."""
    base = MIX_BASE[dtype]
    if name == "output.weight" or (layout.tied and name == "token_embd.weight"):
        return "q6_k" if cols % BLOCK[base] == 0 else "q8_0"
    if _is_attn_v(name):
        return "q6_k" if use_more_bits(_layer(name), layout.n_attn_v) else base
    if ".ffn_down" in name:
        return "q6_k" if use_more_bits(_layer(name), layout.n_layers) else base
    return base


def fallback(kind: str, cols: int) -> str:
    """llama.cpp's type for rows of `cols` that are not whole blocks of `kind`."""
    if cols % BLOCK[kind]:
        kind = FALLBACK.get(kind, kind)
    return "f16" if cols % BLOCK[kind] else kind


def tensor_kind(name: str, shape: tuple[int, ...], dtype: str, layout: Layout) -> str:
    """The GGUF type of tensor `name` (numpy-order `shape`) in an export as `dtype`."""
    if len(shape) < 2 or dtype == "f32" or name.endswith(ALWAYS_F32):
        return "f32"
    if dtype in FLOATS:
        return dtype
    if dtype == "q8_0":  # as llama.cpp's converter writes q8_0
        return fallback("q8_0", shape[-1])
    if not name.endswith("weight") or "_norm.weight" in name or name in NOT_QUANTIZED:
        return "f32"
    kind = mix_kind(name, shape[-1], dtype, layout) if dtype in MIX_BASE else dtype
    return fallback(kind, shape[-1])
