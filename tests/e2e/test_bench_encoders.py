"""bench/encoders.py's worker on tiny models: a few methods run end to end (prepare,
check against transformers, time with one repeat), so a change that breaks the benchmark
shows here. Every numeric comparison is Linnet against transformers; a Linnet method that
reports the model unsupported fails. No timing is asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.checkpoints import build_tiny_encoder, build_tiny_vision
from tests.numeric import assert_within

_spec = importlib.util.spec_from_file_location(
    "bench_encoders", Path(__file__).resolve().parents[2] / "bench" / "encoders.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

REPEATS = {1: 1, 2: 1}


def cases(ckpt: Path, seq_len: int = 16) -> dict:
    out = {}
    for b in REPEATS:
        inputs = bench.make_inputs(ckpt, b, seq_len=seq_len)
        out[b] = inputs, bench.reference(ckpt, inputs)
    return out


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    ckpt = build_tiny_encoder("BertModel", "base", tmp_path_factory.mktemp("bench-bert"))
    return ckpt, cases(ckpt)


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    ckpt = build_tiny_vision("ResNetModel", tmp_path_factory.mktemp("bench-resnet"))
    return ckpt, cases(ckpt)


def check_timed(result: dict) -> None:
    """The method ran: every batch timed once, items/s from the latency."""
    assert "unsupported" not in result, f"the method could not run: {result['unsupported']}"
    assert set(result["batches"]) == set(REPEATS), result
    for row in result["batches"].values():
        assert "error" not in row, row
    for b, row in result["batches"].items():
        assert row["repeats"] == 1 and row["latency_ms"] > 0, row
        assert row["items_per_s"] == pytest.approx(b * 1e3 / row["latency_ms"])


def check_against_transformers(result: dict, method: str, tol: float) -> None:
    """A Linnet method's rows: run (an "unsupported" Linnet is a failure), and within `tol` of
    transformers' output (the bench's reference: not compiled, eager attention), which is not
    trivially small."""
    assert method.startswith("linnet/"), "only Linnet is compared with transformers"
    check_timed(result)
    for b, row in result["batches"].items():
        assert row["max_abs_reference"] > 0.1, row  # the Δ is measured on real activations
        assert_within(row["max_abs_delta"], tol, f"{method} batch {b}: max |Δ| vs transformers")


@pytest.mark.parametrize("method", ["linnet/interpret/equivalent", "linnet/generated/equivalent"])
def test_linnet_matches_transformers_on_bert(bert, method, tmp_path):
    ckpt, data = bert
    result = bench.run_method(method, ckpt, data, REPEATS, tmp_path)
    check_against_transformers(result, method, 1e-4)


@pytest.mark.parametrize("method", ["linnet/interpret/equivalent", "linnet/onnx"])
def test_linnet_matches_transformers_on_resnet(resnet, method, tmp_path):
    ckpt, data = resnet
    assert bench.kind_of(ckpt) == "image"
    result = bench.run_method(method, ckpt, data, REPEATS, tmp_path)
    check_against_transformers(result, method, 1e-4)


def test_the_transformers_onnx_baseline_runs(resnet, tmp_path):
    """The baseline is transformers itself, so it is not compared with transformers: it must
    run and be timed."""
    ckpt, data = resnet
    result = bench.run_method("transformers/onnx", ckpt, data, REPEATS, tmp_path)
    check_timed(result)
    assert result["info"]["exporter"] == "torchscript"


def test_ratios_and_goals():
    rows = {
        "linnet/onnx": {"batches": {1: {"latency_ms": 5.0}}},
        "linnet/generated/fast": {"batches": {1: {"latency_ms": 8.0}}},
        "transformers/eager": {"batches": {1: {"latency_ms": 10.0}}},
        "transformers/onnx": {"batches": {1: {"latency_ms": 6.0}}},
        "linnet/compile/fast": {"unsupported": "nope"},
    }
    bench.add_ratios(rows, 1)
    assert rows["linnet/onnx"]["batches"][1]["vs"] == {
        "transformers/eager": 2.0,
        "transformers/onnx": pytest.approx(1.2),
    }
    onnx_goal, torch_goal = bench.goals({"m": rows}, [1])
    assert onnx_goal["met"] is True
    assert torch_goal["best"] == "linnet/generated/fast" and torch_goal["met"] is True
