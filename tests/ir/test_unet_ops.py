"""timestep_embedding (issue 15): the decomposition against diffusers' own
get_timestep_embedding, then the native emitters (PyTorch, JAX) against the decomposition on
a one-op graph, and ONNX (decomposed: Sin, Cos) on onnxruntime. Timesteps up to 999 and
SDXL-like time ids up to 1024: the sines of arguments that large are where a table off by
one ulp shows (|Δ| up to about 1e-4 there), so f32 is held within 2e-6."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from linnet.backends.jax import emit as jax_emit  # noqa: E402
from linnet.backends.onnx.graph import Entry, to_model  # noqa: E402
from linnet.backends.torch import emit as torch_emit  # noqa: E402
from linnet.ir.graph import Graph, GraphBuilder  # noqa: E402
from linnet.ir.ops import OPS  # noqa: E402
from linnet.ir.types import OpTypeError, TensorType  # noqa: E402
from tests.ir.test_ir_ops import run_op, tensor_type  # noqa: E402
from tests.ir.test_vision_ops import close, jax_ns, one_node, run_text, torch_ns  # noqa: E402

TOL = 2e-6
STEPS = torch.tensor([999.0, 17.0, 0.0, 500.5])
TIME_IDS = torch.tensor([[1024.0, 1024, 0, 0, 1024, 1024], [768, 1344, 64, 8, 1024, 1024]])
CASES = {
    # name: (t, attrs); diffusers' arguments follow from the attrs
    "timesteps, flipped (SDXL)": (STEPS, dict(dim=32, flip=True, shift=0.0)),
    "timesteps, sin first, shift 1 (SD 1.x's UNet2DModel)": (
        STEPS,
        dict(dim=16, flip=False, shift=1.0),
    ),
    "time ids [B, 6] (SDXL's added embedding)": (TIME_IDS, dict(dim=8, flip=True, shift=0.0)),
}


def diffusers_reference(t, dim, flip, shift):
    from diffusers.models.embeddings import get_timestep_embedding

    flat = get_timestep_embedding(
        t.flatten(), dim, flip_sin_to_cos=flip, downscale_freq_shift=shift
    )
    return flat.reshape(t.shape[0], -1)  # as UNet2DConditionModel joins the time ids


@pytest.mark.parametrize("case", list(CASES))
def test_decomposition_matches_diffusers(case):
    t, attrs = CASES[case]
    got, want = run_op("timestep_embedding", [t], **attrs), diffusers_reference(t, **attrs)
    assert got.shape == want.shape
    close(got, want, f"{case} decomposition vs diffusers", TOL)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_emitter_matches_decomposition(case, numerics):
    t, attrs = CASES[case]
    text = torch_emit.emit(
        one_node("timestep_embedding", [t], attrs), torch_emit.Spell(numerics=numerics), ["x0"]
    )
    got = run_text(text, torch_ns(), [t])
    close(got, run_op("timestep_embedding", [t], **attrs), f"torch {numerics} {case}", TOL)
    close(got, diffusers_reference(t, **attrs), f"torch {numerics} {case} vs diffusers", TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_jax_emitter_matches_decomposition(case):
    t, attrs = CASES[case]
    text = jax_emit.emit(
        one_node("timestep_embedding", [t], attrs), jax_emit.JaxSpell(numerics="equivalent"), ["x0"]
    )
    ns = jax_ns()
    got = run_text(text, ns, [ns["jnp"].asarray(t.numpy())])
    close(got, run_op("timestep_embedding", [t], **attrs), f"jax {case}", TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_decomposed_matches_diffusers(case):
    """ONNX has no such op: its pipeline decomposes it (Sin, Cos, a constant table)."""
    ort = pytest.importorskip("onnxruntime")
    from linnet.ir.pipeline import run_pipeline

    t, attrs = CASES[case]
    graph = Graph("timestep_embedding")
    x = graph.input("x0", tensor_type(t))
    graph.outputs = [GraphBuilder(graph).add("timestep_embedding", [x], **attrs)]
    ready = run_pipeline(graph, "onnx").graph
    model = to_model(Entry("timestep_embedding", ready), [], {})
    assert {"Sin", "Cos"} <= {n.op_type for n in model.graph.node}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x0": t.numpy()})
    close(torch.from_numpy(out), diffusers_reference(t, **attrs), f"onnx {case}", TOL)


def test_is_a_library_op_with_torch_and_jax_emitters():
    assert OPS["timestep_embedding"].kind == "library"
    assert "timestep_embedding" in torch_emit.EMITTERS
    assert "timestep_embedding" in jax_emit.EMITTERS


@pytest.mark.parametrize(
    "t, dim, match",
    [
        (TensorType("f32", ()), 8, "needs f32"),
        (TensorType("i64", (4,)), 8, "needs f32"),
        (TensorType("f32", (2, 3, 4)), 8, "needs f32"),
        (TensorType("f32", (4,)), 7, "even"),
        (TensorType("f32", (4,)), 0, "even"),
    ],
)
def test_type_errors(t, dim, match):
    from linnet.core.dims import Poly

    t = TensorType(t.dtype, tuple(Poly.const(d) for d in t.shape))
    with pytest.raises(OpTypeError, match=match):
        OPS["timestep_embedding"].infer([t], dict(dim=dim))
