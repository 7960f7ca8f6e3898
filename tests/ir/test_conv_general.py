"""General 2-D convolution (issue 15): `conv` with `groups` and `dilation`. The decomposition
(im2col, one batched matmul over the groups, dilated offsets) against F.conv2d, then each
backend's native emitter (F.conv2d, lax.conv_general_dilated with feature_group_count and
rhs_dilation, ONNX Conv with group and dilations on onnxruntime) against the decomposition
on the same one-op graph; bad attrs refused by the op table and by `linnet check`.
f32 within 1e-5 * max(1, |ref|)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from linnet.backends.jax import emit as jax_emit  # noqa: E402
from linnet.backends.onnx.graph import Entry, to_model  # noqa: E402
from linnet.backends.torch import emit as torch_emit  # noqa: E402
from linnet.check.elaborate import check_source  # noqa: E402
from linnet.syntax.parser import parse  # noqa: E402
from tests.ir.test_image_ops import _graph, run_onnx  # noqa: E402
from tests.ir.test_ir_ops import rand, run_op  # noqa: E402
from tests.ir.test_vision_ops import close, jax_ns, one_node, run_text, torch_ns  # noqa: E402

# name: (x shape, w shape, bias?, attrs)
CASES = {
    "groups 2": ((2, 4, 7, 6), (6, 2, 3, 3), True, dict(padding=1, groups=2)),
    "depthwise, stride 2": ((1, 6, 9, 8), (6, 1, 3, 3), True, dict(stride=2, padding=1, groups=6)),
    "depthwise x2 outputs": ((2, 3, 5, 5), (6, 1, 3, 3), False, dict(groups=3)),
    "dilation 2": ((2, 3, 9, 10), (4, 3, 3, 3), True, dict(padding=2, dilation=2)),
    "dilation 3, stride 2": ((1, 2, 13, 11), (5, 2, 3, 2), True, dict(stride=2, dilation=3)),
    "groups 2, dilation 2": (
        (2, 4, 8, 8),
        (4, 2, 3, 3),
        True,
        dict(padding=1, groups=2, dilation=2),
    ),
    "1x1, groups 4": ((2, 8, 3, 4), (8, 2, 1, 1), True, dict(groups=4)),
}


def case_inputs(name):
    x_shape, w_shape, bias, attrs = CASES[name]
    xs = [rand(*x_shape, seed=1), rand(*w_shape, seed=2, scale=0.5)]
    if bias:
        xs.append(rand(w_shape[0], seed=3, scale=0.5))
    return xs, attrs


def pytorch(xs, attrs):
    x, w, *b = xs
    return F.conv2d(
        x,
        w,
        b[0] if b else None,
        attrs.get("stride", 1),
        attrs.get("padding", 0),
        attrs.get("dilation", 1),
        attrs.get("groups", 1),
    )


@pytest.mark.parametrize("case", list(CASES))
def test_decomposition_matches_pytorch(case):
    xs, attrs = case_inputs(case)
    close(run_op("conv", xs, **attrs), pytorch(xs, attrs), f"{case} decomposition", 1e-5)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_emitter_matches_decomposition(case, numerics):
    xs, attrs = case_inputs(case)
    names = [f"x{i}" for i in range(len(xs))]
    text = torch_emit.emit(one_node("conv", xs, attrs), torch_emit.Spell(numerics=numerics), names)
    assert "F.conv2d(" in str(text)
    got = run_text(text, torch_ns(), xs)
    close(got, run_op("conv", xs, **attrs), f"torch {numerics} {case}", 1e-5)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_jax_emitter_matches_decomposition(case, numerics):
    xs, attrs = case_inputs(case)
    spell = jax_emit.JaxSpell(numerics=numerics)
    text = jax_emit.emit(one_node("conv", xs, attrs), spell, [f"x{i}" for i in range(len(xs))])
    ns = jax_ns()
    got = run_text(text, ns, [ns["jnp"].asarray(x.numpy()) for x in xs])
    close(got, run_op("conv", xs, **attrs), f"jax {numerics} {case}", 1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_emitter_matches_decomposition(case):
    xs, attrs = case_inputs(case)
    model = to_model(Entry("conv", _graph("conv", xs, attrs)), [], {})
    (node,) = model.graph.node
    assert node.op_type == "Conv"
    got = {a.name: list(a.ints) or a.i for a in node.attribute}
    assert got.get("group", 1) == attrs.get("groups", 1)
    assert got.get("dilations", [1, 1]) == [attrs.get("dilation", 1)] * 2
    close(run_onnx("conv", xs, attrs), run_op("conv", xs, **attrs), f"onnx {case}", 1e-5)


@pytest.mark.parametrize(
    "x, w, attrs, match",
    [
        ((2, 4, 6, 6), (6, 2, 3, 3), dict(groups=3), "input channels x groups"),
        ((2, 4, 6, 6), (6, 4, 3, 3), dict(groups=2), "input channels x groups"),
        ((2, 4, 6, 6), (5, 2, 3, 3), dict(groups=2), "not a multiple of the groups"),
        ((2, 4, 6, 6), (6, 4, 3, 3), dict(groups=0), "groups >= 1"),
        ((2, 4, 6, 6), (6, 4, 3, 3), dict(dilation=0), "dilation >= 1"),
        ((2, 4, 6, 6), (6, 4, 3, 3), dict(dilation=1.5), "integer dilation"),
        ((2, 4, 6), (6, 4, 3, 3), dict(), r"C / groups"),
    ],
)
def test_bad_attrs_refused(x, w, attrs, match):
    from linnet.ir.types import OpTypeError

    with pytest.raises(OpTypeError, match=match):
        _graph("conv", [torch.zeros(x), torch.zeros(w)], attrs)


TOY = """model toy

config
  per_group: int = 2
  groups: int = 4

dim B, H, W

params
  w: f32[per_group * groups, per_group, 3, 3]

entry forward(x: f32[B, per_group * groups, H, W]) -> f32[B, per_group * groups, H, W]
  return conv(x, w, padding=2, dilation=2, groups=GROUPS)
"""


def test_check_accepts_grouped_dilated_conv():
    source = TOY.replace("GROUPS", "groups")
    assert [d.message for d in check_source(parse(source, "t.linnet"))] == []


@pytest.mark.parametrize(
    "groups, match",
    [("3", "input channels x groups"), ("0", "groups >= 1"), ("groups + 1", "input channels")],
)
def test_check_refuses_bad_groups(groups, match):
    """At `linnet check` time, for every config: 3 and groups + 1 groups do not divide the
    per_group * groups channels into w's per_group; 0 groups."""
    diagnostics = check_source(parse(TOY.replace("GROUPS", groups), "t.linnet"))
    assert diagnostics, f"groups={groups} was accepted"
    assert any(match in d.message for d in diagnostics), [d.message for d in diagnostics]
