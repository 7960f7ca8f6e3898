"""CUDA graphs: the decode position as a device tensor, so one capture replays at every step.

    static = device_positions(decode_graph)   # input `positions` (i64[S]); no attr mentions P

A capture must not bake host values in: cache writes become `update_rows` at the
positions; reads of the cache up to `P + S` that only feed causal attention read the
whole cache (the causal mask hides rows past the query, so this is exact); rope and
attention take the positions as an operand; learned-position rows are gathered;
guards on the position leave the graph (the runner checks them on the host).
`runtime_position` is the same idea for XLA, with the position kept a scalar.
"""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.errors import LinnetError
from linnet.ir.graph import Graph, GraphBuilder
from linnet.ir.passes import copy_frame, finish
from linnet.ir.positions import cache_reads_to_widen, mentions, widen
from linnet.ir.types import TensorType


def device_positions(graph: Graph, atom: str = "P") -> Graph:
    """The decode graph with the position as a device tensor; no attr mentions `atom`."""
    out, mapping = copy_frame(graph)
    seq = graph.inputs[0].type.shape[1]
    positions = out.input("positions", TensorType("i64", (seq,)))
    out.dim_inputs = {k: v for k, v in graph.dim_inputs.items() if v != atom}
    b = GraphBuilder(out)
    full_reads = cache_reads_to_widen(graph, atom)
    widened: dict = {}  # value -> (old extent, new extent) along its widened axis
    for node in graph.nodes:
        ins = [mapping[v] for v in node.inputs]
        attrs = dict(node.attrs)
        if node.op == "guard" and mentions((attrs["lhs"], attrs["rhs"]), atom):
            continue  # the runner checks the position on the host before replay
        if node.op == "update_slice" and mentions(attrs["starts"], atom):
            axis = [i for i, s in enumerate(attrs["starts"]) if mentions(s, atom)][0]
            starts = tuple(Poly.const(0) if i == axis else s for i, s in enumerate(attrs["starts"]))
            result = b.add(
                "update_rows",
                [ins[0], ins[1], positions],
                axis=axis,
                starts=starts,
                where=node.where,
            )
        elif widen(node, attrs, full_reads, widened):
            result = b.add(node.op, ins, where=node.where, **attrs)
        elif node.op == "slice" and _rows_at_positions(node, atom, seq):
            result = b.add("take", [ins[0], positions])  # e.g. learned positions wpe[P : P + S]
        elif node.op == "rope" and mentions(attrs["offset"], atom):
            result = b.add("rope", ins + [positions], **dict(attrs, offset=Poly.const(0)))
        elif node.op == "attention" and mentions(attrs["q_offset"], atom):
            result = b.add("attention", ins + [positions], **dict(attrs, q_offset=Poly.const(0)))
        else:
            if any(mentions(v, atom) for v in attrs.values()):
                raise LinnetError(
                    f"{node.where}: `{node.op}` uses the host position {atom}; "
                    "it cannot be captured in a CUDA graph"
                )
            result = b.add(node.op, ins, where=node.where, **attrs)
        if node.output is not None:
            mapping[node.output] = result
    static = finish(graph, out, mapping)
    leaks = [n for n in static.nodes if any(mentions(v, atom) for v in n.attrs.values())]
    if leaks or atom in static.dim_inputs.values():
        raise LinnetError(f"the capture plan still holds the host position {atom}: {leaks}")
    return static


def _rows_at_positions(node, atom: str, seq: Poly) -> bool:
    """A slice `x[P : P + S, :, ...]` (rows at the current positions, full elsewhere)."""
    starts, stops, shape = node.attrs["starts"], node.attrs["stops"], node.inputs[0].type.shape
    if not mentions(starts[0], atom) or Poly.lift(stops[0]) - Poly.lift(starts[0]) != seq:
        return False
    return all(
        Poly.lift(lo) == Poly.const(0) and Poly.lift(hi) == d
        for lo, hi, d in zip(starts[1:], stops[1:], shape[1:])
    )
