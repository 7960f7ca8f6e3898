"""Core-IR decompositions of the library ops: the numerical reference.

`numerics=equivalent` runs exactly these: norms and softmax in f32, rope tables
built in f32 at compile time, the attention mask from position compares.
Each function receives a builder `b` and the op's inputs and attrs, and emits
primitives only.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from linnet.core.dims import Poly
from linnet.ir.library_moe import moe
from linnet.ir.library_resize import resize_bilinear
from linnet.ir.library_sam import conv_transpose
from linnet.ir.library_unet import timestep_embedding

F32 = "f32"


def _const(b, value, dtype: str):
    return b.add("const", [], value=np.asarray(value, dtype=np.float64), dtype=dtype)


def _axis_last(b, x):
    return len(b.type_of(x).shape) - 1


def linear(b, x, w, bias=None):
    rank = len(b.type_of(w).shape)
    wt = b.add("transpose", [w], perm=tuple(range(rank - 2)) + (rank - 1, rank - 2))
    y = b.add("matmul", [x, wt])
    return y if bias is None else b.add("add", [y, bias])


def rms_norm(b, x, w, *, eps):
    dtype = b.type_of(x).dtype
    h = b.add("cast", [x], dtype=F32)
    var = b.add("reduce_mean", [b.add("mul", [h, h])], axis=-1)
    h = b.add("mul", [h, b.add("rsqrt", [b.add("add", [var, _const(b, eps, F32)])])])
    return b.add("mul", [w, b.add("cast", [h], dtype=dtype)])


def layer_norm(b, x, w, bias, *, eps):
    dtype = b.type_of(x).dtype
    h = b.add("cast", [x], dtype=F32)
    centered = b.add("sub", [h, b.add("reduce_mean", [h], axis=-1)])
    var = b.add("reduce_mean", [b.add("mul", [centered, centered])], axis=-1)
    h = b.add("mul", [centered, b.add("rsqrt", [b.add("add", [var, _const(b, eps, F32)])])])
    h = b.add("cast", [h], dtype=dtype)
    return b.add("add", [b.add("mul", [h, w]), bias])


def softmax(b, x, *, axis=-1):
    dtype = b.type_of(x).dtype
    h = b.add("cast", [x], dtype=F32)
    e = b.add("exp", [b.add("sub", [h, b.add("reduce_max", [h], axis=axis)])])
    p = b.add("div", [e, b.add("reduce_sum", [e], axis=axis)])
    return b.add("cast", [p], dtype=dtype)


def silu(b, x):
    return b.add("mul", [x, b.add("sigmoid", [x])])


def gelu(b, x, *, approx="none"):
    dtype = b.type_of(x).dtype
    half = b.add("mul", [x, _const(b, 0.5, dtype)])
    if approx == "tanh":
        cube = b.add("mul", [b.add("mul", [x, x]), x])
        inner = b.add("add", [x, b.add("mul", [cube, _const(b, 0.044715, dtype)])])
        inner = b.add("mul", [inner, _const(b, math.sqrt(2.0 / math.pi), dtype)])
        gate = b.add("tanh", [inner])
    else:
        gate = b.add("erf", [b.add("mul", [x, _const(b, 1.0 / math.sqrt(2.0), dtype)])])
    return b.add("mul", [half, b.add("add", [gate, _const(b, 1.0, dtype)])])


def rope_inv_freq(
    head_dim: int,
    theta: float,
    scaling: str,
    factor: float,
    low_freq: float,
    high_freq: float,
    original_max: int,
    **yarn,
) -> np.ndarray:
    """Inverse frequencies in f32, as transformers computes them (llama3 and yarn included)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    if scaling == "yarn":
        return yarn_inv_freq(head_dim, theta, factor, original_max, exponent, **yarn)
    inv = (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)
    if scaling != "llama3":
        return inv
    low_wavelen = original_max / low_freq
    high_wavelen = original_max / high_freq
    wavelen = (2 * math.pi / inv).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv)
    smooth = (original_max / wavelen - low_freq) / (high_freq - low_freq)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def yarn_inv_freq(head_dim, theta, factor, original_max, exponent, *, beta_fast, beta_slow,
                  truncate, attn_factor):  # fmt: skip
    """YaRN (transformers' `_compute_yarn_parameters`): each frequency blends the original
    (extrapolation) and the one divided by `factor` (interpolation) by a linear ramp over the
    dims whose rotations in `original_max` positions lie between beta_slow and beta_fast."""
    f32 = np.float32
    pos_freqs = np.power(f32(theta), exponent).astype(f32)
    extrapolation = (f32(1.0) / pos_freqs).astype(f32)
    interpolation = (f32(1.0) / (f32(factor) * pos_freqs)).astype(f32)

    def correction_dim(rotations):
        return head_dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = (np.arange(head_dim // 2, dtype=f32) - f32(low)) / f32(high - low)
    keep = (f32(1.0) - np.clip(ramp, 0, 1)).astype(f32)  # 1: extrapolate (high frequencies)
    return (interpolation * (f32(1.0) - keep) + extrapolation * keep).astype(f32)


def yarn_attn_factor(factor: float) -> float:
    """YaRN's default scale of cos and sin: 0.1 ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


@functools.lru_cache(maxsize=16)
def rope_tables(head_dim: int, positions: int, **spec) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [positions, head_dim / 2], computed in f32. Cached: every rope
    of a model shares one pair (a graph has two ropes per layer; do not write to them)."""
    inv = rope_inv_freq(head_dim, **spec)
    freqs = np.arange(positions, dtype=np.float32)[:, None] * inv[None, :]
    gain = np.float32(spec.get("attn_factor", 1.0))  # yarn scales both tables
    return (np.cos(freqs) * gain).astype(np.float32), (np.sin(freqs) * gain).astype(np.float32)


def rope(
    b,
    x,
    at=None,
    *,
    offset,
    positions,
    theta,
    scaling,
    factor,
    low_freq,
    high_freq,
    original_max,
    **yarn,
):
    t = b.type_of(x)
    bsz, heads, seq, dim = t.shape
    half = dim.value // 2
    cos, sin = rope_tables(
        dim.value,
        positions,
        theta=theta,
        scaling=scaling or "default",
        factor=factor,
        low_freq=low_freq,
        high_freq=high_freq,
        original_max=original_max,
        **yarn,
    )
    rows = {}
    for name, table in (("cos", cos), ("sin", sin)):
        c = b.add("const", [], value=table, dtype=F32)
        if at is None:
            c = b.add("slice", [c], starts=(offset, Poly.const(0)), stops=(offset + seq, half))
        else:  # positions as a tensor: gather the rows ([S], or [B, S] per row)
            c = b.add("take", [c, at])
            if len(b.type_of(at).shape) == 2:  # (B, S, D/2) -> (B, 1, S, D/2)
                c = b.add("reshape", [c], shape=(bsz, Poly.const(1), seq, Poly.const(half)))
        rows[name] = b.add("cast", [c], dtype=t.dtype)  # (S, D/2) broadcasts over B, H
    zero = Poly.const(0)
    x1 = b.add("slice", [x], starts=(zero,) * 4, stops=(bsz, heads, seq, Poly.const(half)))
    x2 = b.add(
        "slice", [x], starts=(zero, zero, zero, Poly.const(half)), stops=(bsz, heads, seq, dim)
    )
    out1 = b.add("sub", [b.add("mul", [x1, rows["cos"]]), b.add("mul", [x2, rows["sin"]])])
    out2 = b.add("add", [b.add("mul", [x2, rows["cos"]]), b.add("mul", [x1, rows["sin"]])])
    return b.add("concat", [out1, out2], axis=-1)


def attention(
    b, q, k, v, *extra, causal=True, q_offset=0, window=0, scale=None, masked=False, sinks=False
):
    """`extra`: the key padding mask when `masked`, the sinks when `sinks`, then the query
    positions if given."""
    rest = list(extra)
    key_mask = rest.pop(0) if masked else None
    sink = rest.pop(0) if sinks else None
    q_positions = rest[0] if rest else None
    qt, kt = b.type_of(q), b.type_of(k)
    bsz, heads, seq, dim = qt.shape
    kv_heads, keys = kt.shape[1], kt.shape[2]
    groups = heads.value // kv_heads.value
    one = Poly.const(1)
    q5 = b.add("reshape", [q], shape=(bsz, kv_heads, Poly.const(groups), seq, dim))
    k5 = b.add("reshape", [k], shape=(bsz, kv_heads, one, keys, dim))
    v5 = b.add("reshape", [v], shape=(bsz, kv_heads, one, keys, dim))
    kT = b.add("transpose", [k5], perm=(0, 1, 2, 4, 3))
    scores = b.add("matmul", [q5, kT])  # (B, KV, G, S, T)
    scale = scale if scale is not None else 1.0 / math.sqrt(dim.value)
    scores = b.add("mul", [scores, _const(b, scale, qt.dtype)])
    scores = b.add("cast", [scores], dtype=F32)
    if causal or window:
        if q_positions is None:
            q_positions = b.add("iota", [], length=seq, start=Poly.lift(q_offset), dtype="i64")
        per_row = len(b.type_of(q_positions).shape) == 2  # [B, S]: a position per row
        qshape = (bsz, one, one, seq, one) if per_row else (seq, one)
        qpos = b.add("reshape", [q_positions], shape=qshape)
        kpos = b.add(
            "reshape",
            [b.add("iota", [], length=keys, start=Poly.const(0), dtype="i64")],
            shape=(one, keys),
        )
        allowed = _band(b, qpos, kpos, causal, window)
        scores = b.add("where", [allowed, scores, _const(b, -math.inf, F32)])
    if key_mask is not None:  # padding: no query attends to a masked key
        keep = _nonzero(b, key_mask)
        keep = b.add("reshape", [keep], shape=(bsz, one, one, one, keys))  # (B, 1, 1, 1, T)
        scores = b.add("where", [keep, scores, _const(b, -math.inf, F32)])
        probs = b.add("cast", [_softmax_or_zero(b, scores)], dtype=qt.dtype)
    elif sink is not None:
        sink = b.add("reshape", [sink], shape=(one, kv_heads, Poly.const(groups), one, one))
        probs = b.add("cast", [_softmax_with_sink(b, scores, sink)], dtype=qt.dtype)
    else:
        probs = b.add("cast", [softmax(b, scores, axis=-1)], dtype=qt.dtype)
    out = b.add("matmul", [probs, v5])  # (B, KV, G, S, D)
    return b.add("reshape", [out], shape=(bsz, heads, seq, dim))


def _softmax_with_sink(b, scores, sink):
    """Softmax of f32 scores over the last axis with one more logit per head in the
    denominator (the sink, GPT-OSS): exp(s - m) / (sum exp(s - m) + exp(sink - m)), m the
    max over the scores and the sink, as transformers' concatenate-then-softmax."""
    sink = b.add("cast", [sink], dtype=F32)
    top = b.add("maximum", [b.add("reduce_max", [scores], axis=-1), sink])
    e = b.add("exp", [b.add("sub", [scores, top])])
    total = b.add(
        "add", [b.add("reduce_sum", [e], axis=-1), b.add("exp", [b.add("sub", [sink, top])])]
    )
    return b.add("div", [e, total])


def _softmax_or_zero(b, scores):
    """Softmax of f32 scores over the last axis; a row whose keys are all masked (a pad
    query whose local window holds only padding) gives zeros, not NaN, which would reach
    the real rows through the next layer (0 * NaN). Rows with a key are unchanged: their
    max is finite and their sum >= 1."""
    top = b.add("reduce_max", [scores], axis=-1)
    top = b.add("where", [b.add("eq", [top, _const(b, -math.inf, F32)]), _const(b, 0.0, F32), top])
    e = b.add("exp", [b.add("sub", [scores, top])])
    total = b.add("maximum", [b.add("reduce_sum", [e], axis=-1), _const(b, 1e-30, F32)])
    return b.add("div", [e, total])


def _band(b, qpos, kpos, causal, window):
    """Keys each query may see: causal, k <= q and (window) k > q - window; bidirectional
    (window only), |q - k| <= window // 2 (ModernBERT's local attention)."""

    def shifted(op, by):
        return b.add(op, [qpos, b.add("const", [], value=np.asarray(by), dtype="i64")])

    if not causal:
        lo, hi = shifted("sub", window // 2), shifted("add", window // 2)
        return b.add("logical_and", [b.add("ge", [kpos, lo]), b.add("le", [kpos, hi])])
    allowed = b.add("le", [kpos, qpos])
    if window:
        allowed = b.add("logical_and", [allowed, b.add("gt", [kpos, shifted("sub", window)])])
    return allowed


def _windows(b, x, kernel: tuple[int, int], stride: int, padding: int, value: float, dilation=1):
    """Every kernel offset (i, j) of x [B, C, H, W] padded by `value`: a list of the
    strided views [B, C, OH, OW] that offset sees, row-major over the kernel; a dilated
    kernel's offset (i, j) starts at (i * dilation, j * dilation)."""
    bsz, ch, h, w = b.type_of(x).shape
    if padding:
        pads = ((0, 0), (0, 0), (padding, padding), (padding, padding))
        x = b.add("pad", [x], pads=pads, value=value)
    oh = (h + 2 * padding - dilation * (kernel[0] - 1) - 1).floordiv(stride) + 1
    ow = (w + 2 * padding - dilation * (kernel[1] - 1) - 1).floordiv(stride) + 1
    views = []
    for i in range(0, dilation * kernel[0], dilation):
        for j in range(0, dilation * kernel[1], dilation):
            starts = (0, 0, i, j)
            stops = (bsz, ch, i + stride * (oh - 1) + 1, j + stride * (ow - 1) + 1)
            views.append(
                b.add("slice", [x], starts=starts, stops=stops, steps=(1, 1, stride, stride))
            )
    return views, oh, ow


def conv(b, x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1):
    """im2col: the kernel's views of x stacked on the channel axis, then one matmul with w
    flattened to [O, C * KH * KW] (patches that tile the input: reshape, no copies). With
    groups, the columns are [B, groups, C / groups * KH * KW, OH * OW] and w is
    [groups, O / groups, C / groups * KH * KW]: one batched matmul over the groups."""
    bsz, ch, h, wd = b.type_of(x).shape
    out_ch, _, kh, kw = (d.value for d in b.type_of(w).shape)
    k = ch * kh * kw
    if stride == kh == kw and not padding and dilation == groups == 1:  # ViT patches
        oh, ow = h.floordiv(kh), wd.floordiv(kw)
        if oh * kh != h or ow * kw != wd:
            x = b.add("slice", [x], starts=(0, 0, 0, 0), stops=(bsz, ch, oh * kh, ow * kw))
        x = b.add("reshape", [x], shape=(bsz, ch, oh, kh, ow, kw))
        x = b.add("transpose", [x], perm=(0, 2, 4, 1, 3, 5))  # (B, OH, OW, C, KH, KW)
        cols = b.add("reshape", [x], shape=(bsz, oh * ow, k))
        y = linear(b, cols, b.add("reshape", [w], shape=(out_ch, k)), bias)  # (B, OH*OW, O)
        y = b.add("transpose", [y], perm=(0, 2, 1))
        return b.add("reshape", [y], shape=(bsz, out_ch, oh, ow))
    views, oh, ow = _windows(b, x, (kh, kw), stride, padding, 0.0, dilation)
    if groups == 1:
        cols = [b.add("reshape", [v], shape=(bsz, ch, 1, oh * ow)) for v in views]
        cols = cols[0] if len(cols) == 1 else b.add("concat", cols, axis=2)  # (B, C, KH*KW, OH*OW)
        cols = b.add("reshape", [cols], shape=(bsz, k, oh * ow))
        y = b.add("matmul", [b.add("reshape", [w], shape=(out_ch, k)), cols])  # (B, O, OH*OW)
    else:
        y = _grouped_matmul(b, views, w, groups, (bsz, ch, oh * ow))
    if bias is not None:
        y = b.add("add", [y, b.add("reshape", [bias], shape=(out_ch, 1))])
    return b.add("reshape", [y], shape=(bsz, out_ch, oh, ow))


def _grouped_matmul(b, views, w, groups: int, sizes):
    """The columns of each group times that group's rows of w -> (B, O, OH * OW)."""
    bsz, ch, n = sizes
    out_ch, per_group, kh, kw = (d.value for d in b.type_of(w).shape)
    g = Poly.const(groups)
    cols = [b.add("reshape", [v], shape=(bsz, g, per_group, 1, n)) for v in views]
    cols = cols[0] if len(cols) == 1 else b.add("concat", cols, axis=3)  # (B, G, C/G, KK, N)
    cols = b.add("reshape", [cols], shape=(bsz, g, per_group * kh * kw, n))
    w = b.add("reshape", [w], shape=(g, out_ch // groups, per_group * kh * kw))
    y = b.add("matmul", [w, cols])  # (B, G, O / G, N)
    return b.add("reshape", [y], shape=(bsz, Poly.const(out_ch), n))


def conv1d(b, x, w, bias=None, *, stride=1, padding=0):
    """im2col over one axis: each kernel offset's strided view of x [B, C, T] (zero padded)
    stacked on the channel axis, then one matmul with w flattened to [O, C * K]."""
    bsz, ch, t = b.type_of(x).shape
    out_ch, _, kernel = (d.value for d in b.type_of(w).shape)
    if padding:
        x = b.add("pad", [x], pads=((0, 0), (0, 0), (padding, padding)), value=0.0)
    out_t = (t + 2 * padding - kernel).floordiv(stride) + 1
    cols = []
    for j in range(kernel):
        stops = (bsz, ch, j + stride * (out_t - 1) + 1)
        view = b.add("slice", [x], starts=(0, 0, j), stops=stops, steps=(1, 1, stride))
        cols.append(b.add("reshape", [view], shape=(bsz, ch, 1, out_t)))
    cols = cols[0] if kernel == 1 else b.add("concat", cols, axis=2)  # (B, C, K, T')
    cols = b.add("reshape", [cols], shape=(bsz, ch * kernel, out_t))
    y = b.add("matmul", [b.add("reshape", [w], shape=(out_ch, ch * kernel)), cols])
    if bias is not None:
        y = b.add("add", [y, b.add("reshape", [bias], shape=(out_ch, 1))])
    return y  # (B, O, T')


def max_pool(b, x, *, kernel, stride=1, padding=0):
    views, _, _ = _windows(b, x, (kernel, kernel), stride, padding, -math.inf)
    out = views[0]
    for v in views[1:]:
        out = b.add("maximum", [out, v])
    return out


def batch_norm(b, x, w, bias, mean, var, *, eps):
    """y = x * scale + shift with scale = w * rsqrt(var + eps), shift = b - mean * scale,
    all in f32 (PyTorch's inference kernel computes the same two terms). scale and shift
    read params only: the interpreter folds them once at load."""
    t = b.type_of(x)
    w, bias, mean, var = (b.add("cast", [p], dtype=F32) for p in (w, bias, mean, var))
    scale = b.add("mul", [w, b.add("rsqrt", [b.add("add", [var, _const(b, eps, F32)])])])
    shift = b.add("sub", [bias, b.add("mul", [mean, scale])])
    channel = (t.shape[1],) + (Poly.const(1),) * (t.rank - 2)  # (C, 1, 1) broadcasts
    scale, shift = (b.add("reshape", [p], shape=channel) for p in (scale, shift))
    y = b.add("add", [b.add("mul", [b.add("cast", [x], dtype=F32), scale]), shift])
    return b.add("cast", [y], dtype=t.dtype)


# -- image ops beyond convolution (issue 15): group norm, nearest upsampling -------------
def group_norm(b, x, w, bias, *, groups, eps):
    """x [B, C, ...] as [B, groups, C / groups * rest]: each group centered and scaled by
    rsqrt(var + eps) in f32 (two passes, as layer_norm), then w and b per channel in f32,
    cast back once (PyTorch's kernel applies the affine in f32 too)."""
    t = b.type_of(x)
    bsz, ch, *rest = t.shape
    per_group = ch.exact_div(groups)
    for d in rest:
        per_group = per_group * d
    h = b.add("cast", [x], dtype=F32)
    h = b.add("reshape", [h], shape=(bsz, Poly.const(groups), per_group))
    centered = b.add("sub", [h, b.add("reduce_mean", [h], axis=-1)])
    var = b.add("reduce_mean", [b.add("mul", [centered, centered])], axis=-1)
    h = b.add("mul", [centered, b.add("rsqrt", [b.add("add", [var, _const(b, eps, F32)])])])
    h = b.add("reshape", [h], shape=t.shape)
    channel = (ch,) + (Poly.const(1),) * (t.rank - 2)  # (C, 1, 1) broadcasts over H, W
    w, bias = (b.add("reshape", [b.add("cast", [p], dtype=F32)], shape=channel) for p in (w, bias))
    return b.add("cast", [b.add("add", [b.add("mul", [h, w]), bias])], dtype=t.dtype)


def upsample_nearest(b, x, *, scale):
    """Each pixel repeated scale x scale times: [B, C, H, 1, W, 1] broadcast to
    [B, C, H, scale, W, scale], then merged (no arithmetic, so exact)."""
    bsz, ch, h, w = b.type_of(x).shape
    one, k = Poly.const(1), Poly.const(scale)
    x = b.add("reshape", [x], shape=(bsz, ch, h, one, w, one))
    x = b.add("broadcast", [x], shape=(bsz, ch, h, k, w, k))
    return b.add("reshape", [x], shape=(bsz, ch, h * scale, w * scale))


def _nonzero(b, x):
    """A bool tensor: x itself when it is bool, else x != 0."""
    dtype = b.type_of(x).dtype
    if dtype == "bool":
        return x
    return b.add("ne", [x, b.add("const", [], value=np.asarray(0), dtype=dtype)])


DECOMPOSITIONS = {
    "linear": linear,
    "rms_norm": rms_norm,
    "layer_norm": layer_norm,
    "softmax": softmax,
    "silu": silu,
    "gelu": gelu,
    "rope": rope,
    "attention": attention,
    "conv": conv,
    "conv1d": conv1d,
    "max_pool": max_pool,
    "batch_norm": batch_norm,
    "group_norm": group_norm,
    "upsample_nearest": upsample_nearest,
    "resize_bilinear": resize_bilinear,
    "moe": moe,
    "timestep_embedding": timestep_embedding,
    "conv_transpose": conv_transpose,
}
