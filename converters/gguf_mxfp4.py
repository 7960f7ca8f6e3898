"""GGUF MXFP4 (ggml type 39) tensors from an MXFP4 checkpoint's stored blocks (issue 16).

An HF GPT-OSS checkpoint stores each expert projection as `X_blocks` (uint8 [E, R, G, 16])
and `X_scales` (uint8 [E, R, G]): rows R of G * 32 values, [out, in] per expert, which is
llama.cpp's layout for `ffn_*_exps.weight`. The export copies the codes and scales as they
are, only re-ordered into ggml's block layout (`linnet.weights.mxfp4.to_ggml`), so nothing is
re-quantized: the GGUF tensor dequantizes to exactly the values transformers reads.

    raw = mxfp4_bytes(pair, whole_shape, fused, part)    # uint8, ggml's blocks, row-major
"""

from __future__ import annotations

import numpy as np

from linnet.errors import CheckpointError, ConfigError
from linnet.weights import mxfp4


def check_gpt_oss_rope(arch: str, config: dict) -> None:
    """llama.cpp's gpt-oss takes `rope.scaling.factor` as a frequency scale whatever the
    scaling type says (absent, it reads "linear"): a GPT-OSS config with plain rope has no
    GGUF form that llama.cpp would run as transformers does, so its export is refused."""
    if arch == "gpt-oss" and config.get("rope_scaling") != "yarn":
        raise ConfigError(
            f"rope_scaling = {config.get('rope_scaling')!r}: llama.cpp's gpt-oss would read "
            "rope.scaling.factor as linear scaling; only YaRN GPT-OSS configs export to GGUF"
        )


def _mapped(info) -> np.ndarray:
    return np.memmap(info.file, np.uint8, "r", offset=info.offsets[0], shape=tuple(info.shape))


def mxfp4_bytes(pair, shape: tuple[int, ...], fused=None, part: int | None = None) -> np.ndarray:
    """The ggml bytes of a GGUF tensor of numpy `shape` ([..., R, G * 32]) written from an
    MXFP4 pair (the stored blocks' and scales' `TensorInfo`s); with `fused`, only part
    `part` of it (every n-th row, as the `[gguf.fused]` entry says)."""
    blocks_info, scales_info = pair
    blocks, scales = _mapped(blocks_info), _mapped(scales_info)
    whole = (*blocks.shape[:-2], blocks.shape[-2] * mxfp4.BLOCK)
    if fused is not None:
        blocks, scales = fused.take(blocks, part), fused.take(scales, part)
        whole = fused.part_shape(whole)
    if tuple(whole) != tuple(shape):
        raise CheckpointError(
            f"MXFP4 tensor {blocks_info.name} holds {list(whole)} values, but the GGUF "
            f"tensor is {list(shape)}: its layout is not llama.cpp's [..., out, in]",
            tensor=blocks_info.name,
        )
    return mxfp4.to_ggml(blocks, scales)


def gguf_mxfp4_bytes(tensor, shape: tuple[int, ...], part: int | None = None) -> np.ndarray:
    """The ggml bytes of a GGUF file's MXFP4 tensor (part `part` of a fused one) as the
    file holds them: a GGUF re-export writes them unchanged, never re-quantized."""
    source = tensor if part is None else tensor.parts[part]
    stored = tuple(int(d) for d in reversed(source.shape.tolist()))
    if stored != tuple(shape):
        raise CheckpointError(
            f"MXFP4 tensor {source.name} is {list(stored)}, the GGUF tensor {list(shape)}",
            tensor=source.name,
        )
    return np.asarray(source.data, np.uint8).reshape(-1)
