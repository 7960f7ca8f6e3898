"""What every text emitter table shares: statements as `Lines`, and the per-node facts
an emitter needs beyond its attrs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Lines:
    """Statements to run, and the expression that holds the result afterwards."""

    lines: list[str]
    value: str | None


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
