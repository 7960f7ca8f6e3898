"""XLA needs static shapes: the start position becomes a runtime scalar, not a shape.

`runtime_position` rewrites an entry so one jit (or one StableHLO export)
serves every position, the idea `device_positions` uses for CUDA
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

from linnet.errors import LinnetError
from linnet.ir.graph import Graph, GraphBuilder, Node
from linnet.ir.passes import copy_frame, finish
from linnet.ir.positions import cache_reads_to_widen, mentions
from linnet.ir.positions import widen as widen_read


def runtime_position(graph: Graph, atom: str = "P") -> tuple[Graph, list[Node]]:
    """The graph with no shape depending on `atom`, and the guards to check on the host."""
    out, mapping = copy_frame(graph)
    b = GraphBuilder(out)
    widen = cache_reads_to_widen(graph, atom)
    widened: dict = {}  # value -> (old extent, new extent) along its widened axis
    guards: list[Node] = []
    for node in graph.nodes:
        ins = [mapping[v] for v in node.inputs]
        attrs = dict(node.attrs)
        if node.op == "guard":
            guards.append(node)
            continue
        widen_read(node, attrs, widen, widened)
        result = b.add(node.op, ins, where=node.where, **attrs)
        if result is not None and mentions(result.type.shape, atom):
            raise LinnetError(
                f"{node.where}: the shape of `{node.op}` ({result.type}) depends on the "
                f"position {atom}; XLA compiles static shapes (read the whole cache and mask it)"
            )
        if node.output is not None:
            mapping[node.output] = result
    return finish(graph, out, mapping), guards
