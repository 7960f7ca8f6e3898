"""LoRA as a program transform: chosen linears gain a low-rank branch, the base frozen.

    spec = LoraSpec(("layers.*.wq", "layers.*.wv"), r=8, alpha=16)
    program, targets = add_lora(source.program(config), spec)

Each `linear(x, w, b)` whose weight param `w` matches a pattern becomes

    linear(x, w, b) + linear(linear(x, w_lora_a), w_lora_b) * (alpha / r)

with two new params, `w_lora_a` [r, in] and `w_lora_b` [out, r] (PEFT's `lora_A`, `lora_B`
and order of operations). Dropout on the branch's input is applied by the training module
(`lora_dropout_source`), since inference runs without it.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, replace

import numpy as np
import torch

from linnet.core.dims import Poly
from linnet.errors import LinnetError
from linnet.ir.graph import Graph, GraphBuilder
from linnet.ir.passes import copy_frame, finish
from linnet.ir.program import Program

A_SUFFIX, B_SUFFIX = "_lora_a", "_lora_b"


@dataclass(frozen=True)
class LoraSpec:
    targets: tuple[str, ...]  # glob patterns over param names: "layers.*.wq"
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.r < 1:
            raise LinnetError(f"LoRA rank r={self.r}: it must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise LinnetError(f"LoRA dropout={self.dropout}: it must be in [0, 1)")
        if not self.targets:
            raise LinnetError("LoRA needs at least one target pattern (e.g. layers.*.wq)")

    @property
    def scale(self) -> float:
        return self.alpha / self.r


def lora_names(weight: str) -> tuple[str, str]:
    return weight + A_SUFFIX, weight + B_SUFFIX


def linear_weights(graph: Graph) -> list[str]:
    """Params read as the weight of a `linear`, in graph order."""
    names = {v: n for n, v in graph.params.items()}
    found = [names.get(n.inputs[1]) for n in graph.nodes if n.op == "linear"]
    return list(dict.fromkeys(n for n in found if n is not None))


def match_targets(graph: Graph, patterns: tuple[str, ...]) -> list[str]:
    """The linear weights each pattern picks; a pattern that picks none is an error."""
    weights = linear_weights(graph)
    chosen = []
    for pattern in patterns:
        hits = [w for w in weights if fnmatch.fnmatchcase(w, pattern)]
        if not hits:
            shown = ", ".join(weights[:6])
            raise LinnetError(
                f"LoRA target {pattern!r} matches no linear weight (they are named like {shown})"
            )
        chosen += hits
    return list(dict.fromkeys(chosen))


def _lora_up(b: GraphBuilder, node, down, bw, scale: float):
    up = b.add("linear", [down, bw], where=node.where, **node.attrs)
    dtype = up.type.dtype
    factor = b.add("const", [], value=np.asarray(scale, dtype=np.float64), dtype=dtype)
    return b.add("mul", [up, factor])


def _shared_inputs(graph: Graph, weights: dict) -> dict:
    """Target linears grouped by the value they read (q, k, v read one; gate, up one):
    {id(first node of a group): the group's nodes}, groups of two or more only."""
    groups: dict = {}
    for node in graph.nodes:
        if node.op == "linear" and node.inputs[1] in weights:
            groups.setdefault(node.inputs[0], []).append(node)
    return {id(nodes[0]): nodes for nodes in groups.values() if len(nodes) > 1}


def _fused_downs(b: GraphBuilder, nodes, x, a_params: list) -> list:
    """One matmul for the A projections of linears reading `x`: the A's joined along their
    rows, then a slice per target (each column the same dot product as alone)."""
    first = nodes[0]
    joined = b.add("concat", a_params, axis=0)
    down = b.add("linear", [x, joined], where=first.where, **first.attrs)
    rank, lo, outs = down.type.rank, 0, []
    for a in a_params:
        width = a.type.shape[0].value
        starts = (Poly.const(0),) * (rank - 1) + (Poly.const(lo),)
        stops = tuple(down.type.shape[:-1]) + (Poly.const(lo + width),)
        outs.append(b.add("slice", [down], starts=starts, stops=stops))
        lo += width
    return outs


def lora_graph(graph: Graph, targets: list[str], r: int, scale: float, fuse=True) -> Graph:
    """`graph` with a LoRA branch beside every linear whose weight is in `targets`;
    `fuse`: the A projections of targets that read one input as one matmul (without
    dropout only: PEFT draws each branch's dropout mask apart)."""
    out, mapping = copy_frame(graph)
    weights = {graph.params[t]: t for t in targets}
    for t in targets:
        w = graph.params[t].type
        a_name, b_name = lora_names(t)
        out.param(a_name, w.with_shape((r, w.shape[1])))
        out.param(b_name, w.with_shape((w.shape[0], r)))
    shared = _shared_inputs(graph, weights) if fuse else {}
    downs: dict = {}  # id(target node) -> its A projection, made with its group's first
    b = GraphBuilder(out)
    for node in graph.nodes:
        ins = [mapping[v] for v in node.inputs]
        result = b.add(node.op, ins, where=node.where, **node.attrs)
        target = weights.get(node.inputs[1]) if node.op == "linear" else None
        if target is not None:
            if id(node) in shared:
                group = shared[id(node)]
                a_params = [out.params[lora_names(weights[n.inputs[1]])[0]] for n in group]
                made = _fused_downs(b, group, ins[0], a_params)
                downs.update({id(n): d for n, d in zip(group, made)})
            a_name, b_name = lora_names(target)
            down = downs.pop(id(node), None)
            if down is None:
                down = b.add("linear", [ins[0], out.params[a_name]], where=node.where, **node.attrs)
            branch = _lora_up(b, node, down, out.params[b_name], scale)
            result = b.add("add", [result, branch])
        if node.output is not None:
            mapping[node.output] = result
    return finish(graph, out, mapping)


def add_lora(program: Program, spec: LoraSpec) -> tuple[Program, list[str]]:
    """The program's `forward` with LoRA branches on the linears `spec` names; the targets
    (base weight names)."""
    forward = program.graphs["forward"]
    targets = match_targets(forward, spec.targets)
    graph = lora_graph(forward, targets, spec.r, spec.scale, fuse=spec.dropout == 0.0)
    params = dict(program.params)
    for t in targets:
        for name in lora_names(t):
            params[name] = graph.params[name].type
    return replace(program, graphs={"forward": graph}, params=params), targets


def init_lora(program: Program, targets: list[str], seed: int = 0) -> dict[str, torch.Tensor]:
    """PEFT's default initialization: A kaiming-uniform (a = sqrt 5), B zeros, so the
    adapted model starts equal to the base."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for t in targets:
        a_name, b_name = lora_names(t)
        a_shape = [d.value for d in program.params[a_name].shape]
        bound = 1.0 / math.sqrt(a_shape[1])  # kaiming_uniform_(a=sqrt(5)) on [r, in]
        out[a_name] = (torch.rand(a_shape, generator=gen) * 2 - 1) * bound
        out[b_name] = torch.zeros([d.value for d in program.params[b_name].shape])
    return out


# the A weight as the whole entry reads it (`self.wq_lora_a`, or `_layers[0].wq_lora_a`
# where a method binds its ModuleList as a tuple) or as an outlined layer method's
# argument (`p_wq_lora_a`, `linnet.backends.torch.outlined`)
_BRANCH_INPUT = re.compile(
    r"(F\.linear|linear_lowp)\((\w+), ((?:self|_\w+)[\.\[][\w\[\]\.]+"
    + A_SUFFIX
    + r"|p_\w+"
    + A_SUFFIX
    + r")\)"
)


def lora_dropout_source(text: str, p: float) -> str:
    """Generated training code with dropout on each LoRA branch's input (PEFT's
    `lora_dropout`), active in `module.train()` only."""
    if p == 0.0:
        return text
    text, count = _BRANCH_INPUT.subn(rf"\1(F.dropout(\2, {p!r}, self.training), \3)", text)
    if count == 0 and A_SUFFIX in text:  # the generated code's shape changed under the regex
        raise LinnetError("LoRA dropout found no branch input in the generated code")
    return text
