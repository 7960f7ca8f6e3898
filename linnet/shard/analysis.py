"""Deriving a tensor-parallel plan from a program's Core IR (issue 19).

    plan = derive_plan(program, world=2)
    plan.params["layers.0.wq"]   # Split(axis=0, parts=2): column-parallel
    plan.params["layers.0.wo"]   # Split(axis=1, parts=2): row-parallel
    plan.params["embed"]         # Split(axis=0, parts=2): vocab-parallel
    plan.params["final_norm"]    # None: whole on every rank

No name tables: every `linear` whose input is whole and whose weight is a param is tried
column-parallel (its output split on the feature axis), and the split is followed through
the graph op by op (`RULES`): reshapes into heads, transposes, rope, per-head norms,
attention, cache writes and reads, elementwise ops. A linear that contracts a split axis is
row-parallel: each rank multiplies its block and an `all_reduce` sums them. Where a split
cannot go (a graph output, a norm over the split axis, a gather from a split table, an op
with no rule), the linears it came from (`Split.seeds`) are made whole again and the walk starts
over, until nothing changes. Head counts are read where a reshape splits a feature axis
into heads: a KV head count that divides the world size gives blocks shared by
`world // n_kv` ranks; more KV heads than ranks that the world size does not divide split
unevenly, a KV group (its KV head and its query heads) a block, so each rank's attention is
exact (SmolLM2's 3 KV heads over 2 ranks: 2 groups and 1); anything else is an error.
The embedding (a param table gathered by the token ids) is split on its vocab rows where
the world divides them (`_vocab_parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from linnet.core.dims import Poly
from linnet.ir.graph import Graph, Node
from linnet.ir.ops import BINARY, COMPARE, LOGICAL, UNARY
from linnet.ir.program import Program
from linnet.shard.layout import ShardingError, Split, is_uneven, seeds_of, span

ELEMENTWISE = frozenset(UNARY + BINARY + COMPARE + LOGICAL + ("cast", "silu", "gelu", "where"))
_MISSING = object()


@dataclass
class ShardPlan:
    world: int
    params: dict[str, Split | None]  # every param of the program
    states: dict[str, Split | None]
    layouts: dict[str, dict]  # entry -> value -> layout
    # entry -> ids of the nodes followed by an all_reduce: row-parallel linears and
    # vocab-parallel embedding gathers
    row_parallel: dict[str, set]
    # an entry's outputs that are split (a vocab-parallel lm_head) end in an all_gather
    whole_linears: set[str] = field(default_factory=set)  # tried split, kept whole
    program: Program | None = None  # what it was derived from (layouts key its values)

    def describe(self) -> str:
        """One line per param that is split, and a count of the whole ones."""
        lines = [f"tensor parallel over {self.world} ranks"]
        tables = self.vocab_tables()
        for name, lay in self.params.items():
            if lay is not None:
                kind = "vocab" if name in tables else "column" if lay.axis == 0 else "row"
                lines.append(
                    f"  {name}: {kind}-parallel, axis {lay.axis} in {_blocks(lay, self.world)}"
                )
        for name, lay in self.states.items():
            if lay is not None:
                lines.append(f"  state {name}: axis {lay.axis} in {_blocks(lay, self.world)}")
        whole = sum(1 for lay in self.params.values() if lay is None)
        lines.append(f"  {whole} params whole on every rank")
        return "\n".join(lines)

    def vocab_tables(self) -> set[str]:
        """The params gathered vocab-parallel (the embedding, and a head tied to it)."""
        out = set()
        for entry, g in self.program.graphs.items() if self.program else ():
            names = {v: n for n, v in g.params.items()}
            ids = self.row_parallel.get(entry, ())
            out |= {names[n.inputs[0]] for n in g.nodes if n.op == "take" and id(n) in ids}
        return out


def _blocks(lay: Split, world: int) -> str:
    if lay.parts < world:
        return f"{lay.parts}, each block on {world // lay.parts} ranks"
    if is_uneven(lay, world):
        counts = [hi - lo for lo, hi in (span(lay.parts, r, world) for r in range(world))]
        return f"{lay.parts}, uneven: {'+'.join(map(str, counts))} blocks by rank"
    return str(lay.parts)


def derive_plan(program: Program, world: int, max_rounds: int = 256) -> ShardPlan:
    """The plan for `program` over `world` ranks; ShardingError when a head count cannot
    be split."""
    if world < 1:
        raise ShardingError(f"tensor_parallel must be 1 or more, got {world}")
    walker = _Walker(world)
    for _ in range(max_rounds):
        walker.changed = False
        walker.params = {}
        walker.row_parallel = {}
        layouts = {entry: walker.walk(entry, g) for entry, g in program.graphs.items()}
        if not walker.changed:
            params = {name: walker.params.get(name) for name in program.params}
            return ShardPlan(world, params, dict(walker.states), layouts,
                             walker.row_parallel, set(walker.whole), program)  # fmt: skip
    raise ShardingError(f"the sharding plan did not settle in {max_rounds} rounds")


class _Walker:
    def __init__(self, world: int) -> None:
        self.world = world
        self.whole: set[str] = set()  # linears (by weight) made whole after a conflict
        self.parts: dict[str, int] = {}  # linears split in fewer blocks than ranks
        self.states: dict[str, Split | None] = {}
        self.changed = False
        self.params: dict = {}
        self.row_parallel: dict[str, set] = {}
        self.bias_of: dict[str, str | None] = {}

    # -- bookkeeping ------------------------------------------------------------------
    def conflict(self, seeds: frozenset, why: str) -> None:
        """Make the linears a split came from whole again, and walk once more."""
        if not seeds:
            raise ShardingError(f"cannot place a split value: {why}")
        self.whole |= seeds
        self.changed = True

    def use_param(self, name: str | None, want: Split | None) -> None:
        if name is None:
            return
        prev = self.params.get(name, _MISSING)
        if prev is _MISSING:
            self.params[name] = want
        elif not (prev is None and want is None) and not (want is not None and want.same(prev)):
            self.conflict(seeds_of(prev, want), f"param {name} split two ways")

    # -- the walk ---------------------------------------------------------------------
    def walk(self, entry: str, graph: Graph) -> dict:
        self.names = {v: n for n, v in graph.params.items()}
        self.state_of = {v: n for n, v in graph.states.items()}
        self.entry = entry
        self.inputs = set(graph.inputs)
        self.row_parallel[entry] = set()
        for name, lay in list(self.states.items()):
            if lay is not None and lay.seeds <= self.whole:  # its linears went whole
                del self.states[name]
                self.changed = True
        lay: dict = {v: None for v in graph.inputs}
        lay.update({v: None for v in graph.params.values()})
        lay.update({v: self.states.get(n) for n, v in graph.states.items()})
        for node in graph.nodes:
            out = self.node(node, lay)
            if node.output is not None:
                lay[node.output] = out
        for v in graph.outputs:  # gathered whole at the end (a vocab-parallel lm_head)
            size = v.type.shape[lay[v].axis] if lay[v] is not None else None
            if size is not None and (
                lay[v].parts != self.world or not size.is_const or size.value % self.world
            ):
                self.conflict(lay[v].seeds, "an entry's output must be whole")
        for name, v in graph.state_outputs.items():
            want = self.states.get(name)
            if not (lay[v] is None and want is None) and not (lay[v] and lay[v].same(want)):
                self.conflict(seeds_of(lay[v], want), f"state {name} written two ways")
        return lay

    def node(self, node: Node, lay: dict) -> Split | None:
        ins = [lay[v] for v in node.inputs]
        if node.op == "take" and _vocab_parallel(self, node, ins):
            return None
        if node.op != "linear":
            for v in node.inputs:
                self.use_param(self.names.get(v), lay[v] if v in self.names else None)
        if node.op == "linear":
            return _linear(self, node, ins)
        if all(i is None for i in ins) and node.op not in ("update_slice", "update_rows"):
            return None
        rule = RULES.get("elementwise" if node.op in ELEMENTWISE else node.op)
        if rule is None:
            self.conflict(seeds_of(*ins), f"no sharding rule for {node.op}")
            return None
        return rule(self, node, ins)


def _prod(dims) -> Poly:
    acc = Poly.const(1)
    for d in dims:
        acc = acc * Poly.lift(d)
    return acc


def _reshape_axis(src, dst, axis: int) -> int | None:
    """The axis of `dst` whose outer part is `src[axis]` (kept, split or merged), or None.
    Among the axes after the same prefix (size-1 axes make several), the first that fits:
    [B, S, 16] -> [B, S, 1, 16] puts a 16-wide split on the one head, not on its 16 dims."""
    prefix, size = _prod(src[:axis]), Poly.lift(src[axis])
    for j in range(len(dst)):
        if _prod(dst[:j]) != prefix:
            continue
        out = Poly.lift(dst[j])
        if out == size:
            return j
        if any(_prod(dst[j:k]) == size for k in range(j + 2, len(dst) + 1)):
            return j  # split: the heads are the outer factor
        if any(_prod(src[axis:k]) == out for k in range(axis + 2, len(src) + 1)):
            return j  # merged with the axes after it
    return None


def _heads(w: _Walker, lay: Split, size: Poly) -> Split:
    """`lay` on an axis of `size` blocks (heads): divisible; fewer heads than ranks (then
    `world // heads` ranks share each head); or more heads than ranks, split unevenly one
    head a block (attention then groups query heads by KV head: `_attention`). The last two
    restart the walk with the linears the split came from cut that way."""
    n = size.value if size.is_const else None
    if n is not None and n % lay.parts == 0:
        return lay
    finer = lay.parts == w.world or (n is not None and lay.parts % n == 0)  # rows -> heads
    if n is not None and finer and (w.world % n == 0 or n > w.world):
        _reseed(w, lay.seeds, n)
        return Split(lay.axis, n, lay.seeds)
    raise ShardingError(
        f"{', '.join(sorted(lay.seeds))}: {size} heads do not split over {w.world} ranks "
        f"(more heads than ranks split along whole KV groups; fewer need the ranks to be a "
        f"multiple of the heads, so that each head is shared by as many ranks)"
    )


def _reseed(w: _Walker, seeds: frozenset, parts: int) -> None:
    """Cut the column-parallel linears `seeds` (and their biases) in `parts` blocks, from
    now on (in this round too)."""
    for seed in seeds:
        w.parts[seed] = parts
        w.params[seed] = Split(0, parts, frozenset({seed}))
        if w.bias_of.get(seed):
            w.params[w.bias_of[seed]] = Split(0, parts, frozenset({seed}))
    w.changed = True


def _reshape(w: _Walker, node: Node, ins) -> Split | None:
    (x,) = ins
    src, dst = node.inputs[0].type.shape, node.output.type.shape
    j = _reshape_axis(src, dst, x.axis)
    if j is None:
        w.conflict(x.seeds, "a reshape that moves a split axis")
        return None
    return _heads(w, x.moved(j), Poly.lift(dst[j]))


def _elementwise(w: _Walker, node: Node, ins) -> Split | None:
    rank = node.output.type.rank
    aligned = [
        (i.moved(i.axis + rank - v.type.rank) if i is not None else None, v)
        for i, v in zip(ins, node.inputs, strict=True)
    ]
    splits = [s for s, _ in aligned if s is not None]
    first = splits[0]
    for s, v in aligned:
        if s is None:
            k = first.axis - (rank - v.type.rank)
            if k >= 0 and v.type.shape[k] != Poly.const(1):
                w.conflict(seeds_of(*splits), f"{node.op} of a split and a whole tensor")
                return None
        elif not s.same(first):
            w.conflict(seeds_of(*splits), f"{node.op} of tensors split two ways")
            return None
    return Split(first.axis, first.parts, seeds_of(*splits))


def _transpose(w: _Walker, node: Node, ins) -> Split | None:
    return ins[0].moved(list(node.attrs["perm"]).index(ins[0].axis))


def _whole_axis(node: Node, x: Split) -> bool:
    """A slice or write that covers the split axis whole."""
    a = x.axis
    full = node.inputs[0].type.shape[a]
    if node.op == "slice":
        steps = node.attrs.get("steps")
        step = steps[a] if steps else 1
        ok = Poly.lift(node.attrs["starts"][a]) == Poly.const(0) and step == 1
        return ok and Poly.lift(node.attrs["stops"][a]) == full
    if node.op == "update_rows" and a in (node.attrs["axis"], node.attrs.get("row_axis")):
        return False
    return (
        Poly.lift(node.attrs["starts"][a]) == Poly.const(0) and node.inputs[1].type.shape[a] == full
    )


def _slice(w: _Walker, node: Node, ins) -> Split | None:
    if not _whole_axis(node, ins[0]):
        w.conflict(ins[0].seeds, "a slice across a split axis")
        return None
    return ins[0]


def _write(w: _Walker, node: Node, ins) -> Split | None:
    """A cache write: the cache takes the split of what is written into it."""
    x, upd = ins[0], ins[1]
    if upd is None and x is None:
        return None
    if any(i is not None for i in ins[2:]):
        w.conflict(seeds_of(*ins), "split write positions")
        return None
    state = w.state_of.get(node.inputs[0])
    if x is None and state is not None and state not in w.states:
        w.states[state] = upd  # first write into this state: it takes the split
        w.changed = True
        x = upd
    if x is None or upd is None or not x.same(upd) or not _whole_axis(node, x):
        w.conflict(seeds_of(x, upd), "a write that mixes split and whole values")
        return None
    if state is not None:
        w.state_of[node.output] = state
    return Split(x.axis, x.parts, seeds_of(x, upd))


def _per_head(w: _Walker, node: Node, ins) -> Split | None:
    """rope, norms and softmax: fine when they work within a head (not the split axis)."""
    x = ins[0]
    rank = node.inputs[0].type.rank
    axis = node.attrs.get("axis", -1) % rank if node.op == "softmax" else rank - 1
    inner = {axis, 2} if node.op == "rope" else {axis}  # rope also reads positions (axis 2)
    if x is None or x.axis in inner or any(i is not None for i in ins[1:]):
        w.conflict(seeds_of(*ins), f"{node.op} across a split axis")
        return None
    return x


def _reduce(w: _Walker, node: Node, ins) -> Split | None:
    x = ins[0]
    axis = node.attrs["axis"] % node.inputs[0].type.rank
    if axis == x.axis:
        w.conflict(x.seeds, "a reduction over a split axis")
        return None
    if not node.attrs.get("keepdims", True) and axis < x.axis:
        return x.moved(x.axis - 1)
    return x


def _attention(w: _Walker, node: Node, ins) -> Split | None:
    q, k, v = ins[:3]
    seeds = seeds_of(*ins)
    if any(i is not None for i in ins[3:]) or any(i is None or i.axis != 1 for i in (q, k, v)):
        w.conflict(seeds, "attention over heads split unevenly (or a split mask)")
        return None
    if len(node.inputs) > 3 and node.attrs.get("sinks"):
        w.conflict(seeds, "attention sinks are one param over all heads")
        return None
    if not k.same(v):
        w.conflict(seeds, "attention's keys and values split unlike each other")
        return None
    hq = node.inputs[0].type.shape[1]
    if k.parts >= w.world and q.parts != k.parts:  # each rank's queries: its KV heads' groups
        _reseed(w, q.seeds, k.parts)
        return Split(1, k.parts, seeds)
    if q.parts != w.world and k.parts < w.world:
        raise ShardingError(
            f"{hq} heads do not split over {w.world} ranks (with "
            f"{node.inputs[1].type.shape[1]} KV heads shared by several ranks, the query "
            f"heads must split evenly)"
        )
    if w.world % min(k.parts, w.world):
        w.conflict(seeds, "attention's keys and values split unlike its queries")
        return None
    return Split(1, q.parts, seeds)


def _linear(w: _Walker, node: Node, ins) -> Split | None:
    x = ins[0]
    weight, bias = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
    wname, bname = w.names.get(weight), w.names.get(bias) if bias is not None else None
    rank = node.output.type.rank
    params_ok = wname is not None and (bias is None or bname is not None) and weight.type.rank == 2
    if x is None:
        if not params_ok or wname in w.whole or w.params.get(wname, _MISSING) is None:
            w.use_param(wname, None)
            w.use_param(bname, None)
            return None
        seed = frozenset({wname})
        w.bias_of[wname] = bname
        parts = w.parts.get(wname, w.world)
        rows = weight.type.shape[0]
        if wname not in w.parts and rows.is_const and rows.value % parts and rows.value > parts:
            parts = rows.value  # the world does not divide its rows: a row a block, unevenly
        w.use_param(wname, Split(0, parts, seed))
        w.use_param(bname, Split(0, parts, seed))
        return Split(rank - 1, parts, seed)
    if x.axis != rank - 1:  # split on a leading axis: the linear works row by row
        w.use_param(wname, None)
        w.use_param(bname, None)
        return x
    if not params_ok or x.parts < w.world:  # every block on one rank: the sum is exact
        w.conflict(x.seeds, "a linear over a split axis without a param weight")
        return None
    w.use_param(wname, Split(1, x.parts, x.seeds))
    w.use_param(bname, None)
    w.row_parallel[w.entry].add(id(node))
    return None


def _vocab_parallel(w: _Walker, node: Node, ins) -> bool:
    """The embedding: a param table gathered by the token ids (a graph input) is split on
    its rows (the vocabulary) when the world divides them; each rank gathers the tokens it
    holds (the others give zeros) and an `all_reduce` sums, exactly (one term is nonzero).
    It pays in memory: a head tied to it (SmolLM2) is then vocab-parallel too, and an untied
    one already was. The cost is one all_reduce of [B, S, dim] per call."""
    table, ids = node.inputs
    name, rows = w.names.get(table), table.type.shape[0]
    if name is None or name in w.whole or ids not in w.inputs or ins[1] is not None:
        return False
    if w.world == 1 or not rows.is_const or rows.value % w.world:
        return False  # kept whole: NamedSharding and the all_gather of a tied head need even
    w.use_param(name, Split(0, w.world, frozenset({name})))
    w.row_parallel[w.entry].add(id(node))
    return True


def _take(w: _Walker, node: Node, ins) -> Split | None:
    w.conflict(seeds_of(*ins), "a gather from a split table")
    return None


RULES = {
    "elementwise": _elementwise,
    "reshape": _reshape,
    "transpose": _transpose,
    "slice": _slice,
    "update_slice": _write,
    "update_rows": _write,
    "rope": _per_head,
    "rms_norm": _per_head,
    "layer_norm": _per_head,
    "softmax": _per_head,
    "reduce_sum": _reduce,
    "reduce_max": _reduce,
    "reduce_mean": _reduce,
    "attention": _attention,
    "take": _take,
}
