"""CUDA graphs: decode captured once and replayed.

A capture must not bake host values in, so `device_positions` rewrites the
decode graph: the position becomes a tensor input (`positions`, i64[S]); cache
writes become `update_rows` at those positions; attention reads the whole
cache (the causal mask hides rows past the query, so this is exact); rope
gathers its table rows; guards on the position move to the host. The result
is checked on any machine (`capture_plan`), and replayed where CUDA exists.
"""

from __future__ import annotations

import torch

from linnet.core.dims import Poly
from linnet.errors import LinnetError
from linnet.ir.graph import Graph, GraphBuilder
from linnet.ir.passes import _copy_frame, _finish, dedupe_guards, verify
from linnet.ir.positions import cache_reads_to_widen, mentions, widen
from linnet.ir.types import TensorType


def device_positions(graph: Graph, atom: str = "P") -> Graph:
    """The decode graph with the position as a device tensor; no attr mentions `atom`."""
    out, mapping = _copy_frame(graph)
    seq = graph.inputs[0].type.shape[1]
    positions = out.input("positions", TensorType("i64", (seq,)))
    out.dim_inputs = {k: v for k, v in graph.dim_inputs.items() if v != atom}
    b = GraphBuilder(out)
    full_reads = cache_reads_to_widen(graph, atom)
    widened: dict = {}  # value -> (old extent, new extent) along its widened axis
    for node in graph.nodes:
        ins = [mapping[v] for v in node.inputs]
        attrs = dict(node.attrs)
        if node.op == "guard" and mentions((attrs["lhs"], attrs["rhs"]), atom):
            continue  # the runner checks the position on the host before replay
        if node.op == "update_slice" and mentions(attrs["starts"], atom):
            axis = [i for i, s in enumerate(attrs["starts"]) if mentions(s, atom)][0]
            starts = tuple(Poly.const(0) if i == axis else s for i, s in enumerate(attrs["starts"]))
            result = b.add(
                "update_rows",
                [ins[0], ins[1], positions],
                axis=axis,
                starts=starts,
                where=node.where,
            )
        elif widen(node, attrs, full_reads, widened):
            result = b.add(node.op, ins, where=node.where, **attrs)
        elif node.op == "slice" and _rows_at_positions(node, atom, seq):
            result = b.add("take", [ins[0], positions])  # e.g. learned positions wpe[P : P + S]
        elif node.op == "rope" and mentions(attrs["offset"], atom):
            result = b.add("rope", ins + [positions], **dict(attrs, offset=Poly.const(0)))
        elif node.op == "attention" and mentions(attrs["q_offset"], atom):
            result = b.add("attention", ins + [positions], **dict(attrs, q_offset=Poly.const(0)))
        else:
            if any(mentions(v, atom) for v in attrs.values()):
                raise LinnetError(
                    f"{node.where}: `{node.op}` uses the host position {atom}; "
                    "it cannot be captured in a CUDA graph"
                )
            result = b.add(node.op, ins, where=node.where, **attrs)
        if node.output is not None:
            mapping[node.output] = result
    return _finish(graph, out, mapping)


def _rows_at_positions(node, atom: str, seq: Poly) -> bool:
    """A slice `x[P : P + S, :, ...]` (rows at the current positions, full elsewhere)."""
    starts, stops, shape = node.attrs["starts"], node.attrs["stops"], node.inputs[0].type.shape
    if not mentions(starts[0], atom) or Poly.lift(stops[0]) - Poly.lift(starts[0]) != seq:
        return False
    return all(
        Poly.lift(lo) == Poly.const(0) and Poly.lift(hi) == d
        for lo, hi, d in zip(starts[1:], stops[1:], shape[1:])
    )


def capture_plan(graph: Graph, atom: str = "P") -> Graph:
    """The decode graph a capture replays; verified and free of host positions."""
    static = device_positions(dedupe_guards(graph), atom)
    verify(static)
    leaks = [n for n in static.nodes if any(mentions(v, atom) for v in n.attrs.values())]
    if leaks or atom in static.dim_inputs.values():
        raise LinnetError(f"the capture plan still holds the host position {atom}: {leaks}")
    return static


class CudaGraphRunner:
    """Prefill runs eagerly (generated code); each one-token decode step replays a
    CUDA graph captured on first use, with tokens and positions in static buffers."""

    def __init__(self, source, config, params, device, numerics):
        device = torch.device(device)
        if device.type != "cuda":
            raise LinnetError(
                f"mode='cudagraphs' captures decode on a CUDA device; this model "
                f"is on {device.type}. Use mode='compile' or 'generated' here"
            )
        if not torch.cuda.is_available():
            raise LinnetError("mode='cudagraphs' needs CUDA, and torch sees no CUDA device")
        from linnet.backends.torch_codegen import generate_graphs
        from linnet.backends.torch_runners import GeneratedRunner, load_generated

        self.eager = GeneratedRunner(source, config, params, device, numerics)
        self.inputs, self.state_types = self.eager.inputs, self.eager.state_types
        decode = capture_plan(source.lower(config, "decode"))
        text = generate_graphs(source, config, {"decode": decode}, numerics)
        module = load_generated(text, source.name)()
        names = module.state_dict().keys()
        module.load_state_dict({k: params[k] for k in names}, assign=True)
        self.static = module.to(device).eval()
        self.max_positions = config["max_positions"]
        self.graph = None

    def run(self, entry, inputs, dims, state):
        if entry == "decode" and inputs[0].shape[1] == 1:
            return self.decode(inputs[0], dims["at"], state)
        return self.eager.run(entry, inputs, dims, state)  # prefill and other entries

    def decode(self, ids, pos, state):
        if pos + 1 > self.max_positions:
            raise LinnetError(
                f"decode at position {pos} is past max_positions {self.max_positions}"
            )
        if self.graph is None or self.tokens.shape != ids.shape:
            self._capture(ids, state)
        self.tokens.copy_(ids)
        self.positions.fill_(pos)
        self.graph.replay()
        return self.out

    def _capture(self, ids, state):
        self.tokens = ids.clone()
        self.positions = torch.zeros(1, dtype=torch.int64, device=ids.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up outside the capture
            self.static.decode(self.tokens, self.positions, **state)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.static.decode(self.tokens, self.positions, **state)
