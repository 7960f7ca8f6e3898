"""Core IR graphs: SSA values, nodes in program order, and the two builders.

A `Graph` is one entry point specialised to one config: its shapes are
polynomials over the runtime dims only (B, S, P…). Params, inputs and state
are graph inputs; state updates are outputs (functional: `update_slice`).

`GraphBuilder` records nodes; `TypeBuilder` only runs the op table's rules.
The front end drives either one through the same calls, so the checker and
the lowering share every shape rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from linnet.ir.ops import OPS
from linnet.ir.types import TensorType


@dataclass(eq=False)
class Value:
    type: TensorType
    name: str = ""  # inputs and params keep their source names
    id: int = -1

    def __repr__(self) -> str:
        return f"%{self.id}"


@dataclass(eq=False)
class Node:
    op: str
    inputs: list[Value]
    attrs: dict
    output: Value | None
    where: str = ""  # source position, for runtime guard messages


@dataclass
class Graph:
    name: str
    inputs: list[Value] = field(default_factory=list)  # entry arguments, in order
    dim_inputs: dict[str, str] = field(default_factory=dict)  # arg name -> dim atom (`at: P`)
    params: dict[str, Value] = field(default_factory=dict)
    states: dict[str, Value] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    state_outputs: dict[str, Value] = field(default_factory=dict)
    _next_id: int = 0

    def new_value(self, type_: TensorType, name: str = "") -> Value:
        v = Value(type_, name, self._next_id)
        self._next_id += 1
        return v

    def input(self, name: str, type_: TensorType) -> Value:
        v = self.new_value(type_, name)
        self.inputs.append(v)
        return v

    def param(self, name: str, type_: TensorType) -> Value:
        v = self.new_value(type_, name)
        self.params[name] = v
        return v

    def state(self, name: str, type_: TensorType) -> Value:
        v = self.new_value(type_, name)
        self.states[name] = v
        return v


class TypeBuilder:
    """Runs shape/dtype rules only; values are bare TensorTypes."""

    def add(self, op: str, inputs: list, where: str = "", **attrs):
        return OPS[op].infer([self.type_of(v) for v in inputs], attrs)

    @staticmethod
    def type_of(v) -> TensorType:
        return v


class GraphBuilder(TypeBuilder):
    """Records each op as a node of `graph`; values are `Value`s."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def add(self, op: str, inputs: list, where: str = "", **attrs):
        out_type = OPS[op].infer([v.type for v in inputs], attrs)
        out = None if out_type is None else self.graph.new_value(out_type)
        self.graph.nodes.append(Node(op, list(inputs), attrs, out, where))
        return out

    @staticmethod
    def type_of(v) -> TensorType:
        return v.type
