"""One rank's program: params and states at their local shapes, collectives inserted.

    program = local_program(plan, rank)      # plan = derive_plan(program, world)

Each entry is copied node by node (`passes.copy_frame` and `finish`): a split param or
state gets its block's shape, a reshape or slice over a split axis its block's size, and a
row-parallel linear becomes `linear(x, w)` -> `all_reduce` -> `+ b` (the bias once, after
the sum). Every node's type is inferred again by the op table, and the result verified, so
a plan that does not fit the graph fails here, not at run time.
"""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.ir.graph import Graph, GraphBuilder
from linnet.ir.passes import finish, verify
from linnet.ir.program import Program
from linnet.ir.types import TensorType
from linnet.shard.analysis import ShardPlan
from linnet.shard.layout import ShardingError, Split


def local_type(t: TensorType, lay: Split | None, what: str) -> TensorType:
    """`t` as one rank holds it."""
    if lay is None:
        return t
    shape = list(t.shape)
    size = shape[lay.axis]
    if not size.is_const or size.value % lay.parts:
        raise ShardingError(f"{what}: axis {lay.axis} of {t} does not split in {lay.parts}")
    shape[lay.axis] = Poly.const(size.value // lay.parts)
    return t.with_shape(shape)


def local_program(plan: ShardPlan, rank: int) -> Program:
    """Rank `rank`'s program: the one `plan` was derived from, at local shapes."""
    program = plan.program
    if not 0 <= rank < plan.world:
        raise ShardingError(f"rank {rank} outside a world of {plan.world}")
    graphs = {entry: _local_graph(g, plan, entry) for entry, g in program.graphs.items()}
    params = {n: local_type(t, plan.params.get(n), n) for n, t in program.params.items()}
    return Program(program.name, program.config, graphs, params, dict(program.tied))


def _frame(graph: Graph, plan: ShardPlan) -> tuple[Graph, dict]:
    out = Graph(graph.name, dim_inputs=dict(graph.dim_inputs))
    out._next_id = graph._next_id
    mapping = {v: out.input(v.name, v.type) for v in graph.inputs}
    for name, v in graph.params.items():
        mapping[v] = out.param(name, local_type(v.type, plan.params.get(name), name))
    for name, v in graph.states.items():
        mapping[v] = out.state(name, local_type(v.type, plan.states.get(name), name))
    return out, mapping


def _local_attrs(node, lay: dict) -> dict:
    """Attrs that spell a split axis's size, at the block's size."""
    attrs = dict(node.attrs)
    if node.op == "reshape" and lay.get(node.output) is not None:
        split = lay[node.output]
        shape = list(attrs["shape"])
        shape[split.axis] = Poly.const(Poly.lift(shape[split.axis]).value // split.parts)
        attrs["shape"] = tuple(shape)
    elif node.op == "slice" and lay.get(node.inputs[0]) is not None:
        split = lay[node.inputs[0]]
        stops = list(attrs["stops"])
        stops[split.axis] = Poly.const(Poly.lift(stops[split.axis]).value // split.parts)
        attrs["stops"] = tuple(stops)
    return attrs


def _local_graph(graph: Graph, plan: ShardPlan, entry: str) -> Graph:
    out, mapping = _frame(graph, plan)
    lay = plan.layouts[entry]
    row_parallel = plan.row_parallel[entry]
    b = GraphBuilder(out)
    for node in graph.nodes:
        ins = [mapping[v] for v in node.inputs]
        if id(node) in row_parallel:
            y = b.add("linear", ins[:2], where=node.where, **node.attrs)
            y = b.add("all_reduce", [y], where=node.where)
            result = b.add("add", [y, ins[2]], where=node.where) if len(ins) > 2 else y
        else:
            result = b.add(node.op, ins, where=node.where, **_local_attrs(node, lay))
        if node.output is not None:
            mapping[node.output] = result
    for v in graph.outputs:  # split to the end (the logits of a vocab-parallel lm_head)
        if lay.get(v) is not None:
            mapping[v] = b.add("all_gather", [mapping[v]], axis=lay[v].axis, world=plan.world)
    local = finish(graph, out, mapping)
    verify(local)
    return local
