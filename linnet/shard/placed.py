"""A model whose layers lie on several devices, or stream from host memory (issue 19).

    runner = PlacedRunner(program, params, ["cuda:0", "cuda:1"], "equivalent", "generated")
    print(runner.placement.describe())

The entries are lowered as the ordinary runners lower them (`interpret`: the reference
decompositions; `generated`: the fused straight-line module), their states split per layer
(`split_entry_states`: the KV cache per layer and k/v, so each part can live with its
layer), then placed (`place.py`: device moves as Core-IR ops) and run by the interpreter
or the generated module with each param on its device. The model allocates the state
parts on the first device; each moves to its layer's device once, at its first use.
"""

from __future__ import annotations

import torch

from linnet.backends.torch.codegen import generate_graphs, lower_entries, state_ident
from linnet.backends.torch.interp import Interpreter
from linnet.backends.torch.runners import (
    entry_inputs,
    generated_weights,
    load_generated,
    reference_graph,
    stack_params,
    state_types,
)
from linnet.ir.program import Program
from linnet.ir.state_split import split_entry_states
from linnet.shard.place import HOST, Placed, place_graph
from linnet.shard.placement import Placement, PlacementError, layer_of, plan_placement

PLACED_MODES = ("interpret", "generated")


def lowered(program: Program, mode: str) -> tuple[dict, dict]:
    """The entries as `mode` runs them, states split per layer; and the fused params."""
    if mode not in PLACED_MODES:
        raise PlacementError(
            f"layers split across devices or streamed run modes interpret and generated, not "
            f"{mode}: the hand-overs and streamed copies are calls in the generated code, and "
            "compiling them (torch.compile, CUDA graphs over host copies) is not built or tested"
        )
    if mode == "interpret":
        graphs, fused = {e: reference_graph(program, e) for e in program.entries}, {}
    else:
        graphs, fused = lower_entries(program, fuse=True)
    return split_entry_states(graphs)[0], fused


def read(graph) -> set:
    """The values some node of `graph` reads."""
    return {v for node in graph.nodes for v in node.inputs}


def plan_for(graphs: dict, weights: dict, devices, split, max_device_bytes) -> Placement:
    """The placement of the graphs' params; with a budget, counting each param outside
    the layers on every device it is used on (placed once without the budget first)."""
    sizes = {
        n: weights[n].nbytes for g in graphs.values() for n, v in g.params.items() if v in read(g)
    }
    placement = plan_placement(sizes, devices, split=split)
    if max_device_bytes is None:
        return placement
    used_on: dict[str, set] = {}
    for graph in graphs.values():
        placed = place_graph(graph, placement)
        for name, device in placed.param_device.items():
            name, device = placed.replicas.get(name, (name, device))
            if layer_of(name, placement.container) is None:
                used_on.setdefault(name, set()).add(device)
    fixed = {n: sorted(d) for n, d in used_on.items()}
    return plan_placement(
        sizes, devices, split=split, max_device_bytes=max_device_bytes, fixed_device=fixed
    )


def held_weights(graphs: dict, params: dict, fused: dict, mode: str) -> dict:
    """The params and the fused stacks as one device's runner of `mode` holds them
    (`generated_weights`), so a split sums each linear in the same order as one device
    and gives its bits; `interpret` keeps the source's layout, as its runner does."""
    if mode == "interpret":
        return {**params, **stack_params(params, fused)}
    return generated_weights(graphs, params, fused)


def placed_tensors(placed: dict[str, Placed], weights: dict, devices: list[str]) -> dict:
    """Each placed param on its device; streamed ones in host memory (pinned for CUDA)."""
    pin = torch.cuda.is_available() and any(torch.device(d).type == "cuda" for d in devices)
    tensors = {}
    for p in placed.values():
        for name, device in p.param_device.items():
            if name in tensors:
                continue
            source = weights[p.replicas.get(name, (name, 0))[0]]
            if device == HOST:
                tensors[name] = source.pin_memory() if pin else source
            else:
                tensors[name] = source.to(devices[device])
    return tensors


class PlacedRunner:
    """The runner contract (`run`, `inputs`, `state_types`) over placed graphs."""

    def __init__(
        self, program: Program, params: dict, devices: list[str], numerics: str, mode: str,
        split: list[int] | None = None, max_device_bytes: int | None = None,
    ):  # fmt: skip
        if mode == "interpret" and numerics != "equivalent":
            raise PlacementError("mode='interpret' has only numerics='equivalent'")
        graphs, fused = lowered(program, mode)
        weights = held_weights(graphs, params, fused, mode)
        self.placement = plan_for(graphs, weights, devices, split, max_device_bytes)
        self.placed = {e: place_graph(g, self.placement) for e, g in graphs.items()}
        self.graphs = {e: p.graph for e, p in self.placed.items()}
        self.devices = [torch.device(d) for d in devices]
        self.tensors = placed_tensors(self.placed, weights, devices)
        self.weights = weights  # host copies: the params no graph reads stay there
        self.state_device = {
            name: self.devices[d]
            for p in self.placed.values()
            for name, d in p.state_device.items()
        }
        self.inputs = entry_inputs(self.graphs)
        self.state_types = state_types(graphs)
        if mode == "interpret":
            self.methods = {e: self._interpreted(g) for e, g in self.graphs.items()}
        else:
            self.methods = self._generated(program, numerics, fused, weights)

    def _interpreted(self, graph):
        interp = Interpreter(graph, {**self.weights, **self.tensors}, self.devices[0])
        return lambda inputs, dims, states: interp.run(inputs, dims, states)[0]

    def _generated(self, program: Program, numerics: str, fused: dict, weights: dict) -> dict:
        replicas = {
            name: self.placed[e].graph.params[name].type
            for e, p in self.placed.items()
            for name in p.replicas
        }
        program = Program(
            program.name, program.config, program.graphs, {**program.params, **replicas},
            dict(program.tied),
        )  # fmt: skip
        self.text = generate_graphs(program, self.graphs, numerics, fused)
        module = load_generated(self.text, program.name)()
        names = module.state_dict().keys()  # params no graph reads stay where they are
        module.load_state_dict({k: self.tensors.get(k, weights.get(k)) for k in names}, assign=True)
        for sub in module.modules():  # rope tables: on the first device, as `_dev`
            for key, buffer in sub._buffers.items():
                sub._buffers[key] = buffer.to(self.devices[0])
        self.module = module.eval()

        def method(entry):
            graph, fn = self.graphs[entry], getattr(module, entry)

            def call(inputs, dims, states):
                args = {state_ident(n): states[n] for n in graph.states}
                return fn(*inputs, *[dims[k] for k in graph.dim_inputs], **args)

            return call

        return {e: method(e) for e in self.graphs}

    def run(self, entry, inputs, dims, state):
        for name in self.graphs[entry].states:  # each part to its layer's device, once
            if state[name].device != self.state_device[name]:
                state[name] = state[name].to(self.state_device[name])
        return self.methods[entry](inputs, dims, state)
