"""The PyTorch backend: one text emitter per Core-IR op.

An emitter takes (attrs, spell, *inputs) — inputs are Python expressions — and
returns the Python expression of the op's result, or `Lines` when the op is a
statement (in-place state writes, guards). `spell` says how the driver writes
dims, dtypes, devices and rope tables. The interpreter compiles each node's
text into a function once; the source generator writes the same text into a
module. Library ops call `torch_prelude` helpers: the `ref` ones in
numerics="equivalent", the fused `fast` ones in numerics="fast".
"""

from __future__ import annotations

import math

from linnet.backends.emit import Lines, attention_operands, elementwise_emitters, emit_node
from linnet.backends.emit import Spell as BaseSpell
from linnet.core.dims import Poly
from linnet.core.dtypes import DTYPES

TORCH_DTYPE_NAMES = {name: f"torch.{d.torch}" for name, d in DTYPES.items()}


class Spell(BaseSpell):
    """How the PyTorch drivers write dims, dtypes (`torch.float32`) and rope tables."""

    dtype_names = TORCH_DTYPE_NAMES


def _slices(spell: Spell, starts, stops, steps=None) -> str:
    items = []
    for lo, hi, step in zip(starts, stops, steps or (1,) * len(starts)):
        lo_text = "" if Poly.lift(lo) == Poly.const(0) else spell.dim(lo)
        items.append(f"{lo_text}:{spell.dim(hi)}" + (f":{step}" if step != 1 else ""))
    return ", ".join(items)


def _pad(a, s, x):
    flat = [n for lo, hi in reversed(a["pads"]) for n in (lo, hi)]  # last axis first
    value = float(a["value"])
    text = repr(value) if math.isfinite(value) else ("-" if value < 0 else "") + "math.inf"
    return f"F.pad({x}, {tuple(flat)}, value={text})"


def _conv(a, s, x, w, b=None):
    args = f"{x}, {w}, {b}, {a.get('stride', 1)}, {a.get('padding', 0)}"
    dilation, groups = a.get("dilation", 1), a.get("groups", 1)
    if (dilation, groups) != (1, 1):  # only then, so plain convs' generated code is unchanged
        args += f", {dilation}, {groups}"
    return f"F.conv2d({args})"


def _batch_norm(a, s, x, w, b, mean, var):
    fn = "batch_norm_fast" if s.numerics == "fast" else "batch_norm_ref"
    return f"{fn}({x}, {w}, {b}, {mean}, {var}, {a['eps']!r})"


def _group_norm(a, s, x, w, b):
    fn = "group_norm_fast" if s.numerics == "fast" else "group_norm_ref"
    return f"{fn}({x}, {w}, {b}, {a['groups']}, {a['eps']!r})"


def _conv_transpose(a, s, x, w, b=None):  # issue 15 (SAM)
    return f"F.conv_transpose2d({x}, {w}, {b}, {a.get('stride', 1)}, {a.get('padding', 0)})"


def _upsample_nearest(a, s, x):
    # an integer scale: source pixel floor(i / scale), exactly the decomposition's repeat
    return f"F.interpolate({x}, scale_factor={float(a['scale'])!r}, mode='nearest')"


def _resize_bilinear(a, s, x):
    oh, ow = (s.dim(d) for d in a["size"])
    corners = bool(a.get("align_corners", False))
    return f"F.interpolate({x}, size=({oh}, {ow}), mode='bilinear', align_corners={corners})"


def _const(a, s):
    value = a["value"]
    if value.ndim == 0:
        return repr(float(value)) if a["dtype"] in ("f32", "f16", "bf16") else repr(int(value))
    raise ValueError("array constants are folded by the driver")


def _update_slice(a, s, x, update):
    index = ", ".join(
        f"{s.dim(lo)}:{s.dim(Poly.lift(lo) + n)}" for lo, n in zip(a["starts"], a["sizes"])
    )
    if a.get("inplace", False):
        return Lines([f"{x}[{index}].copy_({update})"], x)
    return Lines([f"_w = {x}.clone()", f"_w[{index}].copy_({update})"], "_w")


def _update_rows(a, s, x, update, positions):
    axis = a["axis"]
    index = ", ".join(
        ":" if i == axis else f"{s.dim(lo)}:{s.dim(Poly.lift(lo) + n)}"
        for i, (lo, n) in enumerate(zip(a["starts"], a["sizes"]))
    )
    if "row_axis" in a:  # positions [R, S]: row r's tokens go to its own positions
        rows = f"{axis}, {a['row_axis']}, {positions}, {update}"
        if a.get("inplace", False):
            return Lines([f"write_rows({x}[{index}], {rows})"], x)
        return Lines([f"_w = {x}.clone()", f"write_rows(_w[{index}], {rows})"], "_w")
    write = f"index_copy_({axis}, {positions}, {update})"
    if a.get("inplace", False):
        return Lines([f"{x}[{index}].{write}"], x)
    return Lines([f"_w = {x}.clone()", f"_w[{index}].{write}"], "_w")


def _guard(a, s):
    message = f"{a.get('where', '')}: {a['message']}".lstrip(": ")
    lhs, rhs = s.dim(a["lhs"]), s.dim(a["rhs"])
    texts = f"{str(a['lhs'])!r}, {str(a['rhs'])!r}"
    return Lines([f"_guard({lhs}, {rhs}, {message!r}, {texts})"], None)


def _rope(a, s, x, at=None):
    table = s.rope_table(a, a["head_dim"])
    fn = "rope_fast" if s.numerics == "fast" else "rope_ref"
    offset = at if at is not None else s.dim(a["offset"])  # a positions tensor, or an int
    return f"{fn}({x}, {table}_cos, {table}_sin, {offset})"


def _attention(a, s, q, k, v, *extra):
    fn = "attention_fast" if s.numerics == "fast" else "attention_ref"
    mask, sinks, q_positions = attention_operands(a, extra)
    offset = q_positions if q_positions is not None else s.dim(a["q_offset"])
    args = [q, k, v, str(a["causal"]), offset, s.dim(a["window"] or 0), repr(a["scale"])]
    args += [mask] if mask is not None else []
    args += [f"sinks={sinks}"] if sinks is not None else []
    return f"{fn}({', '.join(args)})"


def _softmax(a, s, x):
    if s.numerics == "fast":  # one fused kernel (f32 inside, as the reference), not five ops
        return f"torch.softmax({x}, {a['axis']}, dtype=torch.float32).to({x}.dtype)"
    return f"softmax_ref({x}, {a['axis']})"


def _moe(a, s, *xs):
    fn = "moe_fast" if s.numerics == "fast" else "moe_ref"
    return f"{fn}({', '.join(xs)}, {a['top_k']}, {a['alpha']!r}, {a['limit']!r})"


def _norm(kind):
    def emit(a, s, *xs):
        fn = f"{kind}_{'fast' if s.numerics == 'fast' else 'ref'}"
        return f"{fn}({', '.join(xs)}, {a['eps']!r})"

    return emit


def _gelu(a, s, x):
    if s.numerics == "fast":
        return f"F.gelu({x}, approximate={(a['approx'] or 'none')!r})"
    return f"gelu_ref({x}, {(a['approx'] or 'none')!r})"


def _linear(a, s, x, w, b=None):
    fn = "linear_fast" if s.numerics == "fast" else "F.linear"
    fn = "linear_lowp" if a.get("dtype") in ("bf16", "f16") else fn
    return f"{fn}({x}, {w}, {b})" if b is not None else f"{fn}({x}, {w})"


UNARY_TEXT = {
    "neg": "torch.neg",
    "exp": "torch.exp",
    "log": "torch.log",
    "sqrt": "torch.sqrt",
    "rsqrt": "torch.rsqrt",
    "tanh": "torch.tanh",
    "erf": "torch.erf",
    "sin": "torch.sin",
    "cos": "torch.cos",
    "sigmoid": "torch.sigmoid",
    "abs": "torch.abs",
}
BINARY_TEXT = {
    "add": "torch.add",
    "sub": "torch.sub",
    "mul": "torch.mul",
    "div": "torch.div",
    "pow": "torch.pow",
    "maximum": "torch.maximum",
    "minimum": "torch.minimum",
    "lt": "torch.lt",
    "le": "torch.le",
    "gt": "torch.gt",
    "ge": "torch.ge",
    "eq": "torch.eq",
    "ne": "torch.ne",
    "logical_and": "torch.logical_and",
    "logical_or": "torch.logical_or",
}
INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}

EMITTERS = {
    "const": _const,
    "iota": lambda a, s: (
        f"torch.arange({s.dim(a['start'])}, "
        f"{s.dim(Poly.lift(a['start']) + Poly.lift(a['length']))}, "
        f"dtype={s.dtype(a['dtype'])}, device=_dev)"
    ),
    "cast": lambda a, s, x: f"{x}.to({s.dtype(a['dtype'])})",
    "where": lambda a, s, c, x, y: f"torch.where({c}, {x}, {y})",
    "reduce_sum": lambda a, s, x: f"{x}.sum({a['axis']}, keepdim={a.get('keepdims', True)})",
    "reduce_max": lambda a, s, x: f"{x}.amax({a['axis']}, keepdim={a.get('keepdims', True)})",
    "reduce_mean": lambda a, s, x: f"{x}.mean({a['axis']}, keepdim={a.get('keepdims', True)})",
    "matmul": lambda a, s, x, y: f"torch.matmul({x}, {y})",
    "reshape": lambda a, s, x: f"{x}.reshape({s.dims(a['shape'])})",
    "transpose": lambda a, s, x: f"{x}.permute({', '.join(map(str, a['perm']))})",
    "slice": lambda a, s, x: f"{x}[{_slices(s, a['starts'], a['stops'], a.get('steps'))}]",
    "pad": _pad,
    "broadcast": lambda a, s, x: f"{x}.expand({s.dims(a['shape'])})",
    "concat": lambda a, s, *xs: f"torch.cat([{', '.join(xs)}], dim={a['axis']})",
    "take": lambda a, s, table, idx: f"{table}[{idx}]",
    "update_slice": _update_slice,
    "update_rows": _update_rows,
    "guard": _guard,
    # library ops (their decompositions are the reference; see torch_prelude)
    "linear": _linear,
    "rms_norm": _norm("rms_norm"),
    "layer_norm": _norm("layer_norm"),
    "softmax": _softmax,
    "silu": lambda a, s, x: f"F.silu({x})",
    "gelu": _gelu,
    "rope": _rope,
    "attention": _attention,
    "conv": _conv,
    "conv1d": lambda a, s, x, w, b=None: (
        f"F.conv1d({x}, {w}, {b}, {a.get('stride', 1)}, {a.get('padding', 0)})"
    ),
    "max_pool": lambda a, s, x: (
        f"F.max_pool2d({x}, {a['kernel']}, {a.get('stride', 1)}, {a.get('padding', 0)})"
    ),
    "batch_norm": _batch_norm,
    "group_norm": _group_norm,
    "upsample_nearest": _upsample_nearest,
    "conv_transpose": _conv_transpose,
    "resize_bilinear": _resize_bilinear,
    "moe": _moe,
    "timestep_embedding": lambda a, s, t: (
        f"timestep_embedding({t}, {a['dim']}, {a.get('flip', True)}, "
        f"{float(a.get('shift', 0.0))!r}, {float(a.get('max_period', 10000.0))!r})"
    ),
}
EMITTERS.update(elementwise_emitters(UNARY_TEXT, INFIX, BINARY_TEXT))
# torch.maximum and torch.minimum take no Python number: a scalar side becomes a 0-d tensor
# (which adopts the other side's dtype and device)
for _name in ("maximum", "minimum"):
    EMITTERS[_name] = lambda a, s, x, y, _f=BINARY_TEXT[_name]: (
        f"{_f}(torch.as_tensor({x}), torch.as_tensor({y}))"
    )


# Tensor-parallel collectives (issue 19, docs/parallel.md): torch.distributed's default
# group, in place on the fresh partial sums the rewrite hands them.
EMITTERS["all_reduce"] = lambda a, s, x: Lines([f"torch.distributed.all_reduce({x})"], x)
EMITTERS["all_gather"] = lambda a, s, x: Lines(
    [
        f"_g = [torch.empty_like({x}) for _ in range({a['world']})]",
        f"torch.distributed.all_gather(_g, {x}.contiguous())",
    ],
    f"torch.cat(_g, dim={a['axis']})",
)
# Device moves of a layer split or host offload (issue 19, linnet/shard/place.py).
EMITTERS["to_device"] = lambda a, s, x: (
    f"{'prefetch_to' if a.get('prefetch') else 'move_to'}({x}, {a['device']!r})"
)
EMITTERS["await_copy"] = lambda a, s, x: f"await_copy({x})"


def emit(node, spell: Spell, inputs: list[str]):
    """The text of one node: an expression, or Lines."""
    return emit_node(EMITTERS, node, spell, inputs)
