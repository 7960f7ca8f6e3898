"""The decomposition of `timestep_embedding` (linnet/ir/ops_unet.py): the frequency table
is a constant computed as diffusers computes it, in f32; the rest is primitives."""

from __future__ import annotations

import functools
import math

import numpy as np

from linnet.core.dims import Poly


@functools.cache
def timestep_frequencies(dim: int, shift: float, max_period: float) -> np.ndarray:
    """exp(-ln(max_period) * k / (dim / 2 - shift)) for k < dim / 2, each step in f32 as
    diffusers' get_timestep_embedding takes it (the exponential rounded once from f64)."""
    half = dim // 2
    exponent = np.float32(-math.log(max_period)) * np.arange(half, dtype=np.float32)
    exponent = exponent / np.float32(half - shift)
    return np.exp(exponent.astype(np.float64)).astype(np.float32)


def timestep_embedding(b, t, *, dim, flip=True, shift=0.0, max_period=10000.0):
    """t [B] or [B, N] times the table [dim / 2], then [sin, cos] (or [cos, sin]) joined on
    the last axis; [B, N, dim] is flattened to [B, N * dim]."""
    shape = b.type_of(t).shape
    one = Poly.const(1)
    freqs = timestep_frequencies(dim, float(shift), float(max_period))
    table = b.add(
        "const",
        [],
        value=freqs.astype(np.float64).reshape((1,) * len(shape) + (dim // 2,)),
        dtype="f32",
    )
    args = b.add("mul", [b.add("reshape", [t], shape=tuple(shape) + (one,)), table])
    sin, cos = b.add("sin", [args]), b.add("cos", [args])
    emb = b.add("concat", [cos, sin] if flip else [sin, cos], axis=len(shape))
    if len(shape) == 2:
        emb = b.add("reshape", [emb], shape=(shape[0], shape[1] * dim))
    return emb
