"""Where each layer's weights live: layers split across devices (a pipeline for batch 1)
and a device budget beyond which layers stay in host memory (issue 19).

    placement = plan_placement(param_bytes, ["cuda:0", "cuda:1"], max_device_bytes=8 << 30)
    print(placement.describe())

Layers are the params under one container with an index (`layers.3.wq`): the container
holding the most bytes. Layer ranges go to the devices in order, split so each device
holds about the same bytes of layers (or `split`: layer counts per device). The params
outside the layers go to the device of their first use (the embedding to the first, the
final norm and head to the last; `linnet/shard/place.py`). With a budget, a device keeps
its fixed params, room for two streamed layers (the one running and the one being copied
in) and then whole layers in order while they fit; the others stream from host memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from linnet.shard.layout import ShardingError

_LAYER = re.compile(r"^(.*?)\.(\d+)\.")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40})


class PlacementError(ShardingError):
    """Devices, a split or a budget the model cannot be placed with."""


def parse_bytes(text: str | int) -> int:
    """`8GiB`, `512MB`, `1e9` or an int: a byte count."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m and m.group(2).upper()
    if not m or unit not in _UNITS:
        raise PlacementError(f"{text!r} is not a size: write e.g. 8GiB, 512MB or 1000000")
    return int(float(m.group(1)) * _UNITS[unit])


def layer_of(name: str, container: str | None) -> int | None:
    """The layer index of param `name` under `container` (None: not a layer param)."""
    m = _LAYER.match(name)
    return int(m.group(2)) if m and m.group(1) == container else None


def layer_container(param_bytes: dict[str, int]) -> str | None:
    """The indexed container holding the most bytes (`layers`), or None."""
    sizes: dict[str, int] = {}
    for name, size in param_bytes.items():
        m = _LAYER.match(name)
        if m:
            sizes[m.group(1)] = sizes.get(m.group(1), 0) + size
    return max(sizes, key=sizes.get) if sizes else None


@dataclass
class Placement:
    devices: list[str]
    container: str | None
    layer_device: dict[int, int]  # layer -> index into devices
    streamed: set[int]  # layers whose weights stay in host memory
    layer_bytes: dict[int, int]
    fixed_bytes: int  # params outside the layers
    max_device_bytes: int | None = None

    def device_of(self, layer: int) -> str:
        return self.devices[self.layer_device[layer]]

    def ranges(self) -> list[tuple[int, list[int]]]:
        """(device index, its layers in order) for each device."""
        return [
            (k, [i for i in sorted(self.layer_device) if self.layer_device[i] == k])
            for k in range(len(self.devices))
        ]

    def describe(self) -> str:
        """One line per device: its layers, resident and streamed, and their bytes."""
        lines = [f"placement over {', '.join(self.devices)} ({len(self.layer_device)} layers):"]
        for k, layers in self.ranges():
            resident = [i for i in layers if i not in self.streamed]
            streamed = [i for i in layers if i in self.streamed]
            held = sum(self.layer_bytes[i] for i in resident)
            line = f"  [{k}] {self.devices[k]}: layers {_span(layers)}, {_mib(held)} of layers held"
            if streamed:
                size = sum(self.layer_bytes[i] for i in streamed)
                line += f"; layers {_span(streamed)} ({_mib(size)}) streamed from host memory"
            lines.append(line)
        lines.append(f"  params outside the layers: {_mib(self.fixed_bytes)}")
        if self.max_device_bytes is not None:
            lines.append(f"  device budget: {_mib(self.max_device_bytes)}")
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _span(layers: list[int]) -> str:
    if not layers:
        return "none"
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])
    return ",".join(map(str, layers))


def split_layers(
    layer_bytes: dict[int, int], n_devices: int, split: list[int] | None = None
) -> dict[int, int]:
    """layer -> device index: contiguous ranges, `split` layers per device, or balanced by
    bytes (each layer goes to the device its middle byte falls in)."""
    layers = sorted(layer_bytes)
    if split is not None:
        if len(split) != n_devices or sum(split) != len(layers) or min(split) < 1:
            raise PlacementError(
                f"split {','.join(map(str, split))} must give each of the {n_devices} devices "
                f"one layer or more, {len(layers)} in all"
            )
        owners = [k for k, count in enumerate(split) for _ in range(count)]
        return dict(zip(layers, owners, strict=True))
    if n_devices > len(layers):
        raise PlacementError(f"{n_devices} devices but only {len(layers)} layers to split")
    total, seen, out = sum(layer_bytes.values()) or 1, 0, {}
    for i in layers:
        out[i] = min(n_devices - 1, int((seen + layer_bytes[i] / 2) * n_devices / total))
        seen += layer_bytes[i]
    return out


def streamed_layers(
    layer_device: dict[int, int],
    layer_bytes: dict[int, int],
    fixed_bytes: dict[int, int],
    budget: int,
    devices: list[str],
) -> set[int]:
    """The layers each device cannot hold within `budget` bytes: it keeps its fixed
    params and its first layers, as many as leave room for the two largest of the rest
    (the streamed layer running and the next one being copied in)."""
    streamed: set[int] = set()
    for k, device in enumerate(devices):
        layers = sorted(i for i, d in layer_device.items() if d == k)
        fixed = fixed_bytes.get(k, 0)
        for held in range(len(layers), -1, -1):
            rest = sorted((layer_bytes[i] for i in layers[held:]), reverse=True)
            if fixed + sum(layer_bytes[i] for i in layers[:held]) + sum(rest[:2]) <= budget:
                streamed.update(layers[held:])
                break
        else:
            least = fixed + sum(sorted((layer_bytes[i] for i in layers), reverse=True)[:2])
            raise PlacementError(
                f"device budget {_mib(budget)} on {device} is too small: it must hold the "
                f"params outside the layers ({_mib(fixed)}) and two streamed layers (the "
                f"largest layer is {_mib(max(layer_bytes[i] for i in layers))}), at least "
                f"{_mib(least)}"
            )
    return streamed


def plan_placement(
    param_bytes: dict[str, int],
    devices: list[str],
    *,
    split: list[int] | None = None,
    max_device_bytes: int | None = None,
    fixed_device: dict[str, list[int]] | None = None,
) -> Placement:
    """The placement of params of these sizes; `fixed_device`: the devices each param
    outside the layers is used on (default: the first), for the budget."""
    if not devices:
        raise PlacementError("devices: name one device or more, e.g. cuda:0,cuda:1")
    container = layer_container(param_bytes)
    layer_bytes: dict[int, int] = {}
    fixed: dict[int, int] = {}
    for name, size in param_bytes.items():
        i = layer_of(name, container)
        if i is not None:
            layer_bytes[i] = layer_bytes.get(i, 0) + size
        for k in (fixed_device or {}).get(name, [0]) if i is None else []:
            fixed[k] = fixed.get(k, 0) + size
    if not layer_bytes:
        raise PlacementError("no layers to place: the source has no indexed params (layers.N.*)")
    layer_device = split_layers(layer_bytes, len(devices), split)
    streamed = set()
    if max_device_bytes is not None:
        streamed = streamed_layers(layer_device, layer_bytes, fixed, max_device_bytes, devices)
    fixed_total = sum(s for n, s in param_bytes.items() if layer_of(n, container) is None)
    return Placement(
        list(devices), container, layer_device, streamed, layer_bytes, fixed_total,
        max_device_bytes,
    )  # fmt: skip
