"""Collectives across tensor-parallel ranks (issue 19). Registered into
`linnet.ir.ops.OPS` when that module loads, like the image and moe ops.

The tensor-parallel rewrite (`linnet/shard/rewrite.py`) inserts them into a rank's local
graph: `all_reduce` after a row-parallel linear (each rank holds a partial sum of the
output), `all_gather` where a split axis must be whole again. Every backend lowers them:
PyTorch through `torch.distributed` (gloo on CPU, NCCL on GPUs), JAX through named-axis
collectives (`lax.psum`, `lax.all_gather` over the mesh axis `tp`), ONNX refuses them.
"""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.ir.ops import norm_axis, op, require_float
from linnet.ir.types import OpTypeError


@op(
    "all_reduce",
    doc="the elementwise sum of x over every rank of the tensor-parallel group; "
    "each rank gets the whole sum",
)
def _all_reduce(ins, attrs):
    require_float(ins[0], "all_reduce")
    return ins[0]


@op(
    "all_gather",
    doc="the ranks' x joined along attrs['axis'] in rank order (attrs['world'] ranks); "
    "each rank gets the whole tensor",
)
def _all_gather(ins, attrs):
    x = ins[0]
    axis = norm_axis(attrs["axis"], x.rank)
    world = attrs["world"]
    if not isinstance(world, int) or world < 1:
        raise OpTypeError("all_gather needs a world size of 1 or more", ">= 1", str(world))
    shape = list(x.shape)
    shape[axis] = shape[axis] * Poly.const(world)
    return x.with_shape(shape)
