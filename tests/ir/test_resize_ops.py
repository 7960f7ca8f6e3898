"""resize_bilinear (issue 15): the decomposition against PyTorch's
F.interpolate(mode="bilinear", antialias=False), both align_corners, up, down, odd ratios,
the same size and a size of 1; then each backend's native emitter (F.interpolate, the JAX
prelude's gather-and-lerp, ONNX Resize linear on onnxruntime) against the decomposition.
f32 within 1e-6 * max(1, |ref|) (the same formula; only rounding of a fused multiply-add
may differ), bf16 within 2e-2."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from linnet.backends.jax import emit as jax_emit  # noqa: E402
from linnet.backends.onnx.graph import Entry, to_model  # noqa: E402
from linnet.backends.torch import emit as torch_emit  # noqa: E402
from linnet.check.elaborate import check_source  # noqa: E402
from linnet.ir.types import OpTypeError  # noqa: E402
from linnet.syntax.parser import parse  # noqa: E402
from tests.ir.test_image_ops import _graph, run_onnx  # noqa: E402
from tests.ir.test_ir_ops import rand, run_op  # noqa: E402
from tests.ir.test_vision_ops import close, jax_ns, one_node, run_text, torch_ns  # noqa: E402

# name: (input shape, output size)
SIZES = {
    "up x2": ((2, 3, 4, 5), (8, 10)),
    "up, odd ratio": ((1, 2, 3, 5), (7, 8)),
    "down": ((2, 2, 8, 9), (3, 4)),
    "down x4, up": ((1, 3, 16, 3), (4, 7)),
    "same size": ((1, 2, 5, 6), (5, 6)),
    "to one pixel": ((1, 2, 4, 6), (1, 1)),
}
CASES = [(name, corners) for name in SIZES for corners in (False, True)]
IDS = [f"{name}, align_corners={corners}" for name, corners in CASES]


def case(name, corners, dtype=torch.float32):
    shape, size = SIZES[name]
    x = (rand(*shape, seed=7, scale=2.0) + 1.0).to(dtype)
    return [x], dict(size=size, align_corners=corners)


def pytorch(x, attrs):
    return F.interpolate(
        x, size=attrs["size"], mode="bilinear", align_corners=attrs["align_corners"]
    )


@pytest.mark.parametrize("name, corners", CASES, ids=IDS)
def test_decomposition_matches_pytorch(name, corners):
    xs, attrs = case(name, corners)
    close(run_op("resize_bilinear", xs, **attrs), pytorch(xs[0], attrs), "decomposition", 1e-6)


@pytest.mark.parametrize("name, corners", CASES[:6], ids=IDS[:6])
def test_decomposition_bf16(name, corners):
    xs, attrs = case(name, corners, torch.bfloat16)
    got = run_op("resize_bilinear", xs, **attrs)
    assert got.dtype == torch.bfloat16
    close(got, pytorch(xs[0], attrs), "bf16 decomposition", 2e-2)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("name, corners", CASES, ids=IDS)
def test_torch_emitter_matches_decomposition(name, corners, numerics):
    xs, attrs = case(name, corners)
    spell = torch_emit.Spell(numerics=numerics)
    text = torch_emit.emit(one_node("resize_bilinear", xs, attrs), spell, ["x0"])
    assert "F.interpolate(" in str(text)
    got = run_text(text, torch_ns(), xs)
    close(got, run_op("resize_bilinear", xs, **attrs), f"torch {numerics}", 1e-6)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("name, corners", CASES, ids=IDS)
def test_jax_emitter_matches_decomposition(name, corners, numerics):
    xs, attrs = case(name, corners)
    spell = jax_emit.JaxSpell(numerics=numerics)
    text = jax_emit.emit(one_node("resize_bilinear", xs, attrs), spell, ["x0"])
    ns = jax_ns()
    got = run_text(text, ns, [ns["jnp"].asarray(xs[0].numpy())])
    close(got, run_op("resize_bilinear", xs, **attrs), f"jax {numerics}", 1e-6)


def test_jax_image_resize_is_not_pytorch_when_shrinking():
    """Why the JAX emitter is not jax.image.resize: it antialiases a downscale by default,
    which F.interpolate(antialias=False) does not (and it has no align_corners)."""
    jax = pytest.importorskip("jax")
    xs, attrs = case("down", False)
    theirs = jax.image.resize(xs[0].numpy(), (2, 2, 3, 4), method="linear")
    delta = float(np.abs(np.asarray(theirs) - pytorch(xs[0], attrs).numpy()).max())
    assert delta > 1e-2, "jax.image.resize now matches PyTorch's downscale"


@pytest.mark.parametrize("name, corners", CASES, ids=IDS)
def test_onnx_emitter_matches_decomposition(name, corners):
    xs, attrs = case(name, corners)
    model = to_model(Entry("resize", _graph("resize_bilinear", xs, attrs)), [], {})
    assert {n.op_type for n in model.graph.node} == {"Resize"}
    got = run_onnx("resize_bilinear", xs, attrs)
    close(got, run_op("resize_bilinear", xs, **attrs), "onnx", 1e-6)


@pytest.mark.parametrize(
    "shape, attrs, match",
    [
        ((2, 3, 4), dict(size=(2, 2)), "B, C, H, W"),
        ((1, 3, 4, 4), dict(size=(0, 2)), "sizes >= 1"),
        ((1, 3, 4, 4), dict(size=(2,)), "size = \\(height, width\\)"),
        ((1, 3, 4, 4), dict(size=(2, 2), align_corners=1), "align_corners is a bool"),
    ],
)
def test_bad_attrs_refused(shape, attrs, match):
    with pytest.raises(OpTypeError, match=match):
        _graph("resize_bilinear", [torch.zeros(shape)], attrs)


def test_integer_tensor_refused():
    with pytest.raises(OpTypeError, match="float"):
        _graph("resize_bilinear", [torch.zeros((1, 1, 2, 2), dtype=torch.int64)], dict(size=(4, 4)))


TOY = """model toy

dim B, C, H, W

entry forward(x: f32[B, C, H, W]) -> f32[B, C, 2 * H + 1, W]
  return resize_bilinear(pad2d(x, 0, 1, 0, 1), 2 * H + 1, W, align_corners=true)
"""


def test_check_accepts_runtime_sizes():
    assert [d.message for d in check_source(parse(TOY, "toy.linnet"))] == []


def test_check_refuses_a_wrong_size():
    bad = TOY.replace("-> f32[B, C, 2 * H + 1, W]", "-> f32[B, C, 2 * H, W]")
    messages = [d.message for d in check_source(parse(bad, "toy.linnet"))]
    assert messages, "a resize to the wrong height was accepted"


def test_runtime_sizes_on_the_interpreter_and_onnx():
    """Sides that are runtime dims (H, W) and a size computed from them (2 * H + 1, W - 1):
    the tables are built per call; ONNX reads the sizes from the input's shape."""
    ort = pytest.importorskip("onnxruntime")
    from linnet.core.dims import Poly
    from linnet.ir.graph import Graph, GraphBuilder
    from linnet.ir.types import TensorType

    h, w = Poly.atom("H"), Poly.atom("W")
    ty = TensorType("f32", (Poly.const(1), Poly.const(2), h, w))
    attrs = dict(size=(2 * h + 1, w - 1), align_corners=False)
    graph = Graph("resize")
    graph.outputs = [GraphBuilder(graph).add("resize_bilinear", [graph.input("x0", ty)], **attrs)]
    session = ort.InferenceSession(
        to_model(Entry("resize", graph), [], {}).SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    for shape in ((1, 2, 3, 5), (1, 2, 6, 4)):
        x = rand(*shape, seed=9)
        want = F.interpolate(x, size=(2 * shape[2] + 1, shape[3] - 1), mode="bilinear")
        close(run_op("resize_bilinear", [x], types=[ty], **attrs), want, f"interpret {shape}", 1e-6)
        (got,) = session.run(None, {"x0": x.numpy()})
        close(torch.from_numpy(got), want, f"onnx {shape}", 1e-6)
