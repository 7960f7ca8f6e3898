"""Generated methods that call one method per layer kind (issue 21).

    text = generate_graphs(program, graphs, numerics, fused, emitter=emit_outlined)

An entry whose layers `linnet.ir.outline` can cut becomes an outer method (the nodes
before the layers, one call per layer, the nodes after) and one method per layer kind,
`_<entry>_layer<k>(self, x0, x1, …, <dims>, p_<param>, …)`: the layer's outside values,
the dims its inputs' shapes do not give, and its own params. `mode="compile"` compiles
those methods alone, so compile time does not grow with depth: a 30-layer decoder
compiles one layer, not thirty. An entry without repeated layers is written whole.
"""

from __future__ import annotations

import keyword

from linnet.backends.torch.codegen import (
    del_line,
    emit_method,
    emit_node_lines,
    method_head,
    method_tail,
    shape_bindings,
)
from linnet.backends.torch.emit import Spell
from linnet.ir.graph import Graph, Node
from linnet.ir.outline import Outline, Region, outline
from linnet.ir.passes import WRITE_OPS, dying_values


def layer_method(entry: str, kind: int) -> str:
    return f"_{entry}_layer{kind}"


def emit_outlined(graph: Graph, spell: Spell, entry: str) -> list[str]:
    """The entry as an outer method and one method per layer kind; written whole when its
    layers do not cut (see `linnet.ir.outline`)."""
    cut = outline(graph)
    if cut is None:
        return emit_method(graph, spell, entry)
    atoms = _method_atoms(graph)
    lines, names, idents = method_head(graph, entry)
    lines += _outer_body(graph, entry, cut, spell, names, idents, atoms)
    lines += method_tail(graph, names)
    for kind, region in cut.kinds.items():
        lines += [""] + _layer_lines(region, spell, layer_method(entry, kind), atoms)
    return lines


def _method_atoms(graph: Graph) -> list[str]:
    """The dims the entry binds: from its inputs' shapes, then its dim arguments."""
    atoms = shape_bindings([(v.name, v) for v in graph.inputs])[1]
    return atoms + [a for a in graph.dim_inputs.values() if a not in atoms]


def _shape_bindings(region: Region, atoms: list[str]) -> tuple[list[str], list[str]]:
    """Lines binding the dims that the layer's inputs' shapes give (`4 * H` too, as the
    entry binds it), and the dims left to pass."""
    values = [(f"x{j}", v) for j, v in enumerate(region.inputs)]
    lines, bound = shape_bindings(values, wanted=set(atoms))
    return lines, [a for a in atoms if a not in bound]


def _param_ident(name: str) -> str:
    ident = "p_" + name.replace(".", "_")
    return ident + "_" if keyword.iskeyword(ident) else ident


def _layer_lines(region: Region, spell: Spell, method: str, atoms: list[str]) -> list[str]:
    """One layer kind as a method, written from its first layer's nodes."""
    bindings, dim_args = _shape_bindings(region, atoms)
    params = {v: _param_ident(n) for n, v in region.params.items()}
    args = [f"x{j}" for j in range(len(region.inputs))] + dim_args + list(params.values())
    lines = [f"    def {method}({', '.join(['self'] + args)}):"]
    lines.append(f'        """Layer {region.layer} and every layer of its shape."""')
    lines += bindings
    first = "x0" if region.inputs else next(iter(params.values()))
    lines.append(f"        _dev = {first}.device")
    names = {v: f"x{j}" for j, v in enumerate(region.inputs)}
    names.update(params)
    idents = set(names.values())  # a state part is an input: writes land in it
    sub = Graph(method, nodes=region.nodes, outputs=region.outputs)
    temps: set = set()
    dying = dying_values(sub)
    for index, node in enumerate(region.nodes):
        lines += emit_node_lines(node, spell, names, idents, temps, inplace=True)
        lines += del_line(dying.get(index, []), names, temps)
    lines.append(f"        return {', '.join(names[v] for v in region.outputs)}")
    return lines


def _outer_steps(cut: Outline) -> list[Node]:
    """The outer method's steps as nodes: its own nodes, and for each layer a `call` node
    (reading the layer's inputs, giving its first output; one more per further output),
    so `dying_values` frees what the calls return."""
    steps = list(cut.before)
    for region in cut.regions:
        outs = region.outputs or [None]
        steps.append(Node("call", list(region.inputs), {"region": region}, outs[0]))
        steps += [Node("call", [], {"region": None}, v) for v in outs[1:]]
    return steps + list(cut.after)


def _outer_body(graph, entry, cut: Outline, spell, names, idents, atoms) -> list[str]:
    steps = _outer_steps(cut)
    dying = dying_values(Graph(graph.name, nodes=steps, outputs=graph.outputs))
    lines: list[str] = []
    temps: set = set()
    for index, node in enumerate(steps):
        if node.op != "call":
            lines += emit_node_lines(node, spell, names, idents, temps, inplace=True)
        elif node.attrs["region"] is not None:
            lines += _call_lines(node.attrs["region"], entry, names, temps, atoms)
        lines += del_line(dying.get(index, []), names, temps)
    return lines


def _call_lines(region: Region, entry: str, names: dict, temps: set, atoms) -> list[str]:
    """`t1, … = self._<entry>_layer<k>(…)`; the layer's in-place state writes take the
    name of the state they write."""
    _, dim_args = _shape_bindings(region, atoms)
    args = [names[v] for v in region.inputs] + dim_args
    args += [names[v] for v in region.params.values()]
    for node in region.nodes:
        if node.op in WRITE_OPS:
            names[node.output] = names.get(node.inputs[0], "")
    outs = []
    for v in region.outputs:
        names[v] = f"t{v.id}"
        temps.add(names[v])
        outs.append(names[v])
    call = f"self.{layer_method(entry, region.kind)}({', '.join(args)})"
    return [f"        {', '.join(outs)} = {call}" if outs else f"        {call}"]
