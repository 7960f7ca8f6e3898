"""conv_transpose (issue 15, SAM's mask upscaling): the decomposition (dilate, pad, flipped
convolution) against PyTorch's F.conv_transpose2d, then each native emitter (PyTorch, JAX's
dilated lax convolution, ONNX ConvTranspose on onnxruntime) against the decomposition on a
one-op graph; kernels 2 (SAM's, stride 2) and 3 with stride and padding, with and without
bias; type errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from linnet.backends.jax import emit as jax_emit  # noqa: E402
from linnet.backends.onnx.graph import Entry, to_model  # noqa: E402
from linnet.backends.torch import emit as torch_emit  # noqa: E402
from linnet.core.dims import Poly  # noqa: E402
from linnet.ir.graph import Graph, GraphBuilder  # noqa: E402
from linnet.ir.ops import OPS  # noqa: E402
from linnet.ir.types import OpTypeError, TensorType  # noqa: E402
from tests.ir.test_ir_ops import run_op, tensor_type  # noqa: E402
from tests.ir.test_vision_ops import close, jax_ns, one_node, run_text, torch_ns  # noqa: E402

TOL = 1e-5
G = torch.Generator().manual_seed(0)
CASES = {
    # name: (x [B, C, H, W], w [C, O, KH, KW], bias or None, attrs)
    "SAM's 2x2 stride 2": ((2, 6, 3, 5), (6, 4, 2, 2), True, dict(stride=2, padding=0)),
    "3x3 stride 2 padding 1": ((1, 3, 4, 4), (3, 5, 3, 3), True, dict(stride=2, padding=1)),
    "3x3 padding 2, no bias": ((2, 2, 5, 3), (2, 3, 3, 3), False, dict(stride=1, padding=2)),
    "3x2 stride 3": ((1, 4, 2, 3), (4, 2, 3, 2), True, dict(stride=3, padding=0)),
}  # fmt: skip


def operands(case):
    xs, ws, bias, attrs = CASES[case]
    ins = [torch.randn(*xs, generator=G), torch.randn(*ws, generator=G)]
    if bias:
        ins.append(torch.randn(ws[1], generator=G))
    return ins, attrs


def reference(ins, attrs):
    return torch.nn.functional.conv_transpose2d(*ins, **attrs)


@pytest.mark.parametrize("case", list(CASES))
def test_decomposition_matches_pytorch(case):
    ins, attrs = operands(case)
    got, want = run_op("conv_transpose", ins, **attrs), reference(ins, attrs)
    assert got.shape == want.shape
    close(got, want, f"{case} decomposition vs F.conv_transpose2d", TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_torch_emitter_matches_decomposition(case):
    ins, attrs = operands(case)
    names = [f"x{i}" for i in range(len(ins))]
    text = torch_emit.emit(one_node("conv_transpose", ins, attrs), torch_emit.Spell(), names)
    assert "conv_transpose2d" in str(text)  # native, not the decomposition
    close(run_text(text, torch_ns(), ins), run_op("conv_transpose", ins, **attrs), case, TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_jax_emitter_matches_decomposition(case):
    ins, attrs = operands(case)
    names = [f"x{i}" for i in range(len(ins))]
    spell = jax_emit.JaxSpell(numerics="equivalent")
    text = jax_emit.emit(one_node("conv_transpose", ins, attrs), spell, names)
    ns = jax_ns()
    got = run_text(text, ns, [ns["jnp"].asarray(t.numpy()) for t in ins])
    close(got, run_op("conv_transpose", ins, **attrs), f"jax {case}", TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_native_matches_decomposition(case):
    ort = pytest.importorskip("onnxruntime")
    from linnet.ir.pipeline import run_pipeline

    ins, attrs = operands(case)
    graph = Graph("conv_transpose")
    xs = [graph.input(f"x{i}", tensor_type(t)) for i, t in enumerate(ins)]
    graph.outputs = [GraphBuilder(graph).add("conv_transpose", xs, **attrs)]
    model = to_model(Entry("conv_transpose", run_pipeline(graph, "onnx").graph), [], {})
    assert "ConvTranspose" in {n.op_type for n in model.graph.node}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {f"x{i}": t.numpy() for i, t in enumerate(ins)})
    close(torch.from_numpy(out), run_op("conv_transpose", ins, **attrs), f"onnx {case}", TOL)


def test_is_a_library_op_with_native_emitters():
    from linnet.backends.onnx import emit as onnx_emit

    assert OPS["conv_transpose"].kind == "library"
    for table in (torch_emit.EMITTERS, jax_emit.EMITTERS, onnx_emit.EMITTERS):
        assert "conv_transpose" in table


def _t(*shape):
    return TensorType("f32", tuple(Poly.const(d) for d in shape))


@pytest.mark.parametrize(
    "ins, attrs, match",
    [
        ([_t(1, 3, 4, 4), _t(4, 2, 2, 2)], {}, "shape mismatch"),  # C of w is not x's
        ([_t(1, 3, 4, 4), _t(3, 2, 2, 2), _t(3)], {}, "bias"),
        ([_t(1, 3, 4, 4), _t(3, 2, 2, 2)], dict(stride=0), "stride >= 1"),
        ([_t(1, 3, 4, 4), _t(3, 2, 2, 2)], dict(padding=2), "padding <= kernel - 1"),
    ],
)
def test_type_errors(ins, attrs, match):
    with pytest.raises(OpTypeError, match=match):
        OPS["conv_transpose"].infer(ins, attrs)
