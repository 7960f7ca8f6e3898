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
        inplace = inplace_updates(graph)
        for index, node in enumerate(graph.nodes):
            ins = [slot(v) for v in node.inputs]
            out = None if node.output is None else slot(node.output)
            if node.op == "const":  # fold constants once
                self.fixed[out] = EMITTERS["const"](node.attrs, {}).to(device)
                continue
            attrs = node.attrs
            if node.op == "guard":
                attrs = dict(attrs, where=node.where)
            elif node.op == "update_slice":
                attrs = dict(attrs, inplace=index in inplace)
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
        outputs = [env[i] for i in self.output_slots]
        for name, i in self.state_out_slots.items():
            buffer = states[name]
            if env[i] is not buffer:  # an update had to copy: keep the buffer's address
                ptr = buffer.untyped_storage().data_ptr()
                outputs = [
                    o.clone() if o.untyped_storage().data_ptr() == ptr else o for o in outputs
                ]  # outputs that read the old state keep it
                buffer.copy_(env[i])
        return outputs


VIEW_OPS = ("slice", "reshape", "transpose")


def inplace_updates(graph: Graph) -> set[int]:
    """Indices of the `update_slice` nodes that may write into their input's storage.

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
        if node.op in VIEW_OPS or node.op == "update_slice":
            x = node.inputs[0]
            base = root.get(x, x)
        if node.op in VIEW_OPS:
            root[node.output] = base
        if node.op != "update_slice":
            continue
        stale = [v for v, r in root.items() if r is base and born[v] < i] + [base]
        if all(last_use.get(v, -1) <= i for v in stale if v is not node.output):
            safe.add(i)
            root[node.output] = base
    return safe
