"""The PyTorch interpreter: runs a Core-IR graph node by node.

Each node's text from the emitter table (`torch_emit`) is compiled into a small
function once, at construction; a call is then a flat loop over those functions
with the runtime dims bound. Array constants become tensors on the device once, and
so does every node computed from params and constants alone (hoisting: a batch norm's
folded scale and shift, a transposed weight).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from linnet.backends.emit import Lines
from linnet.backends.torch import prelude as torch_prelude
from linnet.backends.torch.emit import Spell, emit
from linnet.core.dims import Poly
from linnet.core.dtypes import DTYPES
from linnet.errors import LinnetError, RuntimeGuardError
from linnet.ir.graph import Graph
from linnet.ir.passes import WRITE_OPS, dying_values, inplace_updates

TORCH_DTYPES = {name: getattr(torch, d.torch) for name, d in DTYPES.items()}


def namespace(device) -> dict:
    """What emitted code may name: torch, F, math, the prelude, the device."""
    ns = {
        name: getattr(torch_prelude, name)
        for name in dir(torch_prelude)
        if not name.startswith("__")
    }
    ns.update(torch=torch, F=F, math=math, _dev=torch.device(device))
    return ns


def _guard(lhs, rhs, message, lhs_text, rhs_text):
    torch_prelude._guard(lhs, rhs, message, lhs_text, rhs_text, error=RuntimeGuardError)


def compile_node(node, ns: dict, arity: int):
    """A function (dims, *inputs) -> output for one node, from its emitted text."""
    spell = Spell(dim_atom=lambda a: f"_d[{a!r}]")
    args = [f"_{i}" for i in range(arity)]
    text = emit(node, spell, args)
    params = ", ".join(["_d"] + args)
    if isinstance(text, Lines):
        body = "\n".join(f"    {line}" for line in text.lines)
        source = f"def _fn({params}):\n{body}\n    return {text.value}\n"
    else:
        source = f"def _fn({params}):\n    return {text}\n"
    scope: dict = {}
    exec(compile(source, f"<linnet {node.op}>", "exec"), ns, scope)
    return scope["_fn"]


def _static(value) -> bool:
    if isinstance(value, Poly):
        return value.is_const
    if isinstance(value, (tuple, list)):
        return all(_static(v) for v in value)
    return True


def _foldable(node) -> bool:
    """A node whose result depends on nothing known only at run time: no runtime dim in
    its type or attrs, no state write, no guard, no device move (a streamed weight is
    copied in at each call). When its inputs are params and constants,
    the interpreter computes it once at load (a batch norm's scale and shift)."""
    if node.op in ("guard", "update_slice", "update_rows", "iota", "to_device", "await_copy"):
        return False
    return all(d.is_const for d in node.output.type.shape) and _static(list(node.attrs.values()))


class Interpreter:
    def __init__(self, graph: Graph, params: dict[str, torch.Tensor], device="cpu") -> None:
        self.graph = graph
        ns = namespace(device)
        ns["_guard"] = _guard
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
        dying = dying_values(graph)
        for index, node in enumerate(graph.nodes):
            ins = [slot(v) for v in node.inputs]
            out = None if node.output is None else slot(node.output)
            if node.op == "const":  # fold constants once
                value = torch.as_tensor(node.attrs["value"])
                self.fixed[out] = value.to(TORCH_DTYPES[node.attrs["dtype"]]).to(device)
                continue
            if node.op in WRITE_OPS:
                node = type(node)(
                    node.op,
                    node.inputs,
                    dict(node.attrs, inplace=index in inplace),
                    node.output,
                    node.where,
                )
            fn = compile_node(node, ns, len(ins))
            if out is not None and _foldable(node) and all(i in self.fixed for i in ins):
                self.fixed[out] = fn({}, *[self.fixed[i] for i in ins])  # params only: once
                continue
            frees = [slots[v] for v in dying.get(index, [])]  # see `dying_values`
            self.steps.append((fn, ins, out, frees))
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
                scaled = poly.as_scaled_atom()  # D, or k * D: D = size / k where k divides
                if scaled is not None and scaled[0] not in dims and size % scaled[1] == 0:
                    dims[scaled[0]] = int(size) // scaled[1]
                elif scaled is not None and scaled[0] not in dims or poly.eval(dims) != size:
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
        for fn, ins, out, frees in self.steps:
            result = fn(dims, *[env[i] for i in ins])
            if out is not None:
                env[out] = result
            for i in frees:
                env[i] = None
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
