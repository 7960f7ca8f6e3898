"""The one dtype table: each dtype a source may name, and how every library spells it.

    DTYPES["bf16"].torch       # "bfloat16": torch.bfloat16
    normalize_dtype("float16") # "f16"
    numpy_dtype("bf16")        # ml_dtypes.bfloat16

Backends, readers and writers derive their own tables from this one instead of writing
another; nothing here imports torch, JAX or onnx.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from linnet.errors import ConfigError


@dataclass(frozen=True)
class DType:
    name: str  # how a source, a CLI flag and Linnet's APIs spell it
    safetensors: str  # the safetensors header code
    numpy: str  # numpy (or ml_dtypes) name
    torch: str  # attribute of the torch module
    jax: str  # attribute of jax.numpy: JAX runs 32-bit ints unless x64 is switched on
    onnx: str  # attribute of onnx.TensorProto
    hf: str  # config.json's `dtype` / `torch_dtype` name
    bits: int


_ROWS = (
    DType("f32", "F32", "float32", "float32", "float32", "FLOAT", "float32", 32),
    DType("f16", "F16", "float16", "float16", "float16", "FLOAT16", "float16", 16),
    DType("bf16", "BF16", "bfloat16", "bfloat16", "bfloat16", "BFLOAT16", "bfloat16", 16),
    DType("i64", "I64", "int64", "int64", "int32", "INT64", "int64", 64),
    DType("i32", "I32", "int32", "int32", "int32", "INT32", "int32", 32),
    DType("bool", "BOOL", "bool", "bool", "bool_", "BOOL", "bool", 8),
)
DTYPES: dict[str, DType] = {row.name: row for row in _ROWS}
FLOAT_DTYPES = ("f32", "f16", "bf16")
INT_DTYPES = ("i64", "i32")
_ALIASES = {"fp32": "f32", "fp16": "f16"}
BY_SAFETENSORS: dict[str, DType] = {row.safetensors: row for row in _ROWS}


def normalize_dtype(dtype, allowed: tuple[str, ...] = FLOAT_DTYPES) -> str:
    """A dtype as Linnet names it, from any spelling a user may pass: `bf16`,
    `bfloat16`, `torch.bfloat16` (a torch dtype itself, without importing torch)."""
    text = str(dtype).removeprefix("torch.").removeprefix("jnp.").lower()
    text = _ALIASES.get(text, text)
    for row in _ROWS:
        if text in (row.name, row.hf, row.numpy) and row.name in allowed:
            return row.name
    if text in allowed:  # a writer's own formats beyond the table (GGUF's q8_0)
        return text
    raise ConfigError(f"dtype {dtype!r}: expected one of {', '.join(allowed)}")


def numpy_dtype(name: str, *, as_jax: bool = False) -> np.dtype:
    """The numpy dtype of a Linnet dtype (bf16 from ml_dtypes); `as_jax` gives what a
    JAX array of it holds (i64 as int32)."""
    row = DTYPES[name]
    spelled = row.jax.rstrip("_") if as_jax else row.numpy
    if spelled == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(spelled)
