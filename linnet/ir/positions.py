"""Helpers for passes that take the decode position out of shapes (CUDA graphs, XLA).

Decode reads its cache up to `P + S`, a shape that changes at every step. When
that read only feeds causal attention, it may read the whole cache instead:
the mask already hides every row past the query. `widen` rewrites such a read
and the reshapes after it, so one compiled graph serves every position.
"""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.ir.graph import Graph


def mentions(value, atom: str) -> bool:
    """Whether an attr (a Poly, or tuples of them) depends on `atom`."""
    if isinstance(value, Poly):
        return atom in value.atoms()
    if isinstance(value, (tuple, list)):
        return any(mentions(v, atom) for v in value)
    return False


def cache_reads_to_widen(graph: Graph, atom: str) -> dict:
    """Slices whose extent along one axis mentions `atom` and that only feed causal
    attention as keys or values (via reshapes): node -> that axis."""
    users: dict = {}
    for node in graph.nodes:
        for v in node.inputs:
            users.setdefault(v, []).append(node)
    widen = {}
    for node in graph.nodes:
        if node.op != "slice" or not mentions(node.attrs["stops"], atom):
            continue
        axes = [i for i, s in enumerate(node.attrs["stops"]) if mentions(s, atom)]
        if len(axes) == 1 and feeds_only_causal_attention(node.output, users):
            widen[node] = axes[0]
    return widen


def feeds_only_causal_attention(value, users) -> bool:
    for user in users.get(value, []):
        if user.op == "reshape":
            if not feeds_only_causal_attention(user.output, users):
                return False
        elif not (user.op == "attention" and user.attrs["causal"] and user.inputs[0] is not value):
            return False
    return bool(users.get(value))


def widen(node, attrs: dict, reads: dict, widened: dict) -> bool:
    """Rewrite `attrs` in place when `node` is a cache read to widen or a reshape after
    one; record the new extent in `widened`. True when the node was rewritten."""
    if node in reads:
        axis = reads[node]
        stops = list(attrs["stops"])
        stops[axis] = node.inputs[0].type.shape[axis]
        attrs["stops"] = tuple(stops)
        widened[node.output] = (node.output.type.shape[axis], stops[axis])
        return True
    if node.op == "reshape" and node.inputs[0] in widened:
        old, new = widened[node.inputs[0]]
        attrs["shape"] = tuple(new if d == old else d for d in attrs["shape"])
        widened[node.output] = (old, new)
        return True
    return False
