"""The mixture-of-experts op of the op table (GPT-OSS's block) and the attention sinks
check. Registered into `linnet.ir.ops.OPS` when that module loads (it imports this one
last); the decomposition is in `linnet/ir/library_moe.py`.
"""

from __future__ import annotations

from linnet.ir.ops import op, require_float, same_dtype
from linnet.ir.types import OpTypeError, TensorType

MOE_OPERANDS = ("x", "router_w", "router_b", "w_in", "b_in", "w_out", "b_out")


@op(
    "moe",
    "library",
    "mixture of experts: router logits x @ router_w^T + router_b, the top attrs['top_k'] "
    "experts per token weighted by a softmax over their logits; each expert computes "
    "h = x @ w_in[e] + b_in[e] (w_in [E, D, 2F], gate and up interleaved on the last axis), "
    "gate = min(h[..., 0::2], limit), up = clamp(h[..., 1::2], -limit, limit), "
    "(up + 1) * gate * sigmoid(alpha * gate) @ w_out[e] + b_out[e] (w_out [E, F, D]), "
    "as GPT-OSS defines it; operands x, router_w, router_b, w_in, b_in, w_out, b_out",
    arity=(7, 7),
)
def _moe(ins, attrs):
    x, router_w, router_b, w_in, b_in, w_out, b_out = ins
    require_float(x, "moe")
    dtype = same_dtype(ins, "moe")
    if x.rank < 1 or router_w.rank != 2 or w_in.rank != 3 or w_out.rank != 3:
        raise OpTypeError(
            "moe needs x [..., D], router_w [E, D], w_in [E, D, 2F], w_out [E, F, D]",
            "ranks >= 1, 2, 3, 3",
            ", ".join(str(t) for t in (x, router_w, w_in, w_out)),
        )
    experts, dim = router_w.shape
    two_ffn = w_in.shape[2]
    want = {
        "router_w": (router_w, (experts, x.shape[-1])),
        "router_b": (router_b, (experts,)),
        "w_in": (w_in, (experts, dim, two_ffn)),
        "b_in": (b_in, (experts, two_ffn)),
        "w_out": (w_out, (experts, w_out.shape[1], dim)),
        "b_out": (b_out, (experts, dim)),
    }
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise OpTypeError(f"shape mismatch in moe: {name}", str(list(shape)), str(t))
    if w_out.shape[1] + w_out.shape[1] != two_ffn:
        raise OpTypeError("moe: w_in must hold gate and up", f"[E, D, 2 * {w_out.shape[1]}]",
                          str(w_in))  # fmt: skip
    top_k = attrs["top_k"]
    if isinstance(top_k, int) and (top_k < 1 or (experts.is_const and top_k > experts.value)):
        raise OpTypeError("moe: top_k must be between 1 and the experts", f"1..{experts}",
                          str(top_k))  # fmt: skip
    return TensorType(dtype, x.shape)


def check_sinks(q: TensorType, sinks: TensorType) -> None:
    """Attention sinks: one learned logit per query head, in q's dtype."""
    if sinks.rank != 1 or q.rank != 4 or sinks.shape[0] != q.shape[1] or sinks.dtype != q.dtype:
        raise OpTypeError("attention sinks must be one value per query head", "[H]", str(sinks))
