"""Find the repeated layers of a lowered entry, so a backend can emit one function per
layer shape and call it once per layer (issue 21).

Lowering unrolls `for p in layers`: a 30-layer decoder is one straight line of 30 copies
of the same nodes, and torch.compile over that line compiles all of them (minutes on a
CPU, growing with depth). Here the line is cut back into layers:

- layer i starts at the first node that reads one of its params (`layers.i.*`) and runs
  to the start of layer i + 1; the last layer is as long as the one before it when its
  nodes match, else it ends at its last param read;
- guards with no inputs (dim checks) move in front of the first layer, so the first
  layer is not the only one that checks the rope table;
- two layers share a function when their nodes match op for op: same attrs, same types,
  inputs from the same places (a node of the layer, the layer's own param by its name
  under `layers.i`, or the k-th value read from outside).

A layer's state writes must be in place (`inplace_updates`): the function writes into the
part it is given and returns only the values read after it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from linnet.ir.graph import Graph, Node, Value
from linnet.ir.passes import WRITE_OPS, inplace_updates

REPEATED_PARAM = re.compile(r"^([A-Za-z_]\w*)\.(\d+)\.(.+)$")


@dataclass
class Region:
    """One layer: its nodes, what it reads from outside, its own params (by their name
    inside the layer), the values read after it, and its kind (layers of one kind share a
    function)."""

    layer: int
    nodes: list[Node]
    inputs: list[Value] = field(default_factory=list)
    params: dict[str, Value] = field(default_factory=dict)
    outputs: list[Value] = field(default_factory=list)
    kind: int = -1


@dataclass
class Outline:
    """An entry cut into the nodes before its layers, the layers, and the nodes after."""

    group: str  # the repeated params' prefix: "layers"
    before: list[Node]
    regions: list[Region]
    after: list[Node]

    @property
    def kinds(self) -> dict[int, Region]:
        """kind -> its first region (the one whose nodes the function is written from)."""
        first: dict[int, Region] = {}
        for r in self.regions:
            first.setdefault(r.kind, r)
        return first


def repeated_group(graph: Graph) -> str | None:
    """The prefix of the params repeated most often (`layers` in `layers.3.wq`), if any
    is repeated at least twice."""
    counts: Counter = Counter()
    seen = set()
    for name in graph.params:
        m = REPEATED_PARAM.match(name)
        if m and (m[1], m[2]) not in seen:
            seen.add((m[1], m[2]))
            counts[m[1]] += 1
    if not counts:
        return None
    group, n = counts.most_common(1)[0]
    return group if n >= 2 else None


def _layer_params(graph: Graph, group: str) -> dict[Value, tuple[int, str]]:
    """param value -> (layer index, name inside the layer) for the group's params."""
    owned = {}
    for name, v in graph.params.items():
        m = REPEATED_PARAM.match(name)
        if m and m[1] == group:
            owned[v] = (int(m[2]), m[3])
    return owned


def _hoist_guards(nodes: list[Node], at: int) -> list[Node]:
    """Guards without inputs (checks on dims alone) from `at` on moved to `at`."""
    head, tail = nodes[:at], nodes[at:]
    guards = [n for n in tail if n.op == "guard" and not n.inputs]
    rest = [n for n in tail if not (n.op == "guard" and not n.inputs)]
    return head + guards + rest


def _starts(nodes: list[Node], owned: dict) -> dict[int, int] | None:
    """layer -> index of the first node that reads one of its params; None unless layers
    start in order."""
    starts: dict[int, int] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            if v in owned:
                starts.setdefault(owned[v][0], i)
    layers = sorted(starts)
    if layers != list(range(len(layers))) or len(layers) < 2:
        return None
    positions = [starts[k] for k in layers]
    increasing = all(a < b for a, b in zip(positions, positions[1:]))
    return starts if increasing else None


def _attr_key(value):
    """A hashable, comparable form of an attr (arrays by dtype, shape and bytes)."""
    if hasattr(value, "tobytes") and hasattr(value, "dtype"):
        return ("array", str(value.dtype), tuple(value.shape), value.tobytes())
    if isinstance(value, (tuple, list)):
        return tuple(_attr_key(x) for x in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _attr_key(x)) for k, x in value.items()))
    return (type(value).__name__, str(value))


def _type_key(v: Value | None):
    return None if v is None else str(v.type)


def describe(region: Region, owned: dict) -> tuple:
    """Fill the region's inputs and params; return its structure (equal structures: one
    function serves both layers)."""
    local: dict = {}  # value made in the region -> its node's index there
    where: dict = {}  # outside value -> its index among the inputs
    ops = []
    for k, node in enumerate(region.nodes):
        refs = []
        for v in node.inputs:
            if v in local:
                refs.append(("node", local[v]))
            elif owned.get(v, (None,))[0] == region.layer:
                region.params[owned[v][1]] = v
                refs.append(("param", owned[v][1]))
            else:
                if v not in where:
                    where[v] = len(region.inputs)
                    region.inputs.append(v)
                refs.append(("input", where[v], _type_key(v)))
        attrs = tuple(sorted((a, _attr_key(x)) for a, x in node.attrs.items()))
        ops.append((node.op, attrs, tuple(refs), _type_key(node.output)))
        if node.output is not None:
            local[node.output] = k
    outputs = tuple(local[v] for v in region.outputs)
    return tuple(ops), outputs


def _read_after(nodes: list[Node], graph: Graph) -> dict:
    """value -> index of the last node that reads it (len(nodes) for the graph's outputs)."""
    last: dict = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            last[v] = i
    for v in list(graph.outputs) + list(graph.state_outputs.values()):
        last[v] = len(nodes)
    return last


def _close(region: Region, end: int, last_read: dict, owned: dict) -> tuple:
    """The region's outputs (values read at or after `end`, the index after its last
    node; state versions are written in place, not returned), then its structure."""
    region.inputs, region.params = [], {}
    region.outputs = [
        n.output
        for n in region.nodes
        if n.output is not None and n.op not in WRITE_OPS and last_read.get(n.output, -1) >= end
    ]
    return describe(region, owned)


def _last_param_read(nodes: list[Node], owned: dict, layer: int) -> int:
    reads = [
        i for i, n in enumerate(nodes) if any(owned.get(v, (None,))[0] == layer for v in n.inputs)
    ]
    return reads[-1]


def _regions(nodes: list[Node], starts: dict, owned: dict, last_read: dict) -> list[Region]:
    """The layers, each from its start to the next one's; the last as long as the one
    before it when the two match, else to its last param read (a kind of its own)."""
    layers = sorted(starts)
    regions, structures = [], []
    for k in layers[:-1]:
        region = Region(k, nodes[starts[k] : starts[k + 1]])
        structures.append(_close(region, starts[k + 1], last_read, owned))
        regions.append(region)
    k, lo = layers[-1], starts[layers[-1]]
    hi = lo + len(regions[-1].nodes)
    last = Region(k, nodes[lo:hi])
    structure = _close(last, hi, last_read, owned) if hi <= len(nodes) else None
    if structure != structures[-1]:
        hi = _last_param_read(nodes, owned, k) + 1
        last = Region(k, nodes[lo:hi])
        structure = _close(last, hi, last_read, owned)
    kinds: dict = {}
    for region, s in zip(regions + [last], structures + [structure]):
        region.kind = kinds.setdefault(s, len(kinds))
    return regions + [last]


def outline(graph: Graph) -> Outline | None:
    """The entry cut into layers (see the module's doc), or None when it has no repeated
    layers that cut cleanly (no `layers.i.*` params, layers out of order, a state write
    that is not in place)."""
    group = repeated_group(graph)
    if group is None:
        return None
    owned = _layer_params(graph, group)
    starts = _starts(graph.nodes, owned)
    inplace = {id(graph.nodes[i]) for i in inplace_updates(graph)}
    if starts is None or any(n.op in WRITE_OPS and id(n) not in inplace for n in graph.nodes):
        return None
    nodes = _hoist_guards(graph.nodes, starts[0])
    starts = _starts(nodes, owned)
    regions = _regions(nodes, starts, owned, _read_after(nodes, graph))
    end = starts[0] + sum(len(r.nodes) for r in regions)
    return Outline(group, nodes[: starts[0]], regions, nodes[end:])
