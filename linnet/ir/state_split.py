"""Split a state along its leading constant axes: `kv[L, 2, B, H, N, D]` becomes
`kv.0.0 … kv.{L-1}.1`, each `[B, H, N, D]`.

Why: state writes are functional. A backend that cannot write in place (ONNX,
where a graph input is never aliased by an output) copies the whole state at
each `update_slice`; with one tensor for all layers that is L copies of the
whole cache per step. Split, each write copies one layer's keys or values.

A state splits on its first k axes when they are constant and every use reads
or writes a single index on each of them (`kv[i]`, `cache[0, :, …]`). Other
states pass through unchanged. Reshapes that the split makes redundant are
folded (`fold_reshapes`) and dead nodes dropped (`prune`).
"""

from __future__ import annotations

import itertools

from linnet.core.dims import Poly
from linnet.ir.graph import Graph, GraphBuilder
from linnet.ir.passes import WRITE_OPS, copy_frame, finish, verify

ONE = Poly.const(1)


def part_name(state: str, coord: tuple[int, ...]) -> str:
    return ".".join([state, *map(str, coord)])


def part_coord(state: str, part: str) -> tuple[int, ...]:
    """The index of a part in its state: `part_coord("kv", "kv.3.1")` is (3, 1)."""
    return tuple(int(i) for i in part[len(state) + 1 :].split("."))


def _versions(graph: Graph, state) -> list:
    """The state value and every value an `update_slice` chain derives from it."""
    versions, frontier = [state], {state}
    for node in graph.nodes:
        if node.op in WRITE_OPS and node.inputs[0] in frontier:
            versions.append(node.output)
            frontier.add(node.output)
    return versions


def _indexed_axes(node, version) -> int:
    """How many leading axes this use of a state version indexes with one constant."""
    shape = version.type.shape
    if node.op in WRITE_OPS and node.inputs[0] is version:
        starts, sizes = node.attrs["starts"], node.inputs[1].type.shape
    elif node.op == "slice":
        starts = node.attrs["starts"]
        sizes = [Poly.lift(e) - Poly.lift(s) for s, e in zip(starts, node.attrs["stops"])]
    else:
        return 0  # read whole (or as an update): the state cannot split
    k = 0
    while k < len(shape) and shape[k].is_const and Poly.lift(starts[k]).is_const:
        if Poly.lift(sizes[k]) != ONE:
            break
        k += 1
    return k


def split_axes(graph: Graph, name: str) -> int:
    """Leading axes on which state `name` splits (0: it does not)."""
    versions = set(_versions(graph, graph.states[name]))
    k = len(graph.states[name].type.shape) - 1  # keep at least one axis per part
    for node in graph.nodes:
        for v in node.inputs:
            if v in versions:
                k = min(k, _indexed_axes(node, v))
    for v in graph.outputs:
        if v in versions:
            k = 0
    return k


def split_states(graph: Graph) -> tuple[Graph, dict[str, list[str]]]:
    """The graph with states split, and state -> its parts' names (in index order)."""
    axes = {name: split_axes(graph, name) for name in graph.states}
    axes = {name: k for name, k in axes.items() if k > 0}
    if not axes:
        return graph, {}
    out, mapping = copy_frame(graph)
    out.states = {}
    b = GraphBuilder(out)
    parts_of: dict = {}  # a version of a split state -> {coord: value}
    names: dict[str, list[str]] = {}
    for name, v in graph.states.items():
        if name not in axes:
            out.states[name] = mapping[v]
            continue
        k, t = axes[name], v.type
        coords = list(itertools.product(*(range(d.value) for d in t.shape[:k])))
        names[name] = [part_name(name, c) for c in coords]
        part_type = t.with_shape(t.shape[k:])
        parts_of[v] = {c: out.state(part_name(name, c), part_type) for c in coords}
        del mapping[v]
    for node in graph.nodes:
        x = node.inputs[0] if node.inputs else None
        if x in parts_of and node.op in WRITE_OPS + ("slice",):
            _rewrite_use(b, node, parts_of, mapping)
            continue
        ins = [mapping[v] for v in node.inputs]
        result = b.add(node.op, ins, where=node.where, **node.attrs)
        if node.output is not None:
            mapping[node.output] = result
    graph_out = _finish_split(graph, out, mapping, parts_of, axes)
    return prune(fold_reshapes(graph_out)), names


def _rewrite_use(b: GraphBuilder, node, parts_of: dict, mapping: dict) -> None:
    x = node.inputs[0]
    parts = parts_of[x]
    k = len(next(iter(parts)))
    coord = tuple(Poly.lift(s).value for s in node.attrs["starts"][:k])
    starts = tuple(node.attrs["starts"][k:])
    if node.op in WRITE_OPS:
        update = mapping[node.inputs[1]]
        inner = b.type_of(update).shape[k:]
        update = b.add("reshape", [update], shape=inner)
        new = dict(parts)
        extra = [mapping[v] for v in node.inputs[2:]]  # update_rows: the positions
        attrs = {a: node.attrs[a] - k for a in ("axis", "row_axis") if a in node.attrs}
        new[coord] = b.add(node.op, [parts[coord], update, *extra], starts=starts, **attrs)
        parts_of[node.output] = new
    else:
        read = b.add("slice", [parts[coord]], starts=starts, stops=tuple(node.attrs["stops"][k:]))
        mapping[node.output] = b.add("reshape", [read], shape=node.output.type.shape)


def _finish_split(graph: Graph, out: Graph, mapping: dict, parts_of: dict, axes: dict) -> Graph:
    outputs = {k: v for k, v in graph.state_outputs.items() if k not in axes}
    result = finish(Graph(graph.name, outputs=graph.outputs, state_outputs=outputs), out, mapping)
    for name in axes:
        final = parts_of[graph.state_outputs.get(name, graph.states[name])]
        for coord, value in final.items():
            result.state_outputs[part_name(name, coord)] = value
    return result


def fold_reshapes(graph: Graph) -> Graph:
    """reshape(reshape(x)) -> reshape(x); a reshape to the same shape -> its input."""
    out, mapping = copy_frame(graph)
    b = GraphBuilder(out)
    origin: dict = {}  # a reshape's output -> the value it reshaped
    for node in graph.nodes:
        ins = [mapping[v] for v in node.inputs]
        if node.op == "reshape":
            src = origin.get(ins[0], ins[0])
            if b.type_of(src).shape == node.output.type.shape:
                mapping[node.output] = src
                continue
            result = b.add("reshape", [src], where=node.where, **node.attrs)
            origin[result] = src
        else:
            result = b.add(node.op, ins, where=node.where, **node.attrs)
        if node.output is not None:
            mapping[node.output] = result
    return finish(graph, out, mapping)


def prune(graph: Graph) -> Graph:
    """Drop nodes whose results nothing uses (guards stay: they have no result)."""
    live = set(graph.outputs) | set(graph.state_outputs.values())
    keep = []
    for node in reversed(graph.nodes):
        if node.output is None or node.output in live:
            keep.append(node)
            live.update(node.inputs)
    pruned = Graph(
        graph.name,
        graph.inputs,
        graph.dim_inputs,
        graph.params,
        graph.states,
        keep[::-1],
        graph.outputs,
        graph.state_outputs,
        graph._next_id,
    )
    return pruned


def split_entry_states(graphs: dict) -> tuple[dict, dict]:
    """Each entry with its states split; and whole state -> {part name: index tuple}. An
    entry that cannot split a state the others split keeps them all whole."""
    split = {e: split_states(g) for e, g in graphs.items()}
    parts: dict = {}
    for _, names in split.values():
        for whole, part_names in names.items():
            parts.setdefault(whole, {}).update({p: part_coord(whole, p) for p in part_names})
    whole_somewhere = {
        s for e, (_, names) in split.items() for s in graphs[e].states if s not in names
    }
    if whole_somewhere & parts.keys():
        return graphs, {}
    for graph, _ in split.values():
        verify(graph)
    return {e: g for e, (g, _) in split.items()}, parts
