"""A decode layer's attention as one call in the generated runner (numerics="fast").

Between a layer's fused qkv linear and its output projection, the lowered graph is ~20
PyTorch calls at batch 1: the q, k and v slices, their heads split, two ropes, two cache
writes, two cache reads, the attention and its heads merged. On SmolLM2's f32 decode step
they cost ~2 ms of 40 (docs/torch.md, "Session 21"). `attention_groups` finds each such
run of nodes and `emit_fused` writes the entry with the group as one call,

    t364 = _attend_cached(t342, (0, 64, 80), 8, self.rope0_cos, self.rope0_sin, P, ...)
    if t364 is None:  # a prompt, per-row positions, another dtype: the source's ops
        t343 = t342[:B, :S, :64]
        ...

(`step_kernels.attend_cached`: decode_ops.cpp's `attend_cached`, the same arithmetic as the
separate ops, so the same bits). The source's ops stay the reference and run wherever the
op does not apply; guards inside the run are written before the call.

A group is matched strictly, or the nodes are written as before: the attention causal,
unmasked, at the step's position `at` (an int dim, not per-row positions); its keys and
values the caches' rows 0..at+S after in-place writes at `at` of the rotated k and of v;
q and k both rotated at `at` by one table, or neither, and before that both normalised
by a per-head RMSNorm of one eps (Qwen3), or neither; q, k and v split into heads from
slices of one value along its last axis; the result's heads merged; nothing outside the
group reading a value inside it; and nothing but guards between its first and last node.
"""

from __future__ import annotations

from dataclasses import dataclass

from linnet.backends.emit import node_attrs
from linnet.backends.torch.codegen import (
    del_line,
    emit_node_lines,
    method_head,
    method_tail,
    shape_comment,
)
from linnet.core.dims import Poly
from linnet.ir.graph import Graph, Node
from linnet.ir.passes import dying_values, inplace_updates

SPLIT_PERM = (0, 2, 1, 3)  # (B, S, H, D) <-> (B, H, S, D)


@dataclass
class Group:
    """One layer's attention: its node indices, the value it yields and the call's
    operands."""

    indices: list[int]
    out: object  # the merged heads (B, S, H * D)
    y: object  # the fused qkv output the three slices read
    lo: tuple[int, int, int]  # q, k and v's first columns in y
    heads: int
    rope: dict | None  # the ropes' attrs (and head dim), or None: no rope
    norms: tuple | None  # q's and k's per-head RMSNorm weights and eps (Qwen3), or None
    at: Poly
    caches: tuple  # the k and v state values written in place
    attention: Node


class _Graph:
    """Producers and readers of each value, and the in-place writes."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.made = {n.output: i for i, n in enumerate(graph.nodes) if n.output is not None}
        self.readers: dict = {}
        for i, n in enumerate(graph.nodes):
            for v in n.inputs:
                self.readers.setdefault(v, []).append(i)
        self.inplace = inplace_updates(graph)
        self.states = set(graph.states.values())
        self.kept = set(graph.outputs) | set(graph.state_outputs.values())

    def node(self, value, op: str):
        """(index, node) making `value` with `op`, or None."""
        i = self.made.get(value)
        if i is None or self.graph.nodes[i].op != op:
            return None
        return i, self.graph.nodes[i]

    def only_reader(self, value, op: str):
        """(index, node) of the one node reading `value`, if it is an `op`; else None."""
        readers = self.readers.get(value, [])
        if len(readers) != 1 or value in self.kept:
            return None
        node = self.graph.nodes[readers[0]]
        return (readers[0], node) if node.op == op else None


def _split_heads(g: _Graph, x4, heads: int):
    """The slice, reshape and transpose making x4 (B, heads, S, D) from a (B, S, W) value:
    ([indices], the sliced value, its first column), or None."""
    tr = g.node(x4, "transpose")
    if tr is None or tuple(tr[1].attrs["perm"]) != SPLIT_PERM:
        return None
    rs = g.node(tr[1].inputs[0], "reshape")
    if rs is None or rs[1].inputs[0].type.rank != 3:
        return None
    sl = g.node(rs[1].inputs[0], "slice")
    if sl is None or sl[1].inputs[0].type.rank != 3 or sl[1].attrs.get("steps"):
        return None
    y, (starts, stops) = sl[1].inputs[0], (sl[1].attrs["starts"], sl[1].attrs["stops"])
    shape, width = y.type.shape, heads * x4.type.shape[3].value
    first = Poly.lift(starts[2])
    if not first.is_const or any(Poly.lift(s) != Poly.const(0) for s in starts[:2]):
        return None
    lo = first.value
    if tuple(Poly.lift(s) for s in stops) != (shape[0], shape[1], Poly.const(lo + width)):
        return None
    return [sl[0], rs[0], tr[0]], y, lo


def _cache_read(g: _Graph, read, at: Poly, steps):
    """The cache write and read behind `read` (the rows 0..at+S of a state written in place
    at `at`): ([indices], the state, the written value), or None."""
    rd = g.node(read, "slice")
    if rd is None:
        return None
    wr = g.node(rd[1].inputs[0], "update_slice")
    if wr is None or wr[0] not in g.inplace or wr[1].inputs[0] not in g.states:
        return None
    whole = wr[1].inputs[0].type.shape
    zero = Poly.const(0)
    if tuple(Poly.lift(s) for s in wr[1].attrs["starts"]) != (zero, zero, Poly.lift(at), zero):
        return None
    want = (whole[0], whole[1], Poly.lift(at) + steps, whole[3])
    if tuple(Poly.lift(s) for s in rd[1].attrs["stops"]) != want:
        return None
    if any(Poly.lift(s) != zero for s in rd[1].attrs["starts"]):
        return None
    return [wr[0], rd[0]], wr[1].inputs[0], wr[1].inputs[1]


def _rope(g: _Graph, x, at: Poly):
    """(index, attrs with head dim, its input) of a rope at `at` making x; None."""
    found = g.node(x, "rope")
    if found is None or len(found[1].inputs) != 1:
        return None
    if Poly.lift(found[1].attrs["offset"]) != Poly.lift(at):
        return None
    return found[0], node_attrs(found[1]), found[1].inputs[0]


def _head_norm(g: _Graph, x):
    """(index, weight, eps, input) of the RMSNorm making x over its head dim; None."""
    found = g.node(x, "rms_norm")
    if found is None:
        return None
    return found[0], found[1].inputs[1], node_attrs(found[1])["eps"], found[1].inputs[0]


def _match(g: _Graph, index: int) -> Group | None:
    node = g.graph.nodes[index]
    a = node.attrs
    if not a.get("causal") or a.get("masked") or len(node.inputs) != 3 + bool(a.get("sinks")):
        return None
    q, keys, values = node.inputs[:3]
    if q.type.dtype not in ("f32", "bf16") or q.type.rank != 4:
        return None
    at, steps = Poly.lift(a["q_offset"]), q.type.shape[2]
    k_side, v_side = _cache_read(g, keys, at, steps), _cache_read(g, values, at, steps)
    merge = g.only_reader(node.output, "transpose")
    if None in (k_side, v_side, merge) or tuple(merge[1].attrs["perm"]) != SPLIT_PERM:
        return None
    out = g.only_reader(merge[1].output, "reshape")
    if out is None:
        return None
    q_rope, k_rope = _rope(g, q, at), _rope(g, k_side[2], at)
    if (q_rope is None) != (k_rope is None) or (q_rope and q_rope[1] != k_rope[1]):
        return None
    q4, k4 = (q_rope[2], k_rope[2]) if q_rope else (q, k_side[2])
    q_norm, k_norm = _head_norm(g, q4), _head_norm(g, k4)
    if (q_norm is None) != (k_norm is None) or (q_norm and q_norm[2] != k_norm[2]):
        return None
    if q_norm:
        q4, k4 = q_norm[3], k_norm[3]
    if not (q4.type.shape[1].is_const and k4.type.shape[1].is_const):
        return None
    heads, kv = q4.type.shape[1].value, k4.type.shape[1].value
    parts = [_split_heads(g, x, n) for x, n in ((q4, heads), (k4, kv), (v_side[2], kv))]
    if None in parts or len({id(p[1]) for p in parts}) != 1:
        return None
    indices = [i for p in parts for i in p[0]] + k_side[0] + v_side[0]
    indices += [q_rope[0], k_rope[0]] if q_rope else []
    indices += [q_norm[0], k_norm[0]] if q_norm else []
    indices = sorted(indices + [index, merge[0], out[0]])
    group = Group(
        indices, out[1].output, parts[0][1], tuple(p[2] for p in parts), heads,
        q_rope[1] if q_rope else None, (q_norm[1], k_norm[1], q_norm[2]) if q_norm else None,
        at, (k_side[1], v_side[1]), node,
    )  # fmt: skip
    return group if _closed(g, group) else None


def _closed(g: _Graph, group: Group) -> bool:
    """Nothing outside the group reads what it makes (but its result and the caches'
    new values, which are the states), and only guards sit between its nodes."""
    inside = set(group.indices)
    nodes = g.graph.nodes
    for i in group.indices:
        out = nodes[i].output
        if out is group.out or nodes[i].op == "update_slice":
            continue
        if out in g.kept or any(r not in inside for r in g.readers.get(out, [])):
            return False
    writes = [nodes[i].output for i in group.indices if nodes[i].op == "update_slice"]
    if any(r not in inside for w in writes for r in g.readers.get(w, [])):
        return False
    span = range(group.indices[0], group.indices[-1] + 1)
    return all(i in inside or nodes[i].op == "guard" for i in span)


def attention_groups(graph: Graph) -> list[Group]:
    """Every layer attention of `graph` that `emit_fused` can write as one call."""
    g = _Graph(graph)
    found = [_match(g, i) for i, n in enumerate(graph.nodes) if n.op == "attention"]
    return [group for group in found if group is not None]


def _call(group: Group, spell, names: dict) -> str:
    a = group.attention.attrs
    if group.rope is not None:
        table = spell.rope_table(group.rope, group.rope["head_dim"])
        tables = f"{table}_cos, {table}_sin"
    else:
        tables = "None, None"
    k_cache, v_cache = (names[v] for v in group.caches)
    args = [
        names[group.y], str(group.lo), str(group.heads), tables, spell.dim(group.at),
        k_cache, v_cache, spell.dim(a["window"] or 0), repr(a["scale"]),
    ]  # fmt: skip
    if a.get("sinks") or group.norms:
        args.append(names[group.attention.inputs[3]] if a.get("sinks") else "None")
    if group.norms:
        q_w, k_w, eps = group.norms
        args.append(f"({names[q_w]}, {names[k_w]}, {eps!r})")
    return f"_attend_cached({', '.join(args)})"


def emit_fused(graph: Graph, spell, name: str) -> list[str]:
    """An entry's method with each of `attention_groups` as one call (the source's ops
    under it for where the call answers None); other nodes as `emit_method` writes them."""
    lines, names, idents = method_head(graph, name)
    groups = {group.indices[0]: group for group in attention_groups(graph)}
    covered = {
        i: group
        for group in groups.values()
        for i in range(group.indices[0], group.indices[-1] + 1)
    }
    internal = {
        graph.nodes[i].output
        for group in groups.values()
        for i in group.indices
        if graph.nodes[i].output is not group.out
    }
    dying, inplace = dying_values(graph), inplace_updates(graph)
    temps: set = set()
    for index, node in enumerate(graph.nodes):
        group = covered.get(index)
        if group is None:
            lines += emit_node_lines(node, spell, names, idents, temps, index in inplace)
            lines += del_line([v for v in dying.get(index, []) if v not in internal], names, temps)
        elif index == group.indices[0]:
            lines += _emit_group(
                graph, group, spell, (names, idents, temps), dying, internal, inplace
            )
    return lines + method_tail(graph, names)


def _emit_group(graph, group, spell, scope, dying, internal, inplace) -> list[str]:
    """The guards of the group's span, the call, then the source's ops under `if None`
    (`scope`: the method's names, state idents and temporaries, filled as it goes)."""
    names, idents, temps = scope
    span = range(group.indices[0], group.indices[-1] + 1)
    lines = []
    for i in span:
        if graph.nodes[i].op == "guard":
            lines += emit_node_lines(graph.nodes[i], spell, names, idents, temps, False)
    out = f"t{group.out.id}"
    lines.append(f"        {out} = {_call(group, spell, names)}{shape_comment(group.out)}")
    lines.append(f"        if {out} is None:  # not a step the op takes: the source's ops")
    made = []
    for i in group.indices:
        node_lines = emit_node_lines(graph.nodes[i], spell, names, idents, temps, i in inplace)
        lines += ["    " + line for line in node_lines]
        made.append(graph.nodes[i].output)
    gone = [v for v in made if v in internal]
    lines += ["    " + line for line in del_line(gone, names, temps)]
    outside = [v for i in span for v in dying.get(i, []) if v not in internal]
    return lines + del_line(outside, names, temps)
