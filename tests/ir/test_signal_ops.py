"""`conv1d` (Whisper's stem): the decomposition against F.conv1d, each backend's native
emitter against the decomposition, and the shape rule's errors.

f32 within 1e-5 * max(1, |ref|) (`fast` 1e-4), bf16 within 2e-2 relative; ONNX's `Conv` is
checked through the whole model (tests/models/test_whisper.py, onnxruntime).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from linnet.backends.jax import emit as jax_emit  # noqa: E402
from linnet.backends.torch import emit as torch_emit  # noqa: E402
from linnet.ir.graph import Graph, GraphBuilder  # noqa: E402
from linnet.ir.types import OpTypeError  # noqa: E402
from tests.ir.test_ir_ops import assert_bf16, assert_matches, rand, run_op, tensor_type  # noqa: E402
from tests.ir.test_vision_ops import close, jax_ns, one_node, run_text, torch_ns  # noqa: E402

CASES = {
    # name: (x shape, w shape, stride, padding, bias)
    "k3 s1 p1 bias (whisper conv1)": ((2, 5, 12), (7, 5, 3), 1, 1, True),
    "k3 s2 p1 bias (whisper conv2)": ((2, 7, 12), (7, 7, 3), 2, 1, True),
    "k3 s2 p1 odd length": ((1, 3, 11), (4, 3, 3), 2, 1, False),
    "k1": ((2, 6, 5), (3, 6, 1), 1, 0, False),
    "k5 s3 p2": ((2, 4, 17), (6, 4, 5), 3, 2, True),
}


def case_inputs(case, dtype=torch.float32):
    x_shape, w_shape, stride, padding, bias = CASES[case]
    xs = [rand(*x_shape, seed=80), rand(*w_shape, seed=81, scale=0.3)]
    xs += [rand(w_shape[0], seed=82)] if bias else []
    return [x.to(dtype) for x in xs], dict(stride=stride, padding=padding)


@pytest.mark.parametrize("case", list(CASES))
def test_decomposition_matches_f_conv1d(case):
    xs, attrs = case_inputs(case)
    want = F.conv1d(xs[0], xs[1], xs[2] if len(xs) == 3 else None, **attrs)
    assert_matches(run_op("conv1d", xs, **attrs), want, f"conv1d {case}", atol=1e-5, rtol=1e-5)


def test_decomposition_bf16():
    xs, attrs = case_inputs("k3 s2 p1 bias (whisper conv2)", torch.bfloat16)
    want = F.conv1d(*xs, **attrs)
    assert_bf16(run_op("conv1d", xs, **attrs), want, "conv1d bf16 vs F.conv1d")


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_emitter_matches_decomposition(case, numerics):
    xs, attrs = case_inputs(case)
    node = one_node("conv1d", xs, attrs)
    names = [f"x{i}" for i in range(len(xs))]
    got = run_text(
        torch_emit.emit(node, torch_emit.Spell(numerics=numerics), names), torch_ns(), xs
    )
    tol = 1e-5 if numerics == "equivalent" else 1e-4
    close(got, run_op("conv1d", xs, **attrs), f"torch {numerics} conv1d {case}", tol)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_jax_emitter_matches_decomposition(case, numerics):
    xs, attrs = case_inputs(case)
    node = one_node("conv1d", xs, attrs)
    ns = jax_ns()
    names = [f"x{i}" for i in range(len(xs))]
    text = jax_emit.emit(node, jax_emit.JaxSpell(numerics=numerics), names)
    got = run_text(text, ns, [ns["jnp"].asarray(x.numpy()) for x in xs])
    tol = 1e-5 if numerics == "equivalent" else 1e-4
    close(got, run_op("conv1d", xs, **attrs), f"jax {numerics} conv1d {case}", tol)


@pytest.mark.parametrize(
    "shapes, attrs, match",
    [
        ([(1, 3, 8), (4, 2, 3)], {}, "shape mismatch in conv1d"),
        ([(1, 3, 8, 8), (4, 3, 3)], {}, "shape mismatch in conv1d"),
        ([(1, 3, 8), (4, 3, 3), (3,)], {}, "shape mismatch in conv1d"),
        ([(1, 3, 8), (4, 3, 3)], dict(stride=0), "stride >= 1"),
    ],
)
def test_shape_rule_errors(shapes, attrs, match):
    graph = Graph("conv1d")
    values = [graph.input(f"x{i}", tensor_type(torch.zeros(s))) for i, s in enumerate(shapes)]
    with pytest.raises(OpTypeError, match=match):
        GraphBuilder(graph).add("conv1d", values, **attrs)
