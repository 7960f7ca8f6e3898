"""The PyTorch backend: one emitter per Core-IR primitive.

An emitter takes (attrs, dims, *inputs) where `dims` binds the runtime dims
(B, S, P…) to ints, and returns a tensor. The interpreter calls them per
node; the source generator renders the same ops as text.
"""

from __future__ import annotations

import torch

from linnet.errors import RuntimeGuardError
from linnet.ir.ops import BINARY, COMPARE, UNARY

TORCH_DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "i32": torch.int32,
    "bool": torch.bool,
}


def _ev(p, dims) -> int:
    return p if isinstance(p, int) else p.eval(dims)


def _slices(starts, stops, dims):
    return tuple(slice(_ev(s, dims), _ev(e, dims)) for s, e in zip(starts, stops))


def _guard(attrs, dims):
    lhs, rhs = _ev(attrs["lhs"], dims), _ev(attrs["rhs"], dims)
    if lhs > rhs:
        bound = ", ".join(f"{k} = {v}" for k, v in sorted(dims.items()))
        raise RuntimeGuardError(
            f"{attrs['where']}: {attrs['message']} failed: "
            f"{attrs['lhs']} = {lhs} > {attrs['rhs']} = {rhs} ({bound})"
        )


def _update_slice(attrs, dims, x, update):
    # In place where the interpreter proved it safe (`inplace_updates`): state
    # buffers then keep their address, which CUDA graphs need.
    if not attrs.get("inplace", False):
        x = x.clone()
    x[_slices(attrs["starts"], [s + n for s, n in zip(attrs["starts"], update.shape)], dims)].copy_(
        update
    )
    return x


UNARY_FNS = {
    "neg": torch.neg,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "tanh": torch.tanh,
    "erf": torch.erf,
    "sin": torch.sin,
    "cos": torch.cos,
    "sigmoid": torch.sigmoid,
    "abs": torch.abs,
}
BINARY_FNS = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "eq": torch.eq,
    "ne": torch.ne,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
}

EMITTERS = {
    "const": lambda a, d: torch.as_tensor(a["value"]).to(TORCH_DTYPES[a["dtype"]]),
    "iota": lambda a, d: torch.arange(
        _ev(a["start"], d), _ev(a["start"], d) + _ev(a["length"], d), dtype=TORCH_DTYPES[a["dtype"]]
    ),
    "cast": lambda a, d, x: x.to(TORCH_DTYPES[a["dtype"]]),
    "where": lambda a, d, c, x, y: torch.where(c, x, y),
    "reduce_sum": lambda a, d, x: x.sum(a["axis"], keepdim=a.get("keepdims", True)),
    "reduce_max": lambda a, d, x: x.amax(a["axis"], keepdim=a.get("keepdims", True)),
    "reduce_mean": lambda a, d, x: x.mean(a["axis"], keepdim=a.get("keepdims", True)),
    "matmul": lambda a, d, x, y: torch.matmul(x, y),
    "reshape": lambda a, d, x: x.reshape([_ev(s, d) for s in a["shape"]]),
    "transpose": lambda a, d, x: x.permute(a["perm"]),
    "slice": lambda a, d, x: x[_slices(a["starts"], a["stops"], d)],
    "concat": lambda a, d, *xs: torch.cat(xs, dim=a["axis"]),
    "take": lambda a, d, table, idx: table[idx],
    "update_slice": _update_slice,
    "guard": _guard,
}
for _name in UNARY:
    EMITTERS[_name] = lambda a, d, x, _f=UNARY_FNS[_name]: _f(x)
for _name in BINARY + COMPARE + ("logical_and", "logical_or"):
    EMITTERS[_name] = lambda a, d, x, y, _f=BINARY_FNS[_name]: _f(x, y)
