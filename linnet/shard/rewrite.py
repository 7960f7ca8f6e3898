"""One rank's program: params and states at their local shapes, collectives inserted.

    program = local_program(plan, rank)      # plan = derive_plan(program, world)

Each entry is copied node by node (`passes.copy_frame` and `finish`): a split param or
state gets its block's shape, a reshape or slice over a split axis its block's size, and a
row-parallel linear becomes `linear(x, w)` -> `all_reduce` -> `+ b` (the bias once, after
the sum). Every node's type is inferred again by the op table, and the result verified, so
a plan that does not fit the graph fails here, not at run time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from linnet.core.dims import Poly
from linnet.ir.graph import Graph, GraphBuilder
from linnet.ir.passes import finish, verify
from linnet.ir.program import Program
from linnet.ir.types import TensorType
from linnet.shard.analysis import ShardPlan
from linnet.shard.layout import ShardingError, Split, is_uneven, local_range

Sizer = Callable[[object, Split, str], Poly]  # (an axis's size, its split, what) -> size


def local_size(size, lay: Split, rank: int, world: int, what: str) -> Poly:
    """How much of an axis of `size` rank `rank` holds (ranks differ in an uneven split)."""
    size = _blocks_of(size, lay, what)
    lo, hi = local_range(size.value, lay, rank, world)
    return Poly.const(hi - lo)


def padded_size(size, lay: Split, world: int, what: str) -> Poly:
    """An axis of `size` with an uneven split grown by zero blocks to a multiple of `world`
    blocks (3 KV groups over 2 devices: 4); other axes unchanged."""
    size = _blocks_of(size, lay, what)
    return Poly.const(size.value // lay.parts * padded_parts(lay, world))


def padded_parts(lay: Split, world: int) -> int:
    return -(-lay.parts // world) * world if is_uneven(lay, world) else lay.parts


def _blocks_of(size, lay: Split, what: str) -> Poly:
    size = Poly.lift(size)
    if not size.is_const or size.value % lay.parts:
        raise ShardingError(f"{what}: an axis of {size} does not split in {lay.parts}")
    return size


def _sized(t: TensorType, lay: Split | None, what: str, sizer: Sizer) -> TensorType:
    if lay is None:
        return t
    shape = list(t.shape)
    shape[lay.axis] = sizer(shape[lay.axis], lay, f"{what} ({t})")
    return t.with_shape(shape)


def local_type(t: TensorType, lay: Split | None, what: str, rank: int, world: int) -> TensorType:
    """`t` as rank `rank` of `world` holds it."""
    return _sized(t, lay, what, lambda n, s, w: local_size(n, s, rank, world, w))


def local_program(plan: ShardPlan, rank: int) -> Program:
    """Rank `rank`'s program: the one `plan` was derived from, at local shapes."""
    if not 0 <= rank < plan.world:
        raise ShardingError(f"rank {rank} outside a world of {plan.world}")
    return _rewritten(plan, lambda n, s, w: local_size(n, s, rank, plan.world, w), rank)


def padded_program(plan: ShardPlan) -> Program:
    """The whole program with each uneven split axis padded to a multiple of the world's
    blocks, no collectives: what a mesh runs when `NamedSharding` needs even blocks."""
    return _rewritten(plan, lambda n, s, w: padded_size(n, s, plan.world, w), None)


def _rewritten(plan: ShardPlan, sizer: Sizer, rank: int | None) -> Program:
    """Each entry at the sizes `sizer` gives; with a `rank`, that rank's collectives (None:
    the whole program, padded, for a mesh)."""
    program = plan.program
    graphs = {
        entry: _local_graph(g, plan, entry, sizer, rank) for entry, g in program.graphs.items()
    }
    params = {n: _sized(t, plan.params.get(n), n, sizer) for n, t in program.params.items()}
    return Program(program.name, program.config, graphs, params, dict(program.tied))


def _frame(graph: Graph, plan: ShardPlan, sizer: Sizer) -> tuple[Graph, dict]:
    out = Graph(graph.name, dim_inputs=dict(graph.dim_inputs))
    out._next_id = graph._next_id
    mapping = {v: out.input(v.name, v.type) for v in graph.inputs}
    for name, v in graph.params.items():
        mapping[v] = out.param(name, _sized(v.type, plan.params.get(name), name, sizer))
    for name, v in graph.states.items():
        mapping[v] = out.state(name, _sized(v.type, plan.states.get(name), name, sizer))
    return out, mapping


def _local_attrs(node, lay: dict, sizer: Sizer) -> dict:
    """Attrs that spell a split axis's size, at this rank's (or the padded) size."""
    attrs = dict(node.attrs)
    if node.op == "reshape" and lay.get(node.output) is not None:
        split = lay[node.output]
        shape = list(attrs["shape"])
        shape[split.axis] = sizer(shape[split.axis], split, "a reshape")
        attrs["shape"] = tuple(shape)
    elif node.op == "slice" and lay.get(node.inputs[0]) is not None:
        split = lay[node.inputs[0]]
        stops = list(attrs["stops"])
        stops[split.axis] = sizer(stops[split.axis], split, "a slice")
        attrs["stops"] = tuple(stops)
    return attrs


def _vocab_take(b: GraphBuilder, node, ins: list, rank: int, world: int):
    """A gather from this rank's rows [lo, hi) of a vocab-parallel table: the ids it holds
    shifted to its rows, the others read row 0 and are zeroed; the all_reduce then sums one
    nonzero row per token (exact)."""
    table, ids = ins
    lo, hi = local_range(node.inputs[0].type.shape[0].value, Split(0, world), rank, world)

    def k(v):
        return b.add("const", [], value=np.asarray(v), dtype=ids.type.dtype)

    mine = b.add("logical_and", [b.add("ge", [ids, k(lo)]), b.add("lt", [ids, k(hi)])])
    rows = b.add("take", [table, b.add("where", [mine, b.add("sub", [ids, k(lo)]), k(0)])])
    keep = b.add("cast", [mine], dtype=table.type.dtype)
    keep = b.add("reshape", [keep], shape=(*ids.type.shape, Poly.const(1)))
    return b.add("all_reduce", [b.add("mul", [rows, keep])], where=node.where)


def _local_graph(
    graph: Graph, plan: ShardPlan, entry: str, sizer: Sizer, rank: int | None
) -> Graph:
    out, mapping = _frame(graph, plan, sizer)
    lay = plan.layouts[entry]
    collectives = rank is not None
    row_parallel = plan.row_parallel[entry] if collectives else set()
    b = GraphBuilder(out)
    for node in graph.nodes:
        ins = [mapping[v] for v in node.inputs]
        if id(node) in row_parallel and node.op == "take":
            result = _vocab_take(b, node, ins, rank, plan.world)
        elif id(node) in row_parallel:
            y = b.add("linear", ins[:2], where=node.where, **node.attrs)
            y = b.add("all_reduce", [y], where=node.where)
            result = b.add("add", [y, ins[2]], where=node.where) if len(ins) > 2 else y
        else:
            result = b.add(node.op, ins, where=node.where, **_local_attrs(node, lay, sizer))
        if node.output is not None:
            mapping[node.output] = result
    for v in graph.outputs:  # split to the end (the logits of a vocab-parallel lm_head)
        if collectives and lay.get(v) is not None:
            mapping[v] = b.add("all_gather", [mapping[v]], axis=lay[v].axis, world=plan.world)
    local = finish(graph, out, mapping)
    verify(local)
    return local
