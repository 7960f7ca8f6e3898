"""Core IR to an ONNX model, one entry point per model.

    entry = prepare(program, "decode")     # the `onnx` pipeline: states split, decomposed
    model = to_model(entry, initializers)          # onnx.ModelProto

Inputs keep the source's names (`tokens`), a dim argument (`at`) is an int64
scalar input, each state part the entry reads is an input (`kv.3.1`) and each it
changes an output (`kv.3.1.next`): Whisper's `encode` only writes its `cross` parts and
`decode` only reads them, so no whole cache passes through. The entry's result is
`output`. Shapes carry the runtime dims by name (`B`, `S`), so onnxruntime serves every
batch, length and position with one model. Params are initializers whose data
`initializers` places (the exporter puts them in one external file that every entry's
model shares).
`require`s and table bounds become host-side guards (`Entry.guards`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onnx import TensorProto, helper

from linnet.backends.onnx.emit import (
    IR_VERSION,
    ONNX_DTYPES,
    OPSET,
    OnnxBuilder,
    emit,
    partial_axes,
)
from linnet.core.dims import Poly
from linnet.ir.graph import Graph, Node
from linnet.ir.passes import WRITE_OPS
from linnet.ir.pipeline import run_pipeline
from linnet.ir.program import Program

OUTPUT = "output"
NEXT = ".next"  # a state part's output is its input's name plus this


@dataclass
class Entry:
    name: str
    graph: Graph
    guards: list[Node] = field(default_factory=list)
    state_parts: dict[str, list[str]] = field(default_factory=dict)  # state -> part inputs


def prepare(program: Program, entry: str) -> Entry:
    """One entry through the `onnx` pipeline: the state split per layer, and what ONNX
    has no op for decomposed."""
    ready = run_pipeline(program.graphs[entry], "onnx")
    graph, parts = ready.graph, ready.notes["split_states"]
    guards = [n for n in graph.nodes if n.op == "guard"]
    return Entry(entry, graph, guards, parts)


def state_io(graph: Graph) -> tuple[list[str], list[str]]:
    """The state parts the entry reads (its inputs) and those it changes (its outputs). A
    write of the whole part (Whisper's `encode` filling `cross`) does not read it."""
    used = {v for node in graph.nodes if not _overwrites(node) for v in node.inputs}
    used |= {node.inputs[1] for node in graph.nodes if _overwrites(node)}
    reads = [name for name, v in graph.states.items() if v in used]
    writes = [n for n, v in graph.state_outputs.items() if v is not graph.states.get(n)]
    return reads, writes


def _overwrites(node: Node) -> bool:
    """An `update_slice` whose box is its whole input (the ONNX emitter drops the input)."""
    if node.op != "update_slice":
        return False
    x, update = node.inputs
    return not partial_axes(x.type.shape, node.attrs["starts"], update.type.shape)


def dim_sources(graph: Graph) -> dict[str, tuple]:
    """Where each runtime dim can be read: an input's axis (and the k it is divided by, for
    an axis of k * D), or a scalar dim input."""
    sources: dict[str, tuple[str, int | None]] = {}
    for arg, atom in graph.dim_inputs.items():
        sources[atom] = (arg, None)
    read = [(name, graph.states[name]) for name in state_io(graph)[0]]
    for name, value in [(v.name, v) for v in graph.inputs] + read:
        for axis, d in enumerate(value.type.shape):
            scaled = Poly.lift(d).as_scaled_atom()  # D, or k * D: D = the axis' size / k
            if scaled is not None:
                sources.setdefault(
                    scaled[0], (name, axis) + ((scaled[1],) if scaled[1] > 1 else ())
                )
    return sources


def value_info(name: str, t) -> TensorProto:
    shape = [d.value if d.is_const else (d.as_atom() or str(d)) for d in map(Poly.lift, t.shape)]
    return helper.make_tensor_value_info(name, ONNX_DTYPES[t.dtype], shape)


def to_model(entry: Entry, initializers: list[TensorProto], tied: dict[str, str]):
    """The ONNX model of one entry. `initializers` hold the params' data (or point to it);
    `tied` maps a param to the param whose initializer it shares."""
    g = entry.graph
    b = OnnxBuilder(dim_sources(g))
    names: dict = {}
    for v in g.inputs:
        names[v] = v.name
    for name, v in g.params.items():
        names[v] = tied.get(name, name)
    for name, v in g.states.items():
        names[v] = name
    for node in g.nodes:
        result = emit(node, b, [names[v] for v in node.inputs])
        if node.output is not None:
            names[node.output] = result
    inputs = [value_info(v.name, v.type) for v in g.inputs]
    inputs += [helper.make_tensor_value_info(arg, TensorProto.INT64, []) for arg in g.dim_inputs]
    reads, writes = state_io(g)
    inputs += [value_info(name, g.states[name].type) for name in reads]
    outputs = []
    for i, v in enumerate(g.outputs):
        outputs.append(_named_output(b, names[v], OUTPUT if i == 0 else f"{OUTPUT}{i}", v))
    for name in writes:
        v = g.state_outputs[name]
        outputs.append(_named_output(b, names[v], name + NEXT, v))
    used = {i for n in b.nodes for i in n.input}
    params = [t for t in initializers if t.name in used]
    graph = helper.make_graph(
        b.nodes,
        entry.name,
        inputs,
        outputs,
        initializer=b.constants + params,
        value_info=_inner_shapes(g, b, names),
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="linnet",
        ir_version=IR_VERSION,
    )
    return model


def _inner_shapes(g: Graph, b: OnnxBuilder, names: dict) -> list:
    """Each node result's type with its runtime dims named (`B`, `2*H`), as the inputs'
    are. ONNX shape inference loses a symbolic dim at a Conv or a Reshape to a computed
    shape; with the names onnxruntime still proves two tensors the same shape, which its
    NCHWc rewrite needs to fold a resnet's residual Add into the convolution before it
    (the "Sum" fusion: without it, a separate Add between reshapes)."""
    made = {o for n in b.nodes for o in n.output} - b.output_names
    infos, seen = [], set()
    for node in g.nodes:
        name = names.get(node.output) if node.output is not None else None
        if name in made and name not in seen:
            seen.add(name)
            infos.append(value_info(name, node.output.type))
    return infos


def _named_output(b: OnnxBuilder, value: str, name: str, v) -> TensorProto:
    """Give `value` the output's name: rename the node that makes it (an Identity would
    copy, a whole cache at every step), or add an Identity for inputs and shared values."""
    makers = [n for n in b.nodes if value in n.output]
    if makers and value not in b.renamed and value not in b.output_names:
        for node in b.nodes:
            node.input[:] = [name if i == value else i for i in node.input]
        makers[0].output[:] = [name if o == value else o for o in makers[0].output]
        b.renamed[value] = name
    else:
        value = b.renamed.get(value, value)
        b.nodes.append(helper.make_node("Identity", [value], [name], name=f"{name}_out"))
    b.output_names.add(name)
    return value_info(name, v.type)


# -- dims and guards as JSON (the loader evaluates them without the source) --------------
def guard_json(node: Node) -> dict:
    a = node.attrs
    return {
        "lhs": Poly.lift(a["lhs"]).to_terms(),
        "rhs": Poly.lift(a["rhs"]).to_terms(),
        "message": a["message"],
        "where": node.where,
    }


def signature(entry: Entry) -> dict:
    """What a runner needs to call the model: inputs, dims, state parts (those it reads
    and those it writes), guards."""
    g = entry.graph
    reads, writes = state_io(g)

    def spec(t):
        return {"dtype": t.dtype, "shape": [Poly.lift(d).to_terms() for d in t.shape]}

    return {
        "inputs": {v.name: spec(v.type) for v in g.inputs},
        "dims": dict(g.dim_inputs),
        "states": {name: spec(v.type) for name, v in g.states.items()},
        "reads": reads,
        "writes": writes,
        "outputs": [OUTPUT if i == 0 else f"{OUTPUT}{i}" for i in range(len(g.outputs))],
        "guards": [guard_json(n) for n in entry.guards],
        "inplace": inplace_parts(g),
    }


def inplace_parts(graph: Graph) -> list[str]:
    """State parts whose only use is one row write (emitted as ScatterElements): nothing
    reads the old rows afterwards, so the runner may bind the output to the input's
    buffer and onnxruntime writes the new rows in place."""
    uses: dict = {}
    for node in graph.nodes:
        for v in node.inputs:
            uses.setdefault(v, []).append(node)
    safe = []
    for name, v in graph.states.items():
        users = uses.get(v, [])
        if len(users) == 1 and users[0].op in WRITE_OPS and users[0].inputs[0] is v:
            node = users[0]
            shape, sizes = v.type.shape, node.inputs[1].type.shape
            if len(partial_axes(shape, node.attrs["starts"], sizes)) == 1:
                safe.append(name)
    return safe
