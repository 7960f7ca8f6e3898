"""Device moves for layers split across devices and weights streamed from host memory
(issue 19). Registered into `linnet.ir.ops.OPS` when that module loads, like the
collectives.

The placement pass (`linnet/shard/place.py`) inserts them into a lowered graph:
`to_device` where a value crosses from one device to the next (the activations at a
pipeline boundary, a position tensor made on the first device), and, with
`prefetch=True`, where a streamed layer's weights are copied in from host memory one
layer ahead of their use; `await_copy` where such a copy is first used (on CUDA the
compute stream waits for the copy stream there). Both keep the type: a device is not part
of a Core-IR type. PyTorch lowers them to copies; JAX and ONNX to the identity (one
device, or XLA's own placement).
"""

from __future__ import annotations

from linnet.ir.ops import op
from linnet.ir.types import OpTypeError


@op(
    "to_device",
    doc="x on the device attrs['device'] (a PyTorch device string); attrs['prefetch']: "
    "an asynchronous copy on a side stream, to be awaited by await_copy before use",
)
def _to_device(ins, attrs):
    if not isinstance(attrs.get("device"), str):
        raise OpTypeError("to_device needs a device string", "'cuda:1'", str(attrs.get("device")))
    return ins[0]


@op("await_copy", doc="x once its asynchronous to_device copy has landed")
def _await_copy(ins, attrs):
    return ins[0]
