"""ONNX emitters for GPT-OSS's blocks: the mixture of experts and attention sinks.

The MoE is native ONNX, not the dense reference: TopK picks each token's experts, Gather
reads only those experts' weights ([N, k, D, 2F]: a decode step of one token reads k
experts, never all of them), two batched MatMuls run them, and ReduceSum adds their
outputs weighted by a Softmax over the chosen logits. A long prefill gathers N * k
expert matrices (memory grows with the tokens); the dense decomposition
(`linnet/ir/library_moe.py`) is what it is tested against.
"""

from __future__ import annotations

from onnx import helper


def _top_k(b, logits: str, k: int) -> tuple[str, str]:
    """Values and indices of the k largest along the last axis (ties: the lower index)."""
    values, indices = b.fresh("topk_values"), b.fresh("topk_indices")
    node = helper.make_node("TopK", [logits, b.const([k])], [values, indices], name=values,
                            axis=-1, largest=1, sorted=1)  # fmt: skip
    b.nodes.append(node)
    return values, indices


def _clamped_swiglu(a, b, h: str) -> str:
    """GPT-OSS's expert activation of h [..., 2F], gate and up interleaved."""
    last = b.const([2**62])
    gate = b.node("Slice", [h, b.const([0]), last, b.const([-1]), b.const([2])])
    up = b.node("Slice", [h, b.const([1]), last, b.const([-1]), b.const([2])])
    limit = b.typed_const(a["limit"], a["dtype"])
    gate = b.node("Min", [gate, limit])
    up = b.node("Max", [b.node("Min", [up, limit]), b.typed_const(-a["limit"], a["dtype"])])
    scaled = b.node("Mul", [gate, b.typed_const(a["alpha"], a["dtype"])])
    glu = b.node("Mul", [gate, b.node("Sigmoid", [scaled])])
    return b.node("Mul", [b.node("Add", [up, b.typed_const(1.0, a["dtype"])]), glu])


def moe(a, b, x, router_w, router_b, w_in, b_in, w_out, b_out):
    dim = a["in_shape"][-1].value
    x2 = b.node("Reshape", [x, b.const([-1, dim])])  # (N, D)
    logits = b.node("Add", [b.node("MatMul", [x2, b.node("Transpose", [router_w])]), router_b])
    top, idx = _top_k(b, logits, a["top_k"])  # (N, k)
    weights = b.node("Softmax", [_f32(a, b, top)], axis=-1)
    weights = _back(a, b, weights)
    rows = b.node("Reshape", [x2, b.const([-1, 1, 1, dim])])  # (N, 1, 1, D)
    h = b.node("MatMul", [rows, b.node("Gather", [w_in, idx], axis=0)])  # (N, k, 1, 2F)
    h = b.node(
        "Add", [h, b.node("Unsqueeze", [b.node("Gather", [b_in, idx], axis=0), b.const([2])])]
    )
    y = b.node("MatMul", [_clamped_swiglu(a, b, h), b.node("Gather", [w_out, idx], axis=0)])
    y = b.node(
        "Add", [y, b.node("Unsqueeze", [b.node("Gather", [b_out, idx], axis=0), b.const([2])])]
    )
    y = b.node("Mul", [y, b.node("Unsqueeze", [weights, b.const([2, 3])])])  # (N, k, 1, D)
    out = b.node("ReduceSum", [y, b.const([1, 2])], keepdims=0)  # (N, D)
    return b.node("Reshape", [out, b.dims(a["in_shape"])])


def _f32(a, b, x: str) -> str:
    return x if a["dtype"] == "f32" else b.node("Cast", [x], to=1)


def _back(a, b, x: str) -> str:
    from linnet.backends.onnx.emit import ONNX_DTYPES

    return x if a["dtype"] == "f32" else b.node("Cast", [x], to=ONNX_DTYPES[a["dtype"]])


def sink_probs(b, scores: str, sinks: str, shape5: str) -> str:
    """Softmax of f32 scores [B, KV, G, S, T] with each head's sink logit in the
    denominator: exp(s - m) / (sum exp(s - m) + exp(sink - m))."""
    sink = b.node("Reshape", [b.node("Cast", [sinks], to=1), shape5])  # (1, KV, G, 1, 1)
    top = b.node("Max", [b.node("ReduceMax", [scores, b.const([-1])], keepdims=1), sink])
    e = b.node("Exp", [b.node("Sub", [scores, top])])
    total = b.node("Add", [b.node("ReduceSum", [e, b.const([-1])], keepdims=1),
                           b.node("Exp", [b.node("Sub", [sink, top])])])  # fmt: skip
    return b.node("Div", [e, total])
