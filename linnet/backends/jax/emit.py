"""The JAX backend: one text emitter per Core-IR op, as for PyTorch (`torch_emit`).

An emitter takes (attrs, spell, *inputs) — inputs are Python expressions — and
returns the expression of the op's result (jax.numpy / jax.lax), or `Lines` for
a statement (host guards). Values are immutable: a state write is
`lax.dynamic_update_slice`, a new array. Runtime dims named in `spell.traced`
(the start position P) are traced int32 scalars, so slices that start at them
become `lax.dynamic_slice`; every shape stays static (or symbolic under
`jax.export`). Library ops call `jax_prelude` helpers: `ref` in
numerics="equivalent", `fast` in numerics="fast".
"""

from __future__ import annotations

import math

from linnet.backends.emit import Lines, Spell, attention_operands, elementwise_emitters, emit_node
from linnet.core.dims import Poly
from linnet.core.dtypes import DTYPES

# JAX runs 32-bit integers unless x64 is switched on: token ids and positions fit.
JAX_DTYPE_NAMES = {name: f"jnp.{d.jax}" for name, d in DTYPES.items()}


class JaxSpell(Spell):
    """How the JAX drivers write dims (names), dtypes and rope tables; `traced` names the
    runtime dims that are traced scalars rather than Python ints or shape dims."""

    dtype_names = JAX_DTYPE_NAMES

    def __init__(self, numerics: str = "equivalent", traced=("P",), dim_atom=lambda a: a):
        super().__init__(dim_atom=dim_atom, numerics=numerics)
        self.traced = frozenset(traced)

    def is_traced(self, p) -> bool:
        return bool(self.traced & Poly.lift(p).atoms())

    def helper(self, op: str) -> str:
        return f"{op}_{'fast' if self.numerics == 'fast' else 'ref'}"


def _zero(p) -> bool:
    return Poly.lift(p) == Poly.const(0)


def scalar_text(value, dtype: str) -> str:
    """A Python literal (weakly typed: it takes the dtype of the array it meets)."""
    if dtype in ("f32", "f16", "bf16"):
        value = float(value)
        if math.isinf(value):
            return "-math.inf" if value < 0 else "math.inf"
        return "math.nan" if math.isnan(value) else repr(value)
    return repr(bool(value)) if dtype == "bool" else repr(int(value))


def _const(a, s):
    value = a["value"]
    if value.ndim == 0:
        return scalar_text(value, a["dtype"])
    raise ValueError("array constants are folded by the driver")


def _tuple(s, dims) -> str:
    text = s.dims(dims)
    return f"({text},)" if len(dims) == 1 else f"({text})"


def _slice(a, s, x):
    starts, stops = a["starts"], a["stops"]
    if any(s.is_traced(lo) for lo in starts):
        sizes = [Poly.lift(hi) - Poly.lift(lo) for lo, hi in zip(starts, stops)]
        return f"lax.dynamic_slice({x}, {_tuple(s, starts)}, {_tuple(s, sizes)})"
    steps = a.get("steps") or (1,) * len(starts)
    items = [
        f"{'' if _zero(lo) else s.dim(lo)}:{s.dim(hi)}" + (f":{k}" if k != 1 else "")
        for lo, hi, k in zip(starts, stops, steps)
    ]
    return f"{x}[{', '.join(items)}]"


def _pad(a, s, x):
    pads = tuple(tuple(p) for p in a["pads"])
    return f"jnp.pad({x}, {pads}, constant_values={scalar_text(a['value'], 'f32')})"


def _conv(a, s, x, w, b=None):
    args = [x, w] + ([] if b is None else [b])
    stride, padding = a.get("stride", 1), a.get("padding", 0)
    more = "".join(f", {k}={a[k]}" for k in ("dilation", "groups") if a.get(k, 1) != 1)
    return f"{s.helper('conv')}({', '.join(args)}, stride={stride}, padding={padding}{more})"


def _conv_transpose(a, s, x, w, b=None):  # issue 15 (SAM): prelude conv_transpose
    args = [x, w] + ([] if b is None else [b])
    stride, padding = a.get("stride", 1), a.get("padding", 0)
    return f"conv_transpose({', '.join(args)}, stride={stride}, padding={padding})"


def _conv1d(a, s, x, w, b=None):
    args = [x, w] + ([] if b is None else [b])
    stride, padding = a.get("stride", 1), a.get("padding", 0)
    return f"{s.helper('conv1d')}({', '.join(args)}, stride={stride}, padding={padding})"


def _max_pool(a, s, x):
    return f"max_pool({x}, {a['kernel']}, {a.get('stride', 1)}, {a.get('padding', 0)})"


def _update_slice(a, s, x, update):
    return f"lax.dynamic_update_slice({x}, {update}, {_tuple(s, a['starts'])})"


def _update_rows(a, s, x, update, positions):
    if "row_axis" in a:  # positions [R, S]: every axis indexed by arrays, shaped like update
        return f"{x}.at[{_row_index(a, s, positions)}].set({update})"
    index = ", ".join(
        positions if i == a["axis"] else f"{s.dim(lo)}:{s.dim(Poly.lift(lo) + n)}"
        for i, (lo, n) in enumerate(zip(a["starts"], a["sizes"]))
    )
    return f"{x}.at[{index}].set({update})"


def _row_index(a, s, positions) -> str:
    """An index array per axis broadcasting to the update's shape: the positions (R at
    row_axis, S at axis) along `axis`, lo..lo+n along every other axis."""
    rank, axis, row_axis = len(a["sizes"]), a["axis"], a["row_axis"]
    items = []
    for i, (lo, n) in enumerate(zip(a["starts"], a["sizes"])):
        if i == axis:
            shape = [s.dim(a["sizes"][j]) if j in (row_axis, axis) else "1" for j in range(rank)]
            items.append(f"{positions}.reshape({', '.join(shape)})")
            continue
        shape = ", ".join("-1" if j == i else "1" for j in range(rank))
        stop = s.dim(Poly.lift(lo) + n)
        items.append(f"jnp.arange({s.dim(lo)}, {stop}).reshape({shape})")
    return ", ".join(items)


def _iota(a, s):
    arange = f"jnp.arange({s.dim(a['length'])}, dtype={s.dtype(a['dtype'])})"
    return arange if _zero(a["start"]) else f"{s.dim(a['start'])} + {arange}"


def _guard(a, s):
    message = f"{a.get('where', '')}: {a['message']}".lstrip(": ")
    texts = f"{str(a['lhs'])!r}, {str(a['rhs'])!r}"
    return Lines([f"_guard({s.dim(a['lhs'])}, {s.dim(a['rhs'])}, {message!r}, {texts})"], None)


def _matmul(a, s, x, y):
    if s.numerics == "fast":
        return f"{x} @ {y}"
    return f"jnp.matmul({x}, {y}, precision=HIGHEST)"


def _reduce(fn):
    return lambda a, s, x: f"jnp.{fn}({x}, axis={a['axis']}, keepdims={a.get('keepdims', True)})"


def _rope(a, s, x, at=None):
    table = s.rope_table(a, a["head_dim"])
    offset = at if at is not None else s.dim(a["offset"])  # positions array, or int/scalar
    return f"{s.helper('rope')}({x}, {table}_cos, {table}_sin, {offset})"


def _attention(a, s, q, k, v, *extra):
    mask, sinks, q_positions = attention_operands(a, extra)
    offset = q_positions if q_positions is not None else s.dim(a["q_offset"])
    args = [q, k, v, str(a["causal"]), offset, s.dim(a["window"] or 0), repr(a["scale"])]
    args += [mask] if mask is not None else []
    args += [f"sinks={sinks}"] if sinks is not None else []
    return f"{s.helper('attention')}({', '.join(args)})"


def _moe(a, s, *xs):
    return f"{s.helper('moe')}({', '.join(xs)}, {a['top_k']}, {a['alpha']!r}, {a['limit']!r})"


def _norm(kind):
    return lambda a, s, *xs: f"{s.helper(kind)}({', '.join(xs)}, {a['eps']!r})"


def _linear(a, s, x, w, b=None):
    return f"{s.helper('linear')}({x}, {w}{'' if b is None else f', {b}'})"


UNARY_TEXT = {
    "neg": "jnp.negative",
    "exp": "jnp.exp",
    "log": "jnp.log",
    "sqrt": "jnp.sqrt",
    "rsqrt": "lax.rsqrt",
    "tanh": "jnp.tanh",
    "erf": "lax.erf",
    "sin": "jnp.sin",
    "cos": "jnp.cos",
    "sigmoid": "jax.nn.sigmoid",
    "abs": "jnp.abs",
}
INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "pow": "**",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
}
CALLS = {
    "maximum": "jnp.maximum",
    "minimum": "jnp.minimum",
    "logical_and": "jnp.logical_and",
    "logical_or": "jnp.logical_or",
}

EMITTERS = {
    "const": _const,
    "iota": _iota,
    "cast": lambda a, s, x: f"{x}.astype({s.dtype(a['dtype'])})",
    "where": lambda a, s, c, x, y: f"jnp.where({c}, {x}, {y})",
    "reduce_sum": _reduce("sum"),
    "reduce_max": _reduce("max"),
    "reduce_mean": _reduce("mean"),
    "matmul": _matmul,
    "reshape": lambda a, s, x: f"{x}.reshape({s.dims(a['shape'])})",
    "transpose": lambda a, s, x: f"{x}.transpose({', '.join(map(str, a['perm']))})",
    "slice": _slice,
    "pad": _pad,
    "broadcast": lambda a, s, x: f"jnp.broadcast_to({x}, {_tuple(s, a['shape'])})",
    "concat": lambda a, s, *xs: f"jnp.concatenate([{', '.join(xs)}], axis={a['axis']})",
    "take": lambda a, s, table, idx: f"{table}[{idx}]",
    "update_slice": _update_slice,
    "update_rows": _update_rows,
    "guard": _guard,
    # library ops (their decompositions are the reference; see jax_prelude)
    "linear": _linear,
    "rms_norm": _norm("rms_norm"),
    "layer_norm": _norm("layer_norm"),
    "softmax": lambda a, s, x: f"{s.helper('softmax')}({x}, {a['axis']})",
    "silu": lambda a, s, x: f"jax.nn.silu({x})",
    "gelu": lambda a, s, x: f"{s.helper('gelu')}({x}, {(a['approx'] or 'none')!r})",
    "rope": _rope,
    "attention": _attention,
    "conv": _conv,
    "conv1d": _conv1d,
    "conv_transpose": _conv_transpose,
    "max_pool": _max_pool,
    "batch_norm": lambda a, s, *xs: f"{s.helper('batch_norm')}({', '.join(xs)}, {a['eps']!r})",
    "group_norm": lambda a, s, *xs: (
        f"{s.helper('group_norm')}({', '.join(xs)}, {a['groups']}, {a['eps']!r})"
    ),
    "upsample_nearest": lambda a, s, x: f"upsample_nearest({x}, {a['scale']})",
    "resize_bilinear": lambda a, s, x: (
        f"resize_bilinear({x}, {s.dim(a['size'][0])}, {s.dim(a['size'][1])}, "
        f"{bool(a.get('align_corners', False))})"
    ),
    "moe": _moe,
    "timestep_embedding": lambda a, s, t: (
        f"timestep_embedding({t}, {a['dim']}, {a.get('flip', True)}, "
        f"{float(a.get('shift', 0.0))!r}, {float(a.get('max_period', 10000.0))!r})"
    ),
}
EMITTERS.update(elementwise_emitters(UNARY_TEXT, INFIX, CALLS))
# Tensor-parallel collectives (issue 19, docs/parallel.md) over the mesh axis "tp": a rank's
# local graph under shard_map. `linnet.jax.load(..., mesh=)` runs the whole graph instead,
# with NamedSharding on params and cache, and XLA inserts its own collectives.
EMITTERS["all_reduce"] = lambda a, s, x: f"jax.lax.psum({x}, 'tp')"
EMITTERS["all_gather"] = lambda a, s, x: (
    f"jax.lax.all_gather({x}, 'tp', axis={a['axis']}, tiled=True)"
)
# Device moves of a layer split or host offload (issue 19) are PyTorch's; JAX places arrays
# itself (the identity keeps every op lowered on every backend).
EMITTERS["to_device"] = EMITTERS["await_copy"] = lambda a, s, x: x


def emit(node, spell: JaxSpell, inputs: list[str]):
    """The text of one node: an expression, or Lines."""
    return emit_node(EMITTERS, node, spell, inputs)
