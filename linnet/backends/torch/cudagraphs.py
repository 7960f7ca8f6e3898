"""CUDA graphs: decode captured once and replayed.

A capture must not bake host values in, so the `torch.cudagraphs` pipeline
(`linnet/ir/pipeline.py`) rewrites the decode graph with `device_positions`
(`linnet/ir/device_positions.py`): the position becomes a tensor input, and guards
on it move to the host. The result is checked on any machine (`capture_plan`), and
replayed where CUDA exists.
"""

from __future__ import annotations

import torch

from linnet.errors import LinnetError
from linnet.ir.graph import Graph
from linnet.ir.pipeline import run_pipeline
from linnet.ir.program import Program


def capture_plan(graph: Graph) -> Graph:
    """The decode graph a capture replays (the `torch.cudagraphs` pipeline): verified and
    free of host positions."""
    return run_pipeline(graph, "torch.cudagraphs").graph


class CudaGraphRunner:
    """Prefill runs eagerly (generated code); each one-token decode step replays a
    CUDA graph captured on first use, with tokens and positions in static buffers."""

    def __init__(self, program: Program, params, device, numerics):
        device = torch.device(device)
        if device.type != "cuda":
            raise LinnetError(
                f"mode='cudagraphs' captures decode on a CUDA device; this model "
                f"is on {device.type}. Use mode='compile' or 'generated' here"
            )
        if not torch.cuda.is_available():
            raise LinnetError("mode='cudagraphs' needs CUDA, and torch sees no CUDA device")
        from linnet.backends.torch.codegen import generate_graphs
        from linnet.backends.torch.runners import GeneratedRunner, load_generated

        self.eager = GeneratedRunner(program, params, device, numerics)
        self.inputs, self.state_types = self.eager.inputs, self.eager.state_types
        decode = capture_plan(program.graphs["decode"])
        text = generate_graphs(program, {"decode": decode}, numerics)
        module = load_generated(text, program.name)()
        names = module.state_dict().keys()
        module.load_state_dict({k: params[k] for k in names}, assign=True)
        self.static = module.to(device).eval()
        self.max_positions = program.config["max_positions"]
        self.graph = None
        self.bound: dict = {}  # state name -> the address the graph was captured over

    def run(self, entry, inputs, dims, state):
        if entry == "decode" and inputs[0].shape[1] == 1:
            return self.decode(inputs[0], dims["at"], state)
        return self.eager.run(entry, inputs, dims, state)  # prefill and other entries

    def decode(self, ids, pos, state):
        if pos + 1 > self.max_positions:
            raise LinnetError(
                f"decode at position {pos} is past max_positions {self.max_positions}"
            )
        if self.graph is None or self.tokens.shape != ids.shape or self.bound != _ptrs(state):
            self._capture(ids, pos, state)
        self.tokens.copy_(ids)
        self.positions.fill_(pos)
        self.graph.replay()
        return self.out.clone()  # the next replay overwrites self.out

    def _capture(self, ids, pos, state):
        """Capture one decode step over these state tensors. The graph reads and writes
        them by address: a new cache (`reset()`, another batch) needs a new capture."""
        self.tokens = ids.clone()
        # The warm-up really runs: at `pos` it writes the cache slot the replay will
        # write with the same values (at 0 it would overwrite the prompt's first token).
        self.positions = torch.full((1,), pos, dtype=torch.int64, device=ids.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up outside the capture
            self.static.decode(self.tokens, self.positions, **state)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.static.decode(self.tokens, self.positions, **state)
        self.bound = _ptrs(state)


def _ptrs(state) -> dict:
    return {name: t.data_ptr() for name, t in state.items()}
