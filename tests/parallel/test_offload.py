"""Host offload (issue 19): a device budget; the layers beyond it stay in host memory and
are copied in one layer ahead of use (`to_device(prefetch=True)`, then `await_copy`).

On this CPU-only machine the copies still run (`prefetch_to` copies host to "device" even
when both are the CPU), so the mechanism is exercised: outputs equal with and without a
budget, the plan is what the budget implies (worked out here from the checkpoint's
parameter sizes), the copies are scheduled a layer ahead and run at every call, and a
budget too small for two streamed layers is an error that says so.
"""

from __future__ import annotations

import pytest
import torch

import linnet.torch
from linnet.backends.torch import prelude
from linnet.shard.place import HOST
from linnet.shard.placement import PlacementError
from tests.numeric import assert_close
from tests.tiny_decoders import build_tiny, probe_ids

MODES = ["generated", "interpret"]


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A four-layer tiny Llama, its one-device model, and its sizes: (fixed, per layer)."""
    ck = build_tiny("llama", "deep", out_dir=tmp_path_factory.mktemp("offload-tiny"))
    one = linnet.torch.load(ck, dtype="f32", mode="interpret")
    per_layer = [
        sum(t.nbytes for n, t in one.params.items() if n.startswith(f"layers.{i}."))
        for i in range(4)
    ]
    assert len(set(per_layer)) == 1  # equal layers: the budgets below are exact
    fixed = sum(t.nbytes for n, t in one.params.items() if not n.startswith("layers."))
    return ck, fixed, per_layer[0]


def _load(ck, mode, budget=None):
    return linnet.torch.load(ck, dtype="f32", mode=mode, max_device_bytes=budget)


def test_the_plan_is_what_the_budget_implies(deep):
    ck, fixed, layer = deep
    model_size = fixed + 4 * layer
    expected = {
        model_size: set(),  # it all fits
        model_size - 1: {1, 2, 3},  # one layer held, room for two streamed ones
        fixed + 3 * layer: {1, 2, 3},
        fixed + 3 * layer - 1: {0, 1, 2, 3},  # nothing held but two streamed layers
        fixed + 2 * layer: {0, 1, 2, 3},
    }
    for budget, streamed in expected.items():
        placement = _load(ck, "generated", budget).placement
        assert placement.streamed == streamed, budget
        assert "streamed from host memory" in placement.describe() or not streamed


@pytest.mark.parametrize("budget", ["too small", "below a layer"])
def test_a_budget_too_small_is_an_error(deep, budget):
    ck, fixed, layer = deep
    size = fixed + 2 * layer - 1 if budget == "too small" else layer - 1
    with pytest.raises(PlacementError, match="too small: it must hold .* two streamed layers"):
        _load(ck, "generated", size)


@pytest.mark.parametrize("mode", MODES)
def test_offloaded_outputs_equal_the_device_resident_ones(deep, mode):
    ck, fixed, layer = deep
    whole = _load(ck, mode)
    ids = probe_ids(whole.config["vocab"])
    expected, tokens = whole.forward(ids), whole.generate(ids[:1], 6)
    for budget in (fixed + 3 * layer, fixed + 2 * layer):  # some layers, then all, streamed
        model = _load(ck, mode, budget)
        assert model.placement.streamed and budget < fixed + 4 * layer
        assert_close(model.forward(ids), expected, atol=0.0, rtol=0.0, what="logits")
        assert torch.equal(model.generate(ids[:1], 6), tokens)


def _layer(name: str):
    return int(name.split(".")[1]) if name.startswith("layers.") else None


def test_copies_start_a_layer_ahead_and_are_awaited_before_the_layer(deep):
    ck, fixed, layer = deep
    model = _load(ck, "generated", fixed + 2 * layer)
    for entry, p in model.runner.placed.items():
        graph = p.graph
        names = {v: n for n, v in graph.params.items()}
        for node in graph.nodes:  # only the copies read a streamed param
            for v in node.inputs:
                if v in names and _layer(names[v]) is not None and node.op != "to_device":
                    raise AssertionError(f"{entry}: {node.op} reads streamed {names[v]}")
        starts, first = {}, {}  # layer -> index of its first copy, of its first await
        for index, node in enumerate(graph.nodes):
            if node.op == "to_device" and node.attrs.get("prefetch"):
                starts.setdefault(_layer(names[node.inputs[0]]), index)
            if node.op == "await_copy":
                source = next(n for n in graph.nodes if n.output is node.inputs[0])
                first.setdefault(_layer(names[source.inputs[0]]), index)
        assert sorted(starts) == sorted(first) == [0, 1, 2, 3], entry
        for i in range(1, 4):  # layer i's copies start before layer i-1 is awaited
            assert starts[i] < first[i - 1] < first[i], (entry, i)
        host = {n for n, d in p.param_device.items() if d == HOST}
        assert host and all(_layer(n) is not None for n in host)


def test_the_interpreter_copies_streamed_weights_at_every_call(deep, monkeypatch):
    ck, fixed, layer = deep
    calls = []
    real = prelude.prefetch_to
    monkeypatch.setattr(prelude, "prefetch_to", lambda x, d: calls.append(d) or real(x, d))
    model = _load(ck, "interpret", fixed + 3 * layer)
    streamed = [n for n, d in model.runner.placed["forward"].param_device.items() if d == HOST]
    assert len(streamed) == 3 * 9  # three layers of nine params each (norms and linears)
    calls.clear()  # (none at load: a copy is not folded into a constant)
    ids = probe_ids(model.config["vocab"])
    for expected in (1, 2):
        model.forward(ids)
        assert len(calls) == expected * len(streamed)
