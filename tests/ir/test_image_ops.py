"""group_norm and upsample_nearest (issue 15): each decomposition against PyTorch
(F.group_norm, F.interpolate nearest), then each backend's native emitter (PyTorch `ref`
and `fast`, JAX `ref` and `fast`, ONNX GroupNormalization and Resize on onnxruntime)
against the decomposition on the same one-op graph. f32 within 1e-5 * max(1, |ref|),
bf16 within 2e-2; upsampling moves values only, so it must be exact."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from linnet.backends.jax import emit as jax_emit  # noqa: E402
from linnet.backends.onnx.graph import Entry, to_model  # noqa: E402
from linnet.backends.torch import emit as torch_emit  # noqa: E402
from linnet.ir.graph import Graph, GraphBuilder  # noqa: E402
from linnet.ir.ops import OPS  # noqa: E402
from linnet.ir.types import OpTypeError  # noqa: E402
from tests.ir.test_ir_ops import rand, run_op, tensor_type  # noqa: E402
from tests.ir.test_vision_ops import close, jax_ns, one_node, run_text, torch_ns  # noqa: E402

CASES = {
    # name: (op, input shapes, attrs, reference)
    "group_norm 8 groups": (
        "group_norm",
        [(2, 16, 5, 3), (16,), (16,)],
        dict(groups=8, eps=1e-6),
        lambda x, w, b: F.group_norm(x, 8, w, b, 1e-6),
    ),
    "group_norm 1 group, rank 3": (
        "group_norm",
        [(2, 6, 7), (6,), (6,)],
        dict(groups=1, eps=1e-5),
        lambda x, w, b: F.group_norm(x, 1, w, b, 1e-5),
    ),
    "group_norm one channel per group": (
        "group_norm",
        [(1, 4, 3, 3), (4,), (4,)],
        dict(groups=4, eps=1e-6),
        lambda x, w, b: F.group_norm(x, 4, w, b, 1e-6),
    ),
    "upsample_nearest x2": (
        "upsample_nearest",
        [(2, 3, 4, 5)],
        dict(scale=2),
        lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"),
    ),
    "upsample_nearest x3": (
        "upsample_nearest",
        [(1, 2, 3, 2)],
        dict(scale=3),
        lambda x: F.interpolate(x, scale_factor=3.0, mode="nearest"),
    ),
}


def inputs(shapes, dtype=torch.float32):
    # a mean far from 0 so a norm that forgets to center fails
    xs = [rand(*s, seed=40 + i, scale=0.5 if i else 2.0) for i, s in enumerate(shapes)]
    xs[0] = xs[0] + 3.0
    return [x.to(dtype) for x in xs]


@pytest.mark.parametrize("case", list(CASES))
def test_decomposition_matches_pytorch(case):
    op, shapes, attrs, reference = CASES[case]
    xs = inputs(shapes)
    got, want = run_op(op, xs, **attrs), reference(*xs)
    close(got, want, f"{case} decomposition vs PyTorch", 0.0 if op == "upsample_nearest" else 1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_decomposition_bf16(case):
    op, shapes, attrs, reference = CASES[case]
    xs = inputs(shapes, torch.bfloat16)
    got = run_op(op, xs, **attrs)
    assert got.dtype == torch.bfloat16
    want = reference(*[x.float() for x in xs]).to(torch.bfloat16)
    close(got, want, f"{case} bf16 decomposition vs PyTorch", 2e-2)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_emitter_matches_decomposition(case, numerics):
    op, shapes, attrs, _ = CASES[case]
    xs = inputs(shapes)
    text = torch_emit.emit(
        one_node(op, xs, attrs),
        torch_emit.Spell(numerics=numerics),
        [f"x{i}" for i in range(len(xs))],
    )
    got = run_text(text, torch_ns(), xs)
    tol = 0.0 if op == "upsample_nearest" else 1e-5
    close(got, run_op(op, xs, **attrs), f"torch {numerics} {case}", tol)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_jax_emitter_matches_decomposition(case, numerics):
    op, shapes, attrs, _ = CASES[case]
    xs = inputs(shapes)
    spell = jax_emit.JaxSpell(numerics=numerics)
    text = jax_emit.emit(one_node(op, xs, attrs), spell, [f"x{i}" for i in range(len(xs))])
    ns = jax_ns()
    got = run_text(text, ns, [ns["jnp"].asarray(x.numpy()) for x in xs])
    tol = 0.0 if op == "upsample_nearest" else 1e-5
    close(got, run_op(op, xs, **attrs), f"jax {numerics} {case}", tol)


def run_onnx(op: str, xs, attrs) -> torch.Tensor:
    """The op's ONNX emitter in a one-node model, run by onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    graph = Graph(op)
    values = [graph.input(f"x{i}", tensor_type(x)) for i, x in enumerate(xs)]
    graph.outputs = [GraphBuilder(graph).add(op, values, **attrs)]
    model = to_model(Entry(op, graph), [], {})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {f"x{i}": x.numpy() for i, x in enumerate(xs)})
    return torch.from_numpy(out)


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_emitter_matches_decomposition(case):
    op, shapes, attrs, _ = CASES[case]
    xs = inputs(shapes)
    model_ops = {n.op_type for n in to_model(Entry(op, _graph(op, xs, attrs)), [], {}).graph.node}
    # group norm as InstanceNormalization over [B, groups, rest]: onnxruntime has a kernel
    # for it, where it expands GroupNormalization into a dozen ops; the per-channel scale
    # and shift as one BatchNormalization (one pass, where Mul then Add take two)
    want = {"InstanceNormalization", "Reshape", "Shape", "BatchNormalization"}
    assert model_ops == (want if op == "group_norm" else {"Resize"})
    tol = 0.0 if op == "upsample_nearest" else 1e-5
    close(run_onnx(op, xs, attrs), run_op(op, xs, **attrs), f"onnx {case}", tol)


def _graph(op, xs, attrs) -> Graph:
    graph = Graph(op)
    values = [graph.input(f"x{i}", tensor_type(x)) for i, x in enumerate(xs)]
    graph.outputs = [GraphBuilder(graph).add(op, values, **attrs)]
    return graph


def test_ops_are_library_ops_with_every_emitter():
    from linnet.backends.onnx import emit as onnx_emit

    for op in ("group_norm", "upsample_nearest"):
        assert OPS[op].kind == "library"
        assert op in torch_emit.EMITTERS and op in jax_emit.EMITTERS and op in onnx_emit.EMITTERS


@pytest.mark.parametrize(
    "op, shapes, attrs, match",
    [
        ("group_norm", [(2, 6, 4, 4), (6,), (6,)], dict(groups=4, eps=1e-6), "multiple"),
        ("group_norm", [(2, 6, 4, 4), (4,), (6,)], dict(groups=2, eps=1e-6), "axis 1"),
        ("group_norm", [(6,), (6,), (6,)], dict(groups=2, eps=1e-6), "axis 1"),
        ("group_norm", [(2, 6, 4, 4), (6,), (6,)], dict(groups=0, eps=1e-6), "groups >= 1"),
        ("upsample_nearest", [(2, 6, 4)], dict(scale=2), "B, C, H, W"),
        ("upsample_nearest", [(2, 6, 4, 4)], dict(scale=0), "scale >= 1"),
    ],
)
def test_type_errors(op, shapes, attrs, match):
    with pytest.raises(OpTypeError, match=match):
        _graph(op, [torch.zeros(s) for s in shapes], attrs)
