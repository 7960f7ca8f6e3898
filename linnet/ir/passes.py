"""Passes over Core-IR graphs. Each returns a new graph; `verify` checks one."""

from __future__ import annotations

from linnet.ir.graph import Graph, GraphBuilder, Node
from linnet.ir.library import DECOMPOSITIONS
from linnet.ir.ops import OPS


def copy_frame(graph: Graph) -> tuple[Graph, dict]:
    """A new graph with the same inputs, params and states; and the value map (old value
    -> new). A rewrite copies the frame, adds its nodes, then calls `finish`."""
    out = Graph(graph.name, dim_inputs=dict(graph.dim_inputs))
    out._next_id = graph._next_id
    mapping = {}
    for v in graph.inputs:
        mapping[v] = out.input(v.name, v.type)
    for name, v in graph.params.items():
        mapping[v] = out.param(name, v.type)
    for name, v in graph.states.items():
        mapping[v] = out.state(name, v.type)
    return out, mapping


def finish(graph: Graph, out: Graph, mapping: dict) -> Graph:
    """`out` with the outputs and state outputs of `graph`, mapped."""
    out.outputs = [mapping[v] for v in graph.outputs]
    out.state_outputs = {k: mapping[v] for k, v in graph.state_outputs.items()}
    return out


def decompose(graph: Graph, keep=frozenset()) -> Graph:
    """Replace every library op by its reference decomposition (numerics=equivalent),
    but those in `keep` (a backend's native emitters)."""
    out, mapping = copy_frame(graph)
    b = GraphBuilder(out)
    for node in graph.nodes:
        ins = [mapping[v] for v in node.inputs]
        if OPS[node.op].kind == "library" and node.op not in keep:
            result = DECOMPOSITIONS[node.op](b, *ins, **node.attrs)
            if result.type != node.output.type:
                raise AssertionError(
                    f"decomposition of {node.op} changed the type: "
                    f"{node.output.type} -> {result.type}"
                )
        else:
            result = b.add(node.op, ins, where=node.where, **node.attrs)
        if node.output is not None:
            mapping[node.output] = result
    return finish(graph, out, mapping)


def dedupe_guards(graph: Graph) -> Graph:
    """Keep the first of identical runtime guards (rope checks its table at each call)."""
    seen = set()
    nodes = []
    for node in graph.nodes:
        if node.op == "guard":
            key = (node.attrs["lhs"], node.attrs["rhs"], node.attrs["message"])
            if key in seen:
                continue
            seen.add(key)
        nodes.append(node)
    out = Graph(
        graph.name,
        graph.inputs,
        graph.dim_inputs,
        graph.params,
        graph.states,
        nodes,
        graph.outputs,
        graph.state_outputs,
        graph._next_id,
    )
    return out


VIEW_OPS = ("slice", "reshape", "transpose")
WRITE_OPS = ("update_slice", "update_rows")  # state writes: x with some rows replaced


def inplace_updates(graph: Graph) -> set[int]:
    """Indices of the state writes (`WRITE_OPS`) that may write into their input's storage.

    The IR is functional: a value read from state before a write keeps the old
    data. Writing in place is only safe when nothing that shares the old
    storage (the input, or a view of it made earlier) is used after the write.
    """
    root: dict = {}  # value -> the value whose storage it may share
    born: dict = {v: -1 for v in graph.inputs + list(graph.states.values())}
    last_use: dict = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last_use[v] = i
        if node.output is not None:
            born[node.output] = i
    end = len(graph.nodes)
    for v in graph.outputs + list(graph.state_outputs.values()):
        last_use[v] = end
    safe: set[int] = set()
    for i, node in enumerate(graph.nodes):
        if node.op in VIEW_OPS or node.op in WRITE_OPS:
            x = node.inputs[0]
            base = root.get(x, x)
        if node.op in VIEW_OPS:
            root[node.output] = base
        if node.op not in WRITE_OPS:
            continue
        stale = [v for v, r in root.items() if r is base and born[v] < i] + [base]
        if all(last_use.get(v, -1) <= i for v in stale if v is not node.output):
            safe.add(i)
            root[node.output] = base
    return safe


def dying_values(graph: Graph) -> dict[int, list]:
    """node index -> the values computed in the graph that are dead after that node.

    Straight-line code that keeps every temporary until it returns holds a whole
    forward's activations at once (SmolLM2 at S=128: ~150 MB), and the allocator then
    hands back fresh, page-faulting memory on every call; freeing temporaries after
    their last use keeps the working set at a layer's worth. A value and the views made
    of it (`VIEW_OPS`) share storage, so they are listed together, where the last of
    them dies: that is when the memory can go. Inputs, params, states, the graph's
    outputs and any view of them are never listed."""
    keep = set(graph.outputs) | set(graph.state_outputs.values())
    root: dict = {}  # value -> the value whose storage it may share
    last: dict = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[root.get(v, v)] = i
        out = node.output
        if out is not None:
            base = node.inputs[0] if node.op in VIEW_OPS else out
            root[out] = root.get(base, base)
            last.setdefault(root[out], i)  # never read: dies where it is made
    groups: dict = {}
    for v, r in root.items():
        groups.setdefault(r, []).append(v)
    dying: dict[int, list] = {}
    for r, members in groups.items():
        if r in root and not keep.intersection(members):  # made here, and nothing kept
            dying.setdefault(last[r], []).extend(members)
    return dying


class VerifyError(AssertionError):
    pass


def verify(graph: Graph) -> None:
    """Every value defined before use, every op known, every type what its rule says."""
    defined = set(graph.inputs) | set(graph.params.values()) | set(graph.states.values())
    for i, node in enumerate(graph.nodes):
        if node.op not in OPS:
            raise VerifyError(f"node {i}: unknown op {node.op}")
        for v in node.inputs:
            if v not in defined:
                raise VerifyError(f"node {i} ({node.op}): input {v} used before definition")
        expected = OPS[node.op].infer([v.type for v in node.inputs], node.attrs)
        got = None if node.output is None else node.output.type
        if expected != got:
            raise VerifyError(f"node {i} ({node.op}): type {got}, rule says {expected}")
        if node.output is not None:
            if node.output in defined:
                raise VerifyError(f"node {i} ({node.op}): {node.output} defined twice")
            defined.add(node.output)
    for v in list(graph.outputs) + list(graph.state_outputs.values()):
        if v not in defined:
            raise VerifyError(f"output {v} is never defined")


def _node_line(node: Node) -> str:
    attrs = ", ".join(f"{k}={_attr(v)}" for k, v in node.attrs.items())
    args = ", ".join(repr(v) for v in node.inputs)
    lhs = f"{node.output!r}: {node.output.type} = " if node.output is not None else ""
    return f"  {lhs}{node.op}({args}{', ' if args and attrs else ''}{attrs})"


def _attr(v) -> str:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"<{v.dtype}{list(v.shape)}>" if v.size > 4 else repr(v.tolist())
    if isinstance(v, tuple):
        return "(" + ", ".join(str(x) for x in v) + ")"
    return str(v)


def print_graph(graph: Graph) -> str:
    """Readable text form, one node a line; stable, so it can be snapshot-tested."""
    lines = [f"graph {graph.name}("]
    lines += [f"  {v!r} {v.name}: {v.type}" for v in graph.inputs]
    lines += [f"  {name}: dim {atom}" for name, atom in graph.dim_inputs.items()]
    lines += [f"  {v!r} param {name}: {v.type}" for name, v in graph.params.items()]
    lines += [f"  {v!r} state {name}: {v.type}" for name, v in graph.states.items()]
    lines.append(")")
    lines += [_node_line(n) for n in graph.nodes]
    outs = ", ".join(repr(v) for v in graph.outputs)
    states = ", ".join(f"{k}={v!r}" for k, v in graph.state_outputs.items())
    lines.append(f"  return {outs}" + (f"; updates {states}" if states else ""))
    return "\n".join(lines)
