"""Fusing the linears that read one input: q, k, v (and gate, up) as one matmul.

    graph, fused = fuse_linears(graph)

Linears whose input is the same value and whose weights (and biases, all or none) are
params of one block become one `linear` over a param that stacks their rows, then a
`slice` per original output along the feature axis. `fused` names each new param and the
params it stacks, in order: `{"layers.0.wq_wk_wv": ("layers.0.wq", "layers.0.wk",
"layers.0.wv")}`. A backend builds those tensors once at load (torch: the originals become
views of the stacked rows, so memory does not double and exports still see the source's
params). Each output row is the same dot product as before; only the matmul is wider.
"""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.ir.graph import Graph, GraphBuilder, Node
from linnet.ir.passes import copy_frame, finish


def _groups(graph: Graph) -> list[list[Node]]:
    """Linears on one input, weights (and biases) params of one block, two or more."""
    names = {v: n for n, v in graph.params.items()}
    by_input: dict = {}
    for node in graph.nodes:
        if node.op != "linear" or not all(v in names for v in node.inputs[1:]):
            continue
        w = node.inputs[1]
        block = names[w].rpartition(".")[0]
        key = (node.inputs[0], len(node.inputs), block, w.type.dtype, w.type.shape[1])
        by_input.setdefault(key, []).append(node)
    return [nodes for nodes in by_input.values() if len(nodes) > 1]


def _stacked_name(names: list[str]) -> str:
    block = names[0].rpartition(".")[0]
    joined = "_".join(n.rpartition(".")[2] for n in names)
    return f"{block}.{joined}" if block else joined


def fuse_linears(graph: Graph) -> tuple[Graph, dict[str, tuple[str, ...]]]:
    """The graph with each group of linears on one input made one; the stacked params."""
    groups = _groups(graph)
    if not groups:
        return graph, {}
    names = {v: n for n, v in graph.params.items()}
    first = {id(nodes[0]): nodes for nodes in groups}
    merged = {id(n) for nodes in groups for n in nodes[1:]}
    out, mapping = copy_frame(graph)
    b = GraphBuilder(out)
    fused: dict[str, tuple[str, ...]] = {}
    for node in graph.nodes:
        if id(node) in merged:
            continue  # computed with the first of its group
        ins = [mapping[v] for v in node.inputs]
        if id(node) not in first:
            result = b.add(node.op, ins, where=node.where, **node.attrs)
            if node.output is not None:
                mapping[node.output] = result
            continue
        nodes = first[id(node)]
        stacked = []
        for k in range(1, len(node.inputs)):  # the weights, then the biases
            parts = [names[n.inputs[k]] for n in nodes]
            name = _stacked_name(parts)
            if name in out.params:
                raise AssertionError(f"fused param {name} collides with a source param")
            rows = sum(n.inputs[k].type.shape[0].value for n in nodes)
            t = node.inputs[k].type
            stacked.append(out.param(name, t.with_shape((rows,) + t.shape[1:])))
            fused[name] = tuple(parts)
        y = b.add("linear", [ins[0]] + stacked, where=node.where, **node.attrs)
        rank, lo = y.type.rank, 0
        for n in nodes:
            shape = n.output.type.shape
            width = shape[-1].value
            starts = (Poly.const(0),) * (rank - 1) + (Poly.const(lo),)
            stops = tuple(shape[:-1]) + (Poly.const(lo + width),)
            mapping[n.output] = b.add("slice", [y], starts=starts, stops=stops)
            lo += width
    return finish(graph, out, mapping), fused
