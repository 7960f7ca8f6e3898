"""Helpers that emitted JAX code calls: host guards, rope tables and the library ops.

This module is copied verbatim into every generated source (`linnet jax`), so
generated code runs with jax and numpy alone; the runners import it. The `ref`
helpers keep the reference numerics of `linnet/ir/library.py` op for op (f32
norms and softmax, rope tables built in f32, matmuls at full f32 precision);
the `fast` ones let XLA pick (default matmul precision, `jax.nn` kernels).
Both are tested against the decompositions (tests/backends/test_jax_backend.py).

A start position may be a Python int or a traced int32 scalar: one jit (or one
StableHLO export) serves every position. `i64` tensors of the IR are int32 here.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

HIGHEST = lax.Precision.HIGHEST  # f32 matmuls stay f32 on every device (no TF32/bf16 passes)


class GuardError(ValueError):
    """A `require` of the source failed (checked on the host, before a call)."""


def _guard(lhs, rhs, message, lhs_text, rhs_text, error=GuardError):
    if lhs > rhs:
        raise error(f"{message} failed: {lhs_text} = {lhs} > {rhs_text} = {rhs}")


def rope_tables(
    head_dim, positions, theta, scaling, factor, low_freq, high_freq, original_max, *yarn
):
    """cos, sin [positions, head_dim / 2] in f32 (numpy), as transformers builds them;
    `yarn`: beta_fast, beta_slow, truncate and the attention factor that scales both."""
    f32 = np.float32
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(f32) / f32(head_dim)
    inv = (f32(1.0) / np.power(f32(theta), exponent)).astype(f32)
    gain = f32(yarn[3] if scaling == "yarn" else 1.0)
    if scaling == "yarn":
        inv = _yarn_inv_freq(head_dim, theta, factor, original_max, exponent, *yarn[:3])
    if scaling == "llama3":
        low_wavelen, high_wavelen = original_max / low_freq, original_max / high_freq
        wavelen = (2 * math.pi / inv).astype(f32)
        scaled = np.where(wavelen > low_wavelen, inv / f32(factor), inv)
        smooth = (original_max / wavelen - low_freq) / (high_freq - low_freq)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled).astype(f32)
    freqs = np.arange(positions, dtype=f32)[:, None] * inv[None, :]
    return (np.cos(freqs) * gain).astype(f32), (np.sin(freqs) * gain).astype(f32)


def _yarn_inv_freq(head_dim, theta, factor, original_max, exponent, beta_fast, beta_slow, truncate):
    """YaRN's blend of original and interpolated frequencies (see linnet/ir/library.py)."""
    f32 = np.float32
    pos_freqs = np.power(f32(theta), exponent).astype(f32)

    def correction_dim(rotations):
        return head_dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = (np.arange(head_dim // 2, dtype=f32) - f32(low)) / f32(high - low)
    keep = (f32(1.0) - np.clip(ramp, 0, 1)).astype(f32)
    extrapolation = (f32(1.0) / pos_freqs).astype(f32)
    interpolation = (f32(1.0) / (f32(factor) * pos_freqs)).astype(f32)
    return (interpolation * (f32(1.0) - keep) + extrapolation * keep).astype(f32)


def _positions(offset, seq):
    """Positions offset..offset+seq (offset an int or a traced scalar), or `offset` itself
    when it is already a 1-D array of positions."""
    if jnp.ndim(offset) >= 1:  # [S], or [B, S] per row
        return offset
    return offset + jnp.arange(seq, dtype=jnp.int32)


def _rows(table, offset, seq, dtype):
    """Rows offset..offset+seq of a rope table (or the rows at a positions array)."""
    if jnp.ndim(offset) == 2:  # per-row positions [B, S]: (B, 1, S, D/2)
        return jnp.take(table, offset, axis=0)[:, None].astype(dtype)
    if jnp.ndim(offset) == 1:
        return jnp.take(table, offset, axis=0).astype(dtype)
    return lax.dynamic_slice_in_dim(table, offset, seq, axis=0).astype(dtype)


# -- numerics="equivalent": the reference decompositions, op for op ----------------------
def linear_ref(x, w, b=None):
    y = jnp.matmul(x, w.T, precision=HIGHEST)
    return y if b is None else y + b


def rms_norm_ref(x, w, eps):
    h = x.astype(jnp.float32)
    h = h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    return w * h.astype(x.dtype)


def layer_norm_ref(x, w, b, eps):
    h = x.astype(jnp.float32)
    centered = h - jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return (centered * lax.rsqrt(var + eps)).astype(x.dtype) * w + b


def softmax_ref(x, axis):
    h = x.astype(jnp.float32)
    e = jnp.exp(h - jnp.max(h, axis=axis, keepdims=True))
    return (e / jnp.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


def gelu_ref(x, approx):
    if approx == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (jnp.tanh(inner) + 1.0)
    return x * 0.5 * (lax.erf(x * (1.0 / math.sqrt(2.0))) + 1.0)


def rope_ref(x, cos, sin, offset):
    """Half rotation of x [B, H, S, D] at positions offset..offset+S (or a positions array)."""
    seq, half = x.shape[2], x.shape[3] // 2
    c, s = _rows(cos, offset, seq, x.dtype), _rows(sin, offset, seq, x.dtype)  # (S, D/2)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _mask(q_offset, s, t, window, causal=True):
    """[S, T] bool ([B, S, T] for per-row positions): key position <= query position (and
    inside the window); without `causal`, keys within window // 2 of the query on either
    side."""
    qpos = _positions(q_offset, s)[..., None]
    kpos = jnp.arange(t, dtype=jnp.int32)[None, :]
    if not causal:
        return jnp.abs(kpos - qpos) <= window // 2
    allowed = kpos <= qpos
    if window:
        allowed = allowed & (kpos > qpos - window)
    return allowed


def _softmax_or_zero(x):
    """Softmax over the last axis of f32 x; a row with every key masked gives zeros."""
    top = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - jnp.where(top == -jnp.inf, 0.0, top))
    return e / jnp.maximum(jnp.sum(e, axis=-1, keepdims=True), 1e-30)


def attention_ref(q, k, v, causal, q_offset, window, scale, key_mask=None, sinks=None):
    """softmax(q k^T * scale + mask) v, GQA by grouping q heads over kv heads; `key_mask`
    [B, T]: keys where it is 0 are padding, attended by no query; `sinks` [H]: a logit per
    head added to each softmax's denominator."""
    b, h, s, d = q.shape
    kv, t = k.shape[1], k.shape[2]
    q5 = q.reshape(b, kv, h // kv, s, d)  # (B, KV, G, S, D)
    k5t = jnp.swapaxes(k.reshape(b, kv, 1, t, d), -1, -2)  # (B, KV, 1, D, T)
    scores = jnp.matmul(q5, k5t, precision=HIGHEST)  # (B, KV, G, S, T)
    scores = (scores * (scale if scale is not None else 1.0 / math.sqrt(d))).astype(jnp.float32)
    if causal or window:
        mask = _mask(q_offset, s, t, window, causal)
        mask = mask[:, None, None] if mask.ndim == 3 else mask  # per row: (B, 1, 1, S, T)
        scores = jnp.where(mask, scores, -jnp.inf)
    if key_mask is not None:
        scores = jnp.where(key_mask.reshape(b, 1, 1, 1, t) != 0, scores, -jnp.inf)
        probs = _softmax_or_zero(scores).astype(q.dtype)
    elif sinks is not None:
        sink = sinks.astype(jnp.float32).reshape(1, kv, h // kv, 1, 1)
        top = jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), sink)
        e = jnp.exp(scores - top)
        probs = (e / (jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sink - top))).astype(q.dtype)
    else:
        probs = softmax_ref(scores, -1).astype(q.dtype)
    out = jnp.matmul(probs, v.reshape(b, kv, 1, t, d), precision=HIGHEST)
    return out.reshape(b, h, s, d)


def _conv(x, w, stride, padding, precision, dilation=1, groups=1):
    pads = ((padding, padding), (padding, padding))
    return lax.conv_general_dilated(
        x, w, (stride, stride), pads, rhs_dilation=(dilation, dilation),
        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=groups,
        precision=precision,
    )  # fmt: skip


def conv_ref(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    y = _conv(x, w, stride, padding, HIGHEST, dilation, groups)
    return y if b is None else y + b[:, None, None]


def conv_transpose(x, w, b=None, stride=1, padding=0):
    """F.conv_transpose2d, w [C, O, KH, KW]: a convolution of x dilated by the stride with
    the kernel flipped and its axes swapped (linnet/ir/library_sam.py)."""
    kh, kw = w.shape[2], w.shape[3]
    pads = ((kh - 1 - padding,) * 2, (kw - 1 - padding,) * 2)
    y = lax.conv_general_dilated(
        x, jnp.flip(w, (2, 3)).transpose(1, 0, 2, 3), (1, 1), pads, lhs_dilation=(stride, stride),
        dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=HIGHEST,
    )  # fmt: skip
    return y if b is None else y + b[:, None, None]


def max_pool(x, kernel, stride, padding):
    """F.max_pool2d on [B, C, H, W]: windows over H and W, padding never wins (-inf)."""
    pads = ((0, 0), (0, 0), (padding, padding), (padding, padding))
    window, strides = (1, 1, kernel, kernel), (1, 1, stride, stride)
    return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, pads)


def batch_norm_ref(x, w, b, mean, var, eps):
    """x * scale + shift over axis 1, scale = w * rsqrt(var + eps), shift = b - mean * scale."""
    f32 = jnp.float32
    scale = w.astype(f32) * lax.rsqrt(var.astype(f32) + eps)
    shift = b.astype(f32) - mean.astype(f32) * scale
    view = (-1,) + (1,) * (x.ndim - 2)
    return (x.astype(f32) * scale.reshape(view) + shift.reshape(view)).astype(x.dtype)


def group_norm_ref(x, w, b, groups, eps):
    """Each group of channels (with every later axis) centered and scaled in f32, then
    w and b per channel in f32, cast back once (linnet/ir/library.py: group_norm)."""
    h = x.astype(jnp.float32).reshape(x.shape[0], groups, -1)
    centered = h - jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    h = (centered * lax.rsqrt(var + eps)).reshape(x.shape)
    view = (-1,) + (1,) * (x.ndim - 2)
    f32 = jnp.float32
    return (h * w.astype(f32).reshape(view) + b.astype(f32).reshape(view)).astype(x.dtype)


def upsample_nearest(x, scale):
    """[B, C, H, W] -> [B, C, H * scale, W * scale]: each pixel repeated (exact)."""
    return jnp.repeat(jnp.repeat(x, scale, axis=2), scale, axis=3)


def _bilinear_table(n_in, n_out, align_corners):
    """PyTorch's source rows and weights along one axis, in f32 (library_resize.py)."""
    f32 = np.float32
    dst = np.arange(n_out, dtype=f32)
    if align_corners:
        ratio = f32(n_in - 1) / f32(n_out - 1) if n_out > 1 else f32(0)
        src = ratio * dst
    else:
        src = np.maximum(f32(n_in) / f32(n_out) * (dst + f32(0.5)) - f32(0.5), f32(0))
    i0 = np.minimum(src.astype(np.int64), n_in - 1)
    l1 = np.clip(src - i0.astype(f32), f32(0), f32(1)).astype(f32)
    return i0, np.minimum(i0 + 1, n_in - 1), f32(1) - l1, l1


def resize_bilinear(x, oh, ow, align_corners):
    """F.interpolate(mode="bilinear", antialias=False): the width, then the height, in f32.
    Not jax.image.resize, which antialiases when it shrinks (PyTorch's default does not)."""
    y = x.astype(jnp.float32)
    for axis, n_out in ((3, ow), (2, oh)):
        i0, i1, l0, l1 = _bilinear_table(x.shape[axis], n_out, align_corners)
        view = (-1,) + (1,) * (3 - axis)
        y = jnp.take(y, i0, axis=axis) * l0.reshape(view) + jnp.take(y, i1, axis=axis) * l1.reshape(
            view
        )
    return y.astype(x.dtype)


def timestep_embedding(t, dim, flip, shift, max_period):
    """diffusers' get_timestep_embedding (linnet/ir/library_unet.py); [B, N] -> [B, N * dim]."""
    half = dim // 2  # the table as a constant, each step in f32 as diffusers takes it
    exponent = np.float32(-math.log(max_period)) * np.arange(half, dtype=np.float32)
    exponent = exponent / np.float32(half - shift)
    freqs = np.exp(exponent.astype(np.float64)).astype(np.float32)  # rounded once
    args = t.astype(jnp.float32)[..., None] * freqs
    parts = (jnp.cos(args), jnp.sin(args)) if flip else (jnp.sin(args), jnp.cos(args))
    return jnp.concatenate(parts, axis=-1).reshape(t.shape[0], -1)


# -- numerics="fast": XLA picks (default precision, jax.nn kernels) ------------------------
def _conv1d(x, w, stride, padding, precision):
    return lax.conv_general_dilated(
        x, w, (stride,), ((padding, padding),), dimension_numbers=("NCH", "OIH", "NCH"),
        precision=precision,
    )  # fmt: skip


def conv1d_ref(x, w, b=None, stride=1, padding=0):
    y = _conv1d(x, w, stride, padding, HIGHEST)
    return y if b is None else y + b[:, None]


def conv1d_fast(x, w, b=None, stride=1, padding=0):
    y = _conv1d(x, w, stride, padding, None)
    return y if b is None else y + b[:, None]


def conv_fast(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    y = _conv(x, w, stride, padding, None, dilation, groups)
    return y if b is None else y + b[:, None, None]


def batch_norm_fast(x, w, b, mean, var, eps):
    return batch_norm_ref(x, w, b, mean, var, eps)


def group_norm_fast(x, w, b, groups, eps):
    return group_norm_ref(x, w, b, groups, eps)


def linear_fast(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def rms_norm_fast(x, w, eps):
    var = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return x * lax.rsqrt(var + eps).astype(x.dtype) * w


def layer_norm_fast(x, w, b, eps):
    h = x.astype(jnp.float32)
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.var(h, axis=-1, keepdims=True)
    return ((h - mean) * lax.rsqrt(var + eps)).astype(x.dtype) * w + b


def softmax_fast(x, axis):
    return jax.nn.softmax(x, axis=axis)


def gelu_fast(x, approx):
    return jax.nn.gelu(x, approximate=approx == "tanh")


def rope_fast(x, cos, sin, offset):
    return rope_ref(x, cos, sin, offset)


def attention_fast(q, k, v, causal, q_offset, window, scale, key_mask=None, sinks=None):
    """jax.nn.dot_product_attention ([B, T, N, H] layout, GQA native); XLA picks the kernel."""
    if sinks is not None:  # no fused kernel takes sinks
        return attention_ref(q, k, v, causal, q_offset, window, scale, key_mask, sinks)
    s, t = q.shape[2], k.shape[2]
    mask = _mask(q_offset, s, t, window, causal) if causal or window else None
    if mask is not None:  # (1, 1, S, T), or (B, 1, S, T) per row
        mask = mask[:, None] if mask.ndim == 3 else mask[None, None]
    if key_mask is not None:  # (B, 1, 1, T) padding
        keep = key_mask[:, None, None, :] != 0
        mask = keep if mask is None else mask & keep
    out = jax.nn.dot_product_attention(
        jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), mask=mask, scale=scale
    )
    return jnp.swapaxes(out, 1, 2)  # (B, H, S, D)


# -- mixture of experts (GPT-OSS) ----------------------------------------------------------
def _clamped_swiglu(h, alpha, limit):
    """GPT-OSS's expert activation on gate/up interleaved along the last axis."""
    gate, up = jnp.minimum(h[..., 0::2], limit), jnp.clip(h[..., 1::2], -limit, limit)
    return (up + 1) * (gate * jax.nn.sigmoid(gate * alpha))


def moe_ref(x, router_w, router_b, w_in, b_in, w_out, b_out, top_k, alpha, limit):
    """Top-k routing, softmax over the chosen logits. Shapes are static under jit: with few
    tokens (decode) each token's experts are gathered (only their weights are read); with
    more, every expert runs once on all tokens and the routing weights (0 for the experts a
    token did not choose) sum them, which reads each expert once."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    logits = linear_ref(x2, router_w, router_b)
    top, idx = lax.top_k(logits, top_k)  # ties: the lower index first
    weights = softmax_ref(top, -1)  # (N, k)
    n, experts = x2.shape[0], w_in.shape[0]
    if n * top_k <= experts:
        h = jnp.einsum("nd,nkdf->nkf", x2, w_in[idx], precision=HIGHEST) + b_in[idx]
        y = jnp.einsum("nkf,nkfd->nkd", _clamped_swiglu(h, alpha, limit), w_out[idx],
                       precision=HIGHEST) + b_out[idx]  # fmt: skip
        return jnp.sum(y * weights[..., None], axis=1).reshape(shape)
    dense = jnp.zeros((n, experts), weights.dtype).at[jnp.arange(n)[:, None], idx].set(weights)
    h = jnp.einsum("nd,edf->enf", x2, w_in, precision=HIGHEST) + b_in[:, None]
    y = jnp.einsum("enf,efd->end", _clamped_swiglu(h, alpha, limit), w_out, precision=HIGHEST)
    y = y + b_out[:, None]
    return jnp.einsum("end,ne->nd", y, dense, precision=HIGHEST).reshape(shape)


def moe_fast(x, router_w, router_b, w_in, b_in, w_out, b_out, top_k, alpha, limit):
    return moe_ref(x, router_w, router_b, w_in, b_in, w_out, b_out, top_k, alpha, limit)


def nest_params(flat):
    """{"layers.0.wq": w, ...} -> {"layers": [{"wq": w, ...}, ...], ...}: the params pytree."""
    tree = {}
    for name, value in flat.items():
        *path, leaf = name.split(".")
        node = tree
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = value

    def lists(node):
        if not isinstance(node, dict):
            return node
        if node and all(k.isdigit() for k in node):
            return [lists(node[str(i)]) for i in range(len(node))]
        return {k: lists(v) for k, v in node.items()}

    return lists(tree)
