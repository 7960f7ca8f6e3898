"""XLA needs static shapes: the start position becomes a runtime scalar, not a shape.

`runtime_position` rewrites an entry so one jit (or one StableHLO export)
serves every position, the idea `cudagraphs.device_positions` uses for CUDA
graphs, kept as a scalar so cache writes stay `lax.dynamic_update_slice`:

- reads of the cache up to `P + S` that only feed causal attention (through
  reshapes) read the whole cache instead; the causal mask hides every row past
  the query, so this is exact;
- runtime guards leave the graph and are checked on the host before a call
  (a traced or symbolic value cannot be compared in Python);
- everything else that mentions P (rope rows, learned-position rows, cache
  writes, the attention offset) takes it as a traced int32 scalar.

Afterwards no value's shape mentions P: that is checked, with the op named.
"""

from __future__ import annotations

from linnet.check.dims import Poly
from linnet.errors import LinnetError
from linnet.ir.graph import Graph, GraphBuilder, Node
from linnet.ir.passes import _copy_frame, _finish


def _mentions(value, atom: str) -> bool:
    if isinstance(value, Poly):
        return atom in value.atoms()
    if isinstance(value, (tuple, list)):
        return any(_mentions(v, atom) for v in value)
    return False


def runtime_position(graph: Graph, atom: str = "P") -> tuple[Graph, list[Node]]:
    """The graph with no shape depending on `atom`, and the guards to check on the host."""
    out, mapping = _copy_frame(graph)
    b = GraphBuilder(out)
    widen = _cache_reads_to_widen(graph, atom)
    widened: dict = {}  # value -> (old extent, new extent) along its widened axis
    guards: list[Node] = []
    for node in graph.nodes:
        ins = [mapping[v] for v in node.inputs]
        attrs = dict(node.attrs)
        if node.op == "guard":
            guards.append(node)
            continue
        if node in widen:
            axis = widen[node]
            stops = list(attrs["stops"])
            stops[axis] = node.inputs[0].type.shape[axis]
            attrs["stops"] = tuple(stops)
            widened[node.output] = (node.output.type.shape[axis], stops[axis])
        elif node.op == "reshape" and node.inputs[0] in widened:
            old, new = widened[node.inputs[0]]
            attrs["shape"] = tuple(new if d == old else d for d in attrs["shape"])
            widened[node.output] = (old, new)
        result = b.add(node.op, ins, where=node.where, **attrs)
        if result is not None and _mentions(result.type.shape, atom):
            raise LinnetError(
                f"{node.where}: the shape of `{node.op}` ({result.type}) depends on the "
                f"position {atom}; XLA compiles static shapes (read the whole cache and mask it)"
            )
        if node.output is not None:
            mapping[node.output] = result
    return _finish(graph, out, mapping), guards


def _cache_reads_to_widen(graph: Graph, atom: str) -> dict:
    """Slices whose extent along one axis mentions `atom` and that only feed causal
    attention as keys or values (via reshapes): node -> that axis."""
    users: dict = {}
    for node in graph.nodes:
        for v in node.inputs:
            users.setdefault(v, []).append(node)
    widen = {}
    for node in graph.nodes:
        if node.op != "slice" or not _mentions(node.attrs["stops"], atom):
            continue
        axes = [i for i, s in enumerate(node.attrs["stops"]) if _mentions(s, atom)]
        if len(axes) == 1 and _feeds_only_causal_attention(node.output, users):
            widen[node] = axes[0]
    return widen


def _feeds_only_causal_attention(value, users) -> bool:
    for user in users.get(value, []):
        if user.op == "reshape":
            if not _feeds_only_causal_attention(user.output, users):
                return False
        elif not (user.op == "attention" and user.attrs["causal"] and user.inputs[0] is not value):
            return False
    return bool(users.get(value))
