"""The mixture-of-experts op's reference decomposition: dense, for checking.

Every expert runs on every token and the router's weights (zero for the experts a token
did not choose) sum their outputs, so the primitives need no top-k, gather or scatter. It
is the numerical reference a backend's native emitter (which reads only the chosen
experts' weights) is tested against; it reads all of them, so backends keep `moe` native.
"""

from __future__ import annotations

import math

import numpy as np

from linnet.core.dims import Poly

F32 = "f32"


def _const(b, value, dtype: str):
    return b.add("const", [], value=np.asarray(value, dtype=np.float64), dtype=dtype)


def _chosen(b, logits, experts: Poly, top_k: int):
    """[N, E] bool: the top_k largest logits of each row; a tie goes to the lower index (as
    torch.topk on CPU). An expert's rank counts the experts that beat it."""
    n = b.type_of(logits).shape[0]
    one = Poly.const(1)
    mine = b.add("reshape", [logits], shape=(n, experts, one))  # (N, E, 1)
    other = b.add("reshape", [logits], shape=(n, one, experts))  # (N, 1, E)
    index = b.add("iota", [], length=experts, start=Poly.const(0), dtype="i64")
    earlier = b.add(
        "lt",
        [
            b.add("reshape", [index], shape=(one, experts)),
            b.add("reshape", [index], shape=(experts, one)),
        ],
    )  # (E, E): other index < mine
    beats = b.add(
        "logical_or",
        [b.add("gt", [other, mine]), b.add("logical_and", [b.add("eq", [other, mine]), earlier])],
    )
    rank = b.add("reduce_sum", [b.add("cast", [beats], dtype="i64")], axis=-1, keepdims=False)
    return b.add("lt", [rank, b.add("const", [], value=np.asarray(top_k), dtype="i64")])


def _route(b, x2, router_w, router_b, top_k: int):
    """[N, E] weights: softmax over each token's chosen logits, 0 elsewhere."""
    from linnet.ir.library import linear, softmax

    logits = linear(b, x2, router_w, router_b)  # (N, E)
    t = b.type_of(logits)
    chosen = _chosen(b, logits, t.shape[1], top_k)
    masked = b.add("where", [chosen, logits, _const(b, -math.inf, t.dtype)])
    return softmax(b, masked, axis=-1)


def _experts(b, x2, w_in, b_in, w_out, b_out, *, alpha, limit):
    """[E, N, D]: every expert's output for every token."""
    experts, dim, two_ffn = b.type_of(w_in).shape
    n = b.type_of(x2).shape[0]
    dtype = b.type_of(x2).dtype
    one, zero = Poly.const(1), Poly.const(0)
    h = b.add("matmul", [b.add("reshape", [x2], shape=(one, n, dim)), w_in])  # (E, N, 2F)
    h = b.add("add", [h, b.add("reshape", [b_in], shape=(experts, one, two_ffn))])
    gate, up = (
        b.add(
            "slice",
            [h],
            starts=(zero, zero, Poly.const(k)),
            stops=(experts, n, two_ffn),
            steps=(1, 1, 2),
        )  # fmt: skip
        for k in (0, 1)
    )
    gate = b.add("minimum", [gate, _const(b, limit, dtype)])
    up = b.add(
        "maximum", [b.add("minimum", [up, _const(b, limit, dtype)]), _const(b, -limit, dtype)]
    )
    glu = b.add("mul", [gate, b.add("sigmoid", [b.add("mul", [gate, _const(b, alpha, dtype)])])])
    act = b.add("mul", [b.add("add", [up, _const(b, 1.0, dtype)]), glu])  # (E, N, F)
    y = b.add("matmul", [act, w_out])  # (E, N, D)
    return b.add("add", [y, b.add("reshape", [b_out], shape=(experts, one, dim))])


def moe(b, x, router_w, router_b, w_in, b_in, w_out, b_out, *, top_k, alpha, limit):
    t = b.type_of(x)
    *lead, dim = t.shape
    n = Poly.const(1)
    for d in lead:
        n = n * d
    x2 = b.add("reshape", [x], shape=(n, dim))
    weights = _route(b, x2, router_w, router_b, top_k)  # (N, E)
    y = _experts(b, x2, w_in, b_in, w_out, b_out, alpha=alpha, limit=limit)  # (E, N, D)
    experts = b.type_of(router_w).shape[0]
    weights = b.add(
        "reshape", [b.add("transpose", [weights], perm=(1, 0))], shape=(experts, n, Poly.const(1))
    )
    out = b.add("reduce_sum", [b.add("mul", [y, weights])], axis=0, keepdims=False)  # (N, D)
    return b.add("reshape", [out], shape=tuple(t.shape))
