"""The emitter base every text backend overrides: how a driver spells dims, dtypes and
rope tables (`Spell`), statements as `Lines`, and the elementwise ops from per-backend
tables of names.

    class JaxSpell(Spell):                 # a backend overrides what it writes differently
        dtype_names = JAX_DTYPE_NAMES
    EMITTERS.update(elementwise_emitters(UNARY_TEXT, INFIX, CALLS))
    text = emit_node(EMITTERS, node, spell, ["x", "w"])
"""

from __future__ import annotations

from dataclasses import dataclass

from linnet.core.dims import Poly
from linnet.ir.ops import BINARY, COMPARE, LOGICAL, UNARY

YARN_ATTRS = ("beta_fast", "beta_slow", "truncate", "attn_factor")  # a yarn rope's extra attrs


@dataclass
class Lines:
    """Statements to run, and the expression that holds the result afterwards."""

    lines: list[str]
    value: str | None


class Spell:
    """How a driver writes things: dims as names (generated source) or lookups, dtypes
    from the backend's `dtype_names`, rope tables by spec (`tables`: spec -> name)."""

    dtype_names: dict[str, str] = {}

    def __init__(
        self, dim_atom=lambda name: name, numerics: str = "equivalent", table_prefix: str = ""
    ) -> None:
        self.dim_atom = dim_atom
        self.numerics = numerics
        self.table_prefix = table_prefix  # where rope tables live ("self." in a module)
        self.tables: dict[tuple, str] = {}  # rope spec -> table name

    def dim(self, p) -> str:
        p = Poly.lift(p)
        if p.is_const:
            return str(p.value)
        parts = []
        for mono, coef in p.terms:
            factors = [self.dim_atom(a) for a in mono] or [str(abs(coef))]
            if mono and abs(coef) != 1:
                factors.insert(0, str(abs(coef)))
            parts.append(("-" if coef < 0 else "+") + " * ".join(factors))
        text = " ".join(f"{s[0]} {s[1:]}" for s in parts)
        return text[2:] if text.startswith("+ ") else "-" + text[2:]

    def dims(self, ps) -> str:
        return ", ".join(self.dim(p) for p in ps)

    def dtype(self, name: str) -> str:
        return self.dtype_names[name]

    def rope_table(self, attrs: dict, head_dim: int) -> str:
        spec = (
            head_dim,
            attrs["positions"],
            attrs["theta"],
            attrs["scaling"] or "default",
            attrs["factor"],
            attrs["low_freq"],
            attrs["high_freq"],
            attrs["original_max"],
        ) + tuple(attrs[k] for k in YARN_ATTRS if k in attrs)  # yarn only: older specs stay
        return self.table_prefix + self.tables.setdefault(spec, f"rope{len(self.tables)}")


def attention_operands(a, extra) -> tuple:
    """(key mask, sinks, query positions) from the operands after q, k, v (each may be
    None), in that order."""
    rest = list(extra)
    mask = rest.pop(0) if a.get("masked") else None
    sinks = rest.pop(0) if a.get("sinks") else None
    return mask, sinks, (rest[0] if rest else None)


def elementwise_emitters(unary: dict, infix: dict, calls: dict) -> dict:
    """Emitters for every unary, binary, compare and logical op: `unary[op](x)`, `x op y`
    for those in `infix`, else `calls[op](x, y)`."""
    table = {}
    for name in UNARY:
        table[name] = lambda a, s, x, _f=unary[name]: f"{_f}({x})"
    for name in BINARY + COMPARE + LOGICAL:
        if name in infix:
            table[name] = lambda a, s, x, y, _o=infix[name]: f"{x} {_o} {y}"
        else:
            table[name] = lambda a, s, x, y, _f=calls[name]: f"{_f}({x}, {y})"
    return table


def node_attrs(node) -> dict:
    """A node's attrs plus what emitters need to know beyond them: a guard's source
    position, the sizes of a state write, the head dim of a rope, a linear's dtype."""
    attrs = dict(node.attrs)
    if node.op == "guard":
        attrs["where"] = node.where
    elif node.op in ("update_slice", "update_rows"):
        attrs["sizes"] = node.inputs[1].type.shape
    elif node.op == "linear":
        attrs["dtype"] = node.inputs[0].type.dtype
    elif node.op == "rope":
        attrs["head_dim"] = node.inputs[0].type.shape[-1].value
    return attrs


def emit_node(table: dict, node, spell, inputs: list[str]):
    """The text of one node from an emitter table: an expression, or Lines."""
    return table[node.op](node_attrs(node), spell, *inputs)
