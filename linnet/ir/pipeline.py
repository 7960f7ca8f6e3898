"""Each backend's IR passes, as data, and the one function that runs them.

    ready = run_pipeline(graph, "onnx")       # a lowered entry, rewritten for ONNX
    ready.graph, ready.notes["split_states"]  # the graph, and what its passes reported

A pipeline is a tuple of named passes. A pass rewrites a graph, and may report
something the backend needs beside it (the host guards `runtime_position` took
out, the parts `split_states` made, the params `fuse_linears` stacked): those
land in `notes` under the pass's name. `verify` runs after every pass, so a
rewrite that breaks a type is named where it happens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from linnet.ir.device_positions import device_positions
from linnet.ir.fusion import fuse_linears
from linnet.ir.graph import Graph
from linnet.ir.passes import VerifyError, decompose, dedupe_guards, verify
from linnet.ir.runtime_position import runtime_position
from linnet.ir.state_split import split_states

# Library ops ONNX has a native op for; its pipeline decomposes the others.
ONNX_NATIVE_OPS = frozenset(
    {"linear", "layer_norm", "softmax", "silu", "gelu", "conv", "max_pool", "batch_norm"}
    | {"attention", "moe", "conv1d"}
    | {"group_norm", "upsample_nearest", "resize_bilinear"}  # InstanceNormalization, Resize
    | {"conv_transpose"}  # ConvTranspose (issue 15, SAM)
)
# The mixture of experts stays whole on every backend: its decomposition is dense (every
# expert on every token), a reference for tests; the emitters read only the chosen experts.
KEEP_NATIVE = frozenset({"moe"})


@dataclass(frozen=True)
class Pass:
    """A named rewrite: Graph -> Graph, or Graph -> (Graph, note)."""

    name: str
    rewrite: Callable
    reports: bool = False  # the rewrite returns (graph, note)


@dataclass
class Ready:
    """An entry after its pipeline: the graph, and each reporting pass's note."""

    graph: Graph
    notes: dict = field(default_factory=dict)


DEDUPE_GUARDS = Pass("dedupe_guards", dedupe_guards)
DECOMPOSE = Pass("decompose", partial(decompose, keep=KEEP_NATIVE))
DECOMPOSE_ALL = Pass("decompose", decompose)
DECOMPOSE_FOR_ONNX = Pass("decompose", partial(decompose, keep=ONNX_NATIVE_OPS))
FUSE_LINEARS = Pass("fuse_linears", fuse_linears, reports=True)
SPLIT_STATES = Pass("split_states", split_states, reports=True)
DEVICE_POSITIONS = Pass("device_positions", device_positions)
RUNTIME_POSITION = Pass("runtime_position", runtime_position, reports=True)

PIPELINES: dict[str, tuple[Pass, ...]] = {
    # the interpreter runs the reference decompositions, op for op
    "torch.interpret": (DEDUPE_GUARDS, DECOMPOSE),
    # generated code calls library ops by name (`linnet torch` prints this)
    "torch.generated": (DEDUPE_GUARDS,),
    # generated/compile runners: linears that share an input run as one
    "torch.fused": (DEDUPE_GUARDS, FUSE_LINEARS),
    # the decode a CUDA graph captures: the position as a device tensor
    "torch.cudagraphs": (DEDUPE_GUARDS, DEVICE_POSITIONS),
    # XLA: static shapes, the position a traced scalar, guards on the host
    "jax": (DEDUPE_GUARDS, RUNTIME_POSITION),
    "jax.decomposed": (DEDUPE_GUARDS, RUNTIME_POSITION, DECOMPOSE_ALL),
    # ONNX: the state split per layer, library ops without a native op decomposed
    "onnx": (DEDUPE_GUARDS, SPLIT_STATES, DECOMPOSE_FOR_ONNX),
}


def run_pipeline(graph: Graph, pipeline: str | tuple[Pass, ...]) -> Ready:
    """`graph` through a pipeline (a name in `PIPELINES`, or passes), verified after
    every pass."""
    passes = PIPELINES[pipeline] if isinstance(pipeline, str) else pipeline
    ready = Ready(graph)
    for step in passes:
        result = step.rewrite(ready.graph)
        if step.reports:
            ready.graph, ready.notes[step.name] = result
        else:
            ready.graph = result
        try:
            verify(ready.graph)
        except VerifyError as err:
            raise VerifyError(f"after {step.name} on `{graph.name}`: {err}") from None
    return ready


def run_pipelines(graphs: dict[str, Graph], pipeline: str) -> dict[str, Ready]:
    """Every entry of a program through the same pipeline."""
    return {entry: run_pipeline(graph, pipeline) for entry, graph in graphs.items()}
