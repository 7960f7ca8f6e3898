"""The PyTorch interpreter: walks a Core-IR graph per call with the emitter table.

Construction resolves every node to (emitter, input slots, attrs, output slot)
once, so a call is a tight loop. Constants become tensors on the device once.
"""

from __future__ import annotations

import torch

from linnet.backends.torch_emit import EMITTERS, TORCH_DTYPES
from linnet.errors import LinnetError
from linnet.ir.graph import Graph


class Interpreter:
    def __init__(self, graph: Graph, params: dict[str, torch.Tensor], device="cpu") -> None:
        self.graph = graph
        slots: dict = {}

        def slot(v) -> int:
            return slots.setdefault(v, len(slots))

        self.input_slots = [slot(v) for v in graph.inputs]
        self.state_slots = {name: slot(v) for name, v in graph.states.items()}
        self.fixed: dict[int, torch.Tensor] = {}
        for name, v in graph.params.items():
            self.fixed[slot(v)] = params[name]
        self.steps = []
        for node in graph.nodes:
            ins = [slot(v) for v in node.inputs]
            out = None if node.output is None else slot(node.output)
            if node.op == "const":  # fold constants once
                self.fixed[out] = EMITTERS["const"](node.attrs, {}).to(device)
                continue
            attrs = dict(node.attrs, where=node.where) if node.op == "guard" else node.attrs
            self.steps.append((EMITTERS[node.op], ins, attrs, out))
        self.output_slots = [slots[v] for v in graph.outputs]
        self.state_out_slots = {k: slots[v] for k, v in graph.state_outputs.items()}
        self.n_slots = len(slots)

    def bind_dims(self, inputs: list[torch.Tensor], dim_values: dict[str, int]) -> dict:
        dims = {self.graph.dim_inputs[k]: int(v) for k, v in dim_values.items()}
        for value, tensor in zip(self.graph.inputs, inputs):
            if tensor.dim() != value.type.rank:
                raise LinnetError(
                    f"`{value.name}` must have rank {value.type.rank} "
                    f"({value.type}), got shape {tuple(tensor.shape)}"
                )
            if tensor.dtype != TORCH_DTYPES[value.type.dtype]:
                raise LinnetError(f"`{value.name}` must be {value.type.dtype}, got {tensor.dtype}")
            for poly, size in zip(value.type.shape, tensor.shape):
                atom = poly.as_atom()
                if atom is not None and atom not in dims:
                    dims[atom] = int(size)
                elif poly.eval(dims) != size:
                    raise LinnetError(
                        f"`{value.name}` must be {value.type}, got shape {tuple(tensor.shape)}"
                    )
        return dims

    def run(
        self,
        inputs: list[torch.Tensor],
        dim_values: dict[str, int] | None = None,
        states: dict[str, torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        dims = self.bind_dims(inputs, dim_values or {})
        env: list = [None] * self.n_slots
        for i, t in self.fixed.items():
            env[i] = t
        for i, t in zip(self.input_slots, inputs):
            env[i] = t
        for name, i in self.state_slots.items():
            env[i] = states[name]
        for emit, ins, attrs, out in self.steps:
            result = emit(attrs, dims, *[env[i] for i in ins])
            if out is not None:
                env[out] = result
        return [env[i] for i in self.output_slots]
