"""The vision ops' native emitters against their reference decompositions.

tests/ir/test_ir_ops.py checks each decomposition (conv, max_pool, batch_norm; pad, strided
slice, broadcast) against PyTorch. Here each backend's own emitter for the op (PyTorch
`ref` and `fast`, JAX `ref` and `fast`) runs the same one-op graph and must agree with
the decomposition: f32 within 1e-5 * max(1, |ref|) (`fast` 1e-4), bf16 within 2e-2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from linnet.backends.emit import Lines  # noqa: E402
from linnet.backends.jax import emit as jax_emit  # noqa: E402
from linnet.backends.torch import emit as torch_emit  # noqa: E402
from linnet.backends.torch import prelude as torch_prelude  # noqa: E402
from linnet.ir.graph import Graph, GraphBuilder  # noqa: E402
from linnet.ir.ops import OPS  # noqa: E402
from tests.ir.test_ir_ops import rand, run_op, tensor_type  # noqa: E402
from tests.numeric import assert_close  # noqa: E402

CASES = {
    # name: (op, input shapes, attrs)
    "conv 3x3 s1 p1 bias": ("conv", [(2, 4, 9, 7), (6, 4, 3, 3), (6,)], dict(stride=1, padding=1)),
    "conv 7x7 s2 p3": ("conv", [(2, 3, 16, 15), (4, 3, 7, 7)], dict(stride=2, padding=3)),
    "conv patches": ("conv", [(2, 3, 16, 12), (8, 3, 4, 4), (8,)], dict(stride=4, padding=0)),
    "max_pool 3 s2 p1": ("max_pool", [(2, 3, 9, 8)], dict(kernel=3, stride=2, padding=1)),
    "batch_norm": ("batch_norm", [(2, 5, 4, 3)] + [(5,)] * 4, dict(eps=1e-5)),
    "pad": ("pad", [(2, 3, 4)], dict(pads=((0, 0), (1, 2), (0, 1)), value=-2.5)),
    "strided slice": (
        "slice",
        [(2, 3, 9)],
        dict(starts=(0, 1, 1), stops=(2, 3, 9), steps=(1, 2, 3)),
    ),
    "broadcast": ("broadcast", [(1, 3, 1)], dict(shape=(4, 3, 2))),
}


def inputs(op: str, shapes, dtype=torch.float32):
    xs = [rand(*s, seed=90 + i, scale=0.5 if i else 1.0) for i, s in enumerate(shapes)]
    if op == "batch_norm":
        xs[4] = xs[4].abs() + 0.1  # a variance
    return [x.to(dtype) for x in xs]


def one_node(op: str, xs, attrs):
    graph = Graph(op)
    values = [graph.input(f"x{i}", tensor_type(x)) for i, x in enumerate(xs)]
    node_out = GraphBuilder(graph).add(op, values, **attrs)
    graph.outputs = [node_out]
    return graph.nodes[0]


def run_text(text, ns: dict, args: list):
    names = [f"x{i}" for i in range(len(args))]
    scope = dict(ns, **dict(zip(names, args)))
    if isinstance(text, Lines):
        exec("\n".join(text.lines), scope)
        text = text.value
    return eval(text, scope)


def torch_ns() -> dict:
    ns = {k: getattr(torch_prelude, k) for k in dir(torch_prelude) if not k.startswith("__")}
    return dict(ns, torch=torch, F=F, math=math, _dev=torch.device("cpu"))


def jax_ns() -> dict:
    jax = pytest.importorskip("jax")
    from jax import lax

    from linnet.backends.jax import prelude as jax_prelude

    ns = {k: getattr(jax_prelude, k) for k in dir(jax_prelude) if not k.startswith("__")}
    return dict(ns, jax=jax, jnp=jax.numpy, lax=lax, math=math, np=np)


def close(got, want, what: str, tol: float) -> float:
    if not isinstance(got, torch.Tensor):
        got = torch.from_numpy(np.array(got, dtype=np.float32))
    scale = max(1.0, float(want.float().abs().max()))  # a NaN in want fails below
    return assert_close(got.float(), want.float(), atol=tol * scale, what=what)


def test_every_op_has_a_jax_emitter():
    missing = sorted(set(OPS) - set(jax_emit.EMITTERS))
    assert not missing, f"ops without a jax emitter: {missing}"
    stray = sorted(set(jax_emit.EMITTERS) - set(OPS))
    assert not stray, f"jax emitters for ops the table does not have: {stray}"


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_emitter_matches_decomposition(case, numerics):
    op, shapes, attrs = CASES[case]
    xs = inputs(op, shapes)
    node = one_node(op, xs, attrs)
    text = torch_emit.emit(
        node, torch_emit.Spell(numerics=numerics), [f"x{i}" for i in range(len(xs))]
    )
    got = run_text(text, torch_ns(), xs)
    close(
        got,
        run_op(op, xs, **attrs),
        f"torch {numerics} {case}",
        1e-5 if numerics == "equivalent" else 1e-4,
    )


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("case", list(CASES))
def test_jax_emitter_matches_decomposition(case, numerics):
    op, shapes, attrs = CASES[case]
    xs = inputs(op, shapes)
    node = one_node(op, xs, attrs)
    spell = jax_emit.JaxSpell(numerics=numerics)
    text = jax_emit.emit(node, spell, [f"x{i}" for i in range(len(xs))])
    ns = jax_ns()
    got = run_text(text, ns, [ns["jnp"].asarray(x.numpy()) for x in xs])
    # fast: XLA's default f32 conv precision on CPU
    close(
        got,
        run_op(op, xs, **attrs),
        f"jax {numerics} {case}",
        1e-5 if numerics == "equivalent" else 1e-4,
    )


@pytest.mark.parametrize("case", ["conv 3x3 s1 p1 bias", "max_pool 3 s2 p1", "batch_norm"])
def test_bf16_emitters(case):
    op, shapes, attrs = CASES[case]
    xs = inputs(op, shapes, torch.bfloat16)
    node = one_node(op, xs, attrs)
    want = run_op(op, xs, **attrs)
    assert want.dtype == torch.bfloat16
    for numerics in ("equivalent", "fast"):
        text = torch_emit.emit(
            node, torch_emit.Spell(numerics=numerics), [f"x{i}" for i in range(len(xs))]
        )
        got = run_text(text, torch_ns(), xs)
        assert got.dtype == torch.bfloat16
        close(got, want, f"torch bf16 {numerics} {case}", 2e-2)
