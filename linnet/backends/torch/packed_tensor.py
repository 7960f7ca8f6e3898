"""The base of weights that stay packed at run time (`quantized.PackedWeight`,
`mxfp4_experts.Mxfp4Experts`): a tensor subclass whose `handlers` answer the ops it has a
packed form for (a linear, an expert's matmul, slices); any other op sees `dense()`, the
weight dequantized to its dtype (correct, not fast)."""

from __future__ import annotations

from typing import ClassVar

import torch


class PackedTensor(torch.Tensor):
    handlers: ClassVar[dict] = {}  # torch function -> handler (NotImplemented: no packed form)

    def dense(self) -> torch.Tensor:
        """The weight as an op without a packed form sees it, in its dtype."""
        raise NotImplementedError

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = cls.handlers.get(func)
        with torch._C.DisableTorchFunctionSubclass():
            if handler is not None:
                found = handler(*args, **kwargs)
                if found is not NotImplemented:
                    return found
            return func(*args, **kwargs)  # metadata, or __torch_dispatch__ below

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return func(*plain(args), **plain(kwargs or {}))


def plain(value):
    """`value` with every packed tensor in it made dense."""
    if isinstance(value, PackedTensor):
        with torch._C.DisableTorchFunctionSubclass():
            return value.dense()
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def device_and_dtype(args, kwargs) -> tuple:
    """The target device and dtype of a `Tensor.to(...)` call (None where not given)."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, (str, torch.device)):
            device = torch.device(a)
        elif isinstance(a, torch.Tensor):
            device, dtype = a.device, a.dtype
    return device, dtype
