"""The placement pass: a lowered graph with its device moves as Core-IR ops (issue 19).

    placed = place_graph(graph, placement)      # placement: linnet/shard/placement.py

Each node runs on the device of its layer: the layer of the params it reads, else the
layer of the node before it (the embedding, before any layer, on the first device; the
final norm and head with the last layer). A value used on another device than the one it
lives on is moved there once (`to_device`), just before its first use there: the
activations at a layer boundary, the positions or a mask made on the first device. A state
lives on the device of its first use, so each layer's KV cache sits with its layer and is
written in place there. A param outside the layers used on two devices (an embedding tied
to the head) gets a copy per device (`embed__on1`, see `replicas`), held, not moved per
call. A streamed layer's weights are copied in from host memory at the start of the layer
before (`to_device(prefetch=True)`) and awaited just before the layer (`await_copy`), so
the copy overlaps the layer before. Entry outputs are moved back to the first device.
`check_placement` then checks every node's inputs lie on its device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from linnet.ir.graph import Graph, GraphBuilder
from linnet.ir.passes import WRITE_OPS, copy_frame, finish, verify
from linnet.shard.placement import Placement, PlacementError, layer_of

HOST = -1  # the device index of weights held in host memory


def replica_name(param: str, device: int) -> str:
    return f"{param}__on{device}"


def node_layers(graph: Graph, container: str | None) -> list[int | None]:
    """Each node's layer (None: before the first layer)."""
    names = {v: n for n, v in graph.params.items()}
    current, out = None, []
    for node in graph.nodes:
        found = [layer_of(names[v], container) for v in node.inputs if v in names]
        found = [i for i in found if i is not None]
        current = found[0] if found else current
        out.append(current)
    return out


@dataclass
class Placed:
    """A placed graph; where its params, replicas and states live (device indices)."""

    graph: Graph
    param_device: dict[str, int] = field(default_factory=dict)  # HOST: streamed
    replicas: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (of, dev)
    state_device: dict[str, int] = field(default_factory=dict)
    value_device: dict = field(default_factory=dict)  # value -> device index (None: any)
    node_device: list = field(default_factory=list)


def place_graph(graph: Graph, placement: Placement) -> Placed:
    placed = _Placer(graph, placement).run()
    check_placement(placed)
    verify(placed.graph)
    return placed


def check_placement(placed: Placed) -> None:
    """Every node's inputs on the node's device (a move's input: anywhere)."""
    for node, device in zip(placed.graph.nodes, placed.node_device, strict=True):
        if node.op == "to_device":
            continue
        for v in node.inputs:
            have = placed.value_device.get(v)
            if have is not None and have != device:
                raise PlacementError(
                    f"{node.op} on device {device} reads {v} on device {have}: a move is missing"
                )


class _Placer:
    def __init__(self, graph: Graph, placement: Placement) -> None:
        self.graph, self.p = graph, placement
        self.layers = node_layers(graph, placement.container)
        self.param_names = {v: n for n, v in graph.params.items()}
        out, self.mapping = copy_frame(graph)
        self.b = GraphBuilder(out)
        self.placed = Placed(out)
        self.moved: dict = {}  # (value, device) -> its copy there
        self.fetched: dict = {}  # a streamed param (old value) -> its awaited copy
        self.devices = self._node_devices()

    def _layer_device(self, layer: int | None) -> int:
        return 0 if layer is None else self.p.layer_device[layer]

    def _node_devices(self) -> list[int]:
        """Each node's device: its layer's; a state write's, its state's (the state lives
        on the device of its first use)."""
        devices, home, version_of = [], {}, {v: n for n, v in self.graph.states.items()}
        for node, layer in zip(self.graph.nodes, self.layers, strict=True):
            device = self._layer_device(layer)
            for v in node.inputs:
                if v in version_of:
                    home.setdefault(version_of[v], device)
            if node.op in WRITE_OPS and node.inputs[0] in version_of:
                device = home[version_of[node.inputs[0]]]
                version_of[node.output] = version_of[node.inputs[0]]
            devices.append(device)
        self.placed.state_device = home
        return devices

    def _frame_devices(self) -> None:
        vd, pd = self.placed.value_device, self.placed.param_device
        for v in self.graph.inputs:
            vd[self.mapping[v]] = 0
        for name, v in self.graph.states.items():
            vd[self.mapping[v]] = self.placed.state_device.get(name, 0)
        first_use: dict = {}
        for node, device in zip(self.graph.nodes, self.devices, strict=True):
            for v in node.inputs:
                first_use.setdefault(v, device)
        for name, v in self.graph.params.items():
            layer = layer_of(name, self.p.container)
            if v not in first_use:  # declared, never read (the parts of a stacked weight)
                continue
            if layer is None:
                pd[name] = first_use.get(v, 0)
            else:
                pd[name] = HOST if layer in self.p.streamed else self._layer_device(layer)
            vd[self.mapping[v]] = pd[name]

    def _add(self, op: str, ins: list, on: int, out_on, **attrs):
        """A node run on device `on` whose result lives on `out_on`."""
        out = self.b.add(op, ins, **attrs)
        self.placed.node_device.append(on)
        if out is not None:
            self.placed.value_device[out] = out_on
        return out

    def _on(self, v, device: int):
        """Old value `v` as node inputs on `device` take it."""
        new = self.fetched.get(v) or self.mapping[v]
        have = self.placed.value_device.get(new)
        if have is None or have == device:
            return new
        name = self.param_names.get(v)
        if name is not None and have != HOST:  # a param used on two devices: a copy each
            replica = replica_name(name, device)
            if replica not in self.placed.graph.params:
                self.placed.value_device[self.placed.graph.param(replica, new.type)] = device
                self.placed.replicas[replica] = (name, device)
                self.placed.param_device[replica] = device
            return self.placed.graph.params[replica]
        key = (new, device)
        if key not in self.moved:
            target = self.p.devices[device]
            self.moved[key] = self._add("to_device", [new], device, device, device=target)
        return self.moved[key]

    def _schedule(self) -> tuple[dict, dict]:
        """node index -> streamed layers whose copies start there (the first node of the
        layer before, or of the entry), and -> layers awaited there (their first node)."""
        first: dict[int, int] = {}
        for index, layer in enumerate(self.layers):
            if layer is not None:
                first.setdefault(layer, index)
        order = sorted(first)
        start: dict[int, list] = {}
        wait: dict[int, list] = {}
        for n, layer in enumerate(order):
            if layer in self.p.streamed:
                start.setdefault(first[order[n - 1]] if n else 0, []).append(layer)
                wait.setdefault(first[layer], []).append(layer)
        return start, wait

    def _layer_params(self, layer: int) -> list:
        used = {v for node in self.graph.nodes for v in node.inputs}
        return [
            v
            for name, v in self.graph.params.items()
            if v in used and layer_of(name, self.p.container) == layer
        ]

    def _prefetch(self, layer: int, inflight: dict) -> None:
        device = self._layer_device(layer)
        for v in self._layer_params(layer):
            inflight[v] = self._add(
                "to_device", [self.mapping[v]], device, device,
                device=self.p.devices[device], prefetch=True,
            )  # fmt: skip

    def _await(self, layer: int, inflight: dict) -> None:
        device = self._layer_device(layer)
        for v in self._layer_params(layer):
            self.fetched[v] = self._add("await_copy", [inflight.pop(v)], device, device)

    def run(self) -> Placed:
        self._frame_devices()
        start, wait = self._schedule()
        inflight: dict = {}
        for index, node in enumerate(self.graph.nodes):
            for layer in start.get(index, []):
                self._prefetch(layer, inflight)
            for layer in wait.get(index, []):
                self._await(layer, inflight)
            device = self.devices[index]
            ins = [self._on(v, device) for v in node.inputs]
            made_here = node.op in ("const", "iota") or not node.inputs  # on `_dev`: the first
            result = self._add(
                node.op, ins, device, 0 if made_here else device, where=node.where, **node.attrs
            )
            if node.output is not None:
                self.mapping[node.output] = result
        out = finish(self.graph, self.placed.graph, self.mapping)
        out.outputs = [self._on(v, 0) for v in self.graph.outputs]
        return self.placed
