"""The UNet's op of the op table (issue 15): diffusers' sinusoidal timestep embedding.
Registered into `linnet.ir.ops.OPS` when that module loads (it imports this one last);
the decomposition is in `linnet/ir/library_unet.py`."""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.ir.ops import op
from linnet.ir.types import OpTypeError, TensorType


@op(
    "timestep_embedding",
    "library",
    "diffusers' sinusoidal embedding (get_timestep_embedding) of f32 timesteps t [B] -> "
    "[B, dim], or t [B, N] -> [B, N * dim] (each column's embedding in turn): t * freqs with "
    "freqs = exp(-ln(max_period) * k / (dim / 2 - shift)), k < dim / 2, then sin and cos "
    "(cos first when attrs['flip']); attrs dim (even), flip, shift, max_period",
)
def _timestep_embedding(ins, attrs):
    t = ins[0]
    dim = attrs["dim"]  # an int when lowering; the checker may pass a config dim
    if t.dtype != "f32" or t.rank not in (1, 2):
        raise OpTypeError(
            "timestep_embedding needs f32 [B] or [B, N]", "f32[B] or f32[B, N]", str(t)
        )
    if not isinstance(dim, Poly) and (not isinstance(dim, int) or dim < 2 or dim % 2):
        raise OpTypeError("timestep_embedding needs an even dim >= 2", "even", str(dim))
    dim = Poly.lift(dim)
    return TensorType("f32", (t.shape[0], dim if t.rank == 1 else t.shape[1] * dim))
