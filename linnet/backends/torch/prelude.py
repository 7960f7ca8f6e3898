"""Helpers that emitted PyTorch code calls: runtime guards and the library ops.

This module is copied verbatim into every generated source (`linnet torch`), so
generated code runs with torch alone; the interpreter imports it. The
`equivalent` helpers keep the reference numerics of `linnet/ir/library.py`
(f32 norms and softmax, rope tables in f32); `fast` ones use fused kernels.
Both are tested against the decompositions (tests/backends/test_torch_backend.py).
"""

import math

import torch
import torch.nn.functional as F


class GuardError(RuntimeError):
    """A `require` of the source failed at run time."""


def _guard(lhs, rhs, message, lhs_text, rhs_text, error=GuardError):
    if lhs > rhs:
        raise error(f"{message} failed: {lhs_text} = {lhs} > {rhs_text} = {rhs}")


# -- bf16/f16 linears on CPUs without bf16/f16 dot products ------------------------------
def _cpu_has_lowp_dot(dtype):
    """Whether this CPU multiplies `dtype` natively (AVX512-BF16, AMX, AVX512-FP16)."""
    cpu = getattr(torch, "cpu", None)
    probes = {
        torch.bfloat16: ("_is_avx512_bf16_supported", "_is_amx_tile_supported"),
        torch.float16: ("_is_avx512_fp16_supported", "_is_amx_fp16_supported"),
    }[dtype]
    return any(getattr(cpu, name, lambda: False)() for name in probes)


_LOWP_NATIVE = {dt: _cpu_has_lowp_dot(dt) for dt in (torch.bfloat16, torch.float16)}
_LOWP_MIN_ROWS = 16  # fewer rows: widening the weights costs more than the GEMM saves
_LOWP_CHUNK = 1 << 21  # weight elements widened at a time: 8 MB of f32, cache-sized
_LOWP_GEMV_ROWS = 8  # at most this many rows: Linnet's bf16 GEMV where it runs
try:  # Linnet's C++ kernels; a generated module run without linnet keeps torch's linear
    from linnet.backends.torch import kernels as _kernels
    from linnet.backends.torch.quantized import PackedWeight as _Packed
    from linnet.backends.torch.quantized import decode_linear as _decode_linear
    from linnet.backends.torch.quantized import packed_linear as _packed_linear
    from linnet.backends.torch.step_kernels import attend_cached as _attend_cached
    from linnet.backends.torch.step_kernels import bf16_ops as _bf16_ops
    from linnet.backends.torch.step_kernels import decode_attention as _decode_attention
    from linnet.backends.torch.step_kernels import ops_for as _step_ops
    from linnet.backends.torch.step_kernels import rows_attention as _rows_attention
except ImportError:
    _kernels = _Packed = _packed_linear = _decode_linear = None
    _step_ops = _bf16_ops = _decode_attention = _rows_attention = lambda *args: None
    _attend_cached = _step_ops


def linear_lowp(x, w, b=None):
    """x @ w^T + b for bf16/f16 x and w. Where the CPU has no bf16/f16 dot product, the
    native kernel widens every tile to f32 on each use and runs 3-4x slower than f32 GEMM;
    over many rows, widening each block of output features once and running f32 GEMM
    gives the same products (exact in f32) and f32 sums, rounded once to x's dtype."""
    rows = x.numel() // x.shape[-1]
    # without a bf16 dot product the GEMV kernel takes every batch below the widened GEMM's
    gemv_rows = _LOWP_GEMV_ROWS if _LOWP_NATIVE.get(x.dtype, True) else _LOWP_MIN_ROWS - 1
    if _kernels and rows <= gemv_rows and not torch.compiler.is_compiling():
        gemv = _kernels.bf16_linear_op(x, w)  # one pass over the bf16 w (AVX512-BF16 or AVX2)
        if gemv is not None:
            return gemv(x.reshape(rows, -1).contiguous(), w, b).reshape(*x.shape[:-1], -1)
    if 0 < rows < _LOWP_MIN_ROWS and x.is_cpu and not w.is_contiguous():
        # a column-major w (runners hold bf16 so): torch's linear copies it, 7x slower
        y = torch.stack([torch.mv(w, r) for r in x.reshape(rows, -1)])
        return (y if b is None else y + b).reshape(*x.shape[:-1], -1)
    if x.device.type != "cpu" or _LOWP_NATIVE[x.dtype] or rows < _LOWP_MIN_ROWS:
        return F.linear(x, w, b)
    x2 = x.reshape(rows, x.shape[-1]).float()
    out = torch.empty(rows, w.shape[0], dtype=x.dtype)
    step = max(1, _LOWP_CHUNK // w.shape[1])
    for lo in range(0, w.shape[0], step):  # w^T's columns: whole runs of either layout
        part = torch.mm(x2, w.t()[:, lo : lo + step].float())
        if b is not None:
            part += b[lo : lo + step]
        out[:, lo : lo + step] = part
    return out.reshape(*x.shape[:-1], w.shape[0])


def linear_fast(x, w, b=None):
    """F.linear; a packed weight's linear called straight (its `__torch_function__` hop,
    handler lookup and subclass guard cost ~5 us a call: 121 calls a SmolLM2 step).
    While torch.compile traces, F.linear: the subclass hop, as dynamo knows it."""
    if not torch.compiler.is_compiling() and type(w) is _Packed and not w.transposed:
        y = _decode_linear(x, w) if b is None and type(x) is torch.Tensor else None
        return _packed_linear(x, w, b) if y is None else y
    y = _kernels.f32_decode_linear(x, w, b) if _kernels and x.dtype == torch.float32 else None
    return F.linear(x, w, b) if y is None else y  # y: AMD CPUs (kernels/cpu_tuning.h)


# -- numerics="equivalent": the reference decompositions, op for op ----------------------
def rms_norm_ref(x, w, eps):
    h = x.float()
    h = h * (h * h).mean(-1, keepdim=True).add_(eps).rsqrt_()
    return w * h.to(x.dtype)


def layer_norm_ref(x, w, b, eps):
    h = x.float()
    centered = h - h.mean(-1, keepdim=True)
    var = (centered * centered).mean(-1, keepdim=True)
    return (centered * torch.rsqrt(var + eps)).to(x.dtype) * w + b


def softmax_ref(x, axis):
    h = x.float()
    e = torch.exp(h - h.amax(axis, keepdim=True))
    return (e / e.sum(axis, keepdim=True)).to(x.dtype)


def gelu_ref(x, approx):
    if approx == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (torch.tanh(inner) + 1.0)
    return x * 0.5 * (torch.erf(x * (1.0 / math.sqrt(2.0))) + 1.0)


def rope_tables(
    head_dim, positions, theta, scaling, factor, low_freq, high_freq, original_max, *yarn
):
    """cos, sin [positions, head_dim] in f32, as transformers builds them (sin signed for
    the first half: see `_rotation_tables`); `yarn`: beta_fast, beta_slow, truncate and the
    attention factor that scales both tables."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv = 1.0 / (theta**exponent)
    gain = yarn[3] if scaling == "yarn" else 1.0
    if scaling == "yarn":
        inv = _yarn_inv_freq(head_dim, theta, factor, original_max, exponent, *yarn[:3])
    if scaling == "llama3":
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > original_max / low_freq, inv / factor, inv)
        smooth = (original_max / wavelen - low_freq) / (high_freq - low_freq)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < original_max / high_freq) & ~(wavelen > original_max / low_freq)
        inv = torch.where(medium, smoothed, scaled)
    freqs = torch.arange(positions, dtype=torch.float32)[:, None] * inv[None, :]
    return _rotation_tables(torch.cos(freqs) * gain, torch.sin(freqs) * gain)


def _yarn_inv_freq(head_dim, theta, factor, original_max, exponent, beta_fast, beta_slow, truncate):
    """YaRN's blend of original and interpolated frequencies (see linnet/ir/library.py)."""
    pos_freqs = theta**exponent

    def correction_dim(rotations):
        return head_dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep


def _rotation_tables(cos, sin):
    """[N, D/2] tables -> cos repeated and sin signed, [N, D]: x * cos + swap_halves(x) * sin
    is then x1 cos - x2 sin, x2 cos + x1 sin, the same products and sums as two halves."""
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def _positions(offset, seq, device):
    """Positions offset..offset+seq, or `offset` itself when it is a tensor of positions."""
    if isinstance(offset, torch.Tensor):
        return offset
    return torch.arange(offset, offset + seq, device=device)


def write_rows(x, axis, row_axis, positions, update):
    """In place: x[.., r, .., positions[r, s], ..] = update[.., r, .., s, ..], each row r of
    `row_axis` at its own positions [R, S] along `axis`. One index_copy_ over x seen as rows
    of its axes after `axis`: CPU scatter_ on bf16 took ~140 ms per write into a 16-row
    SmolLM2 cache (index_copy_: ~20 us); scatter_ where x cannot be seen so."""
    lead = x.shape[:axis]
    flat = x.view(-1, *x.shape[axis + 1 :]) if row_axis < axis and _mergeable(x, axis) else None
    if flat is None:
        shape = [1] * x.dim()
        shape[row_axis], shape[axis] = positions.shape
        return x.scatter_(axis, positions.reshape(shape).expand_as(update), update)
    base = torch.arange(math.prod(lead), device=x.device).reshape(*lead, 1) * x.shape[axis]
    per_row = [positions.shape[0] if i == row_axis else 1 for i in range(axis)]
    index = base + positions.reshape(*per_row, positions.shape[1])
    return flat.index_copy_(0, index.reshape(-1), update.reshape(-1, *x.shape[axis + 1 :]))


def _mergeable(x, axis):
    """Whether x's axes 0..axis can be seen as one (a view, no copy)."""
    stride = x.stride(axis)
    for i in range(axis - 1, -1, -1):
        if x.shape[i] != 1 and x.stride(i) != stride * x.shape[i + 1]:
            return False
        stride = x.stride(i) if x.shape[i] != 1 else stride * x.shape[i + 1]
    return True


def _allowed(q_offset, s, t, window, device, causal=True):
    """[S, T] bool (or [B, 1, S, T] for per-row positions [B, S]): key position <= query
    position (and inside the window); without `causal`, keys within window // 2 of the
    query on either side."""
    qpos = _positions(q_offset, s, device)[..., None]
    if qpos.dim() == 3:
        qpos = qpos[:, None]  # (B, 1, S, 1): broadcast over heads
    kpos = torch.arange(t, device=device)[None, :]
    if not causal:
        return (kpos - qpos).abs() <= window // 2
    allowed = kpos <= qpos
    if window:
        allowed = allowed & (kpos > qpos - window)
    return allowed


def _masks_some(causal, q_offset, s, t, window):
    """Whether `_allowed` hides any key: not when every query sees keys 0..T-1 (a decode
    step of one token over the cache it has filled, inside the window)."""
    if not (causal or window):
        return False
    if isinstance(q_offset, torch.Tensor):
        return True
    last = q_offset + s - 1
    return t > q_offset + 1 or bool(window and last >= window)


def rope_ref(x, cos, sin, offset):
    """Half rotation of x [B, H, S, D] at positions offset..offset+S (or a positions tensor),
    with the [N, D] tables of `rope_tables`: x * cos + swap_halves(x) * sin."""
    seq, half = x.shape[2], x.shape[3] // 2
    if isinstance(offset, torch.Tensor):
        offset = offset.to(cos.device)  # layers split across devices: tables on the first
        c, s = cos[offset], sin[offset]
        if c.dim() == 3:  # per-row positions: (B, S, D) -> (B, 1, S, D)
            c, s = c[:, None], s[:, None]
    else:
        c, s = cos[offset : offset + seq], sin[offset : offset + seq]
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return (x * c.to(x.device, x.dtype)).add_(swapped.mul_(s.to(x.device, x.dtype)))


def _softmax_or_zero(x):
    """Softmax over the last axis of f32 x; a row with every key masked gives zeros."""
    top = x.amax(-1, keepdim=True)
    e = torch.exp(x - torch.where(top == -math.inf, 0.0, top))
    return e / e.sum(-1, keepdim=True).clamp(min=1e-30)


def attention_ref(q, k, v, causal, q_offset, window, scale, key_mask=None, sinks=None):
    """softmax(q k^T * scale + mask) v; GQA by folding each kv head's group of q heads into
    its rows (k and v are read where they lie, never repeated); `key_mask` [B, T]: keys
    where it is 0 are padding, attended by no query; `sinks` [H]: a logit per head added
    to each softmax's denominator."""
    b, h, s, d = q.shape
    kv, t = k.shape[1], k.shape[2]
    g = h // kv
    if b > 1:  # rows of a cache slice are strided: batched bf16 matmuls over them are slow
        k, v = k.contiguous(), v.contiguous()
    rows = q.reshape(b, kv, g * s, d)  # (B, KV, G*S, D)
    scores = torch.matmul(rows, k.transpose(-1, -2))  # (B, KV, G*S, T)
    scores = (scores * (scale if scale is not None else 1.0 / math.sqrt(d))).float()
    scores = scores.reshape(b, kv, g, s, t)
    if _masks_some(causal, q_offset, s, t, window):
        allowed = _allowed(q_offset, s, t, window, q.device, causal)
        if allowed.dim() == 4:  # per row (B, 1, S, T) -> (B, 1, 1, S, T)
            allowed = allowed[:, :, None]
        scores = scores.masked_fill(~allowed, -math.inf)
    if key_mask is not None:
        scores = scores.masked_fill(key_mask.reshape(b, 1, 1, 1, t) == 0, -math.inf)
        probs = _softmax_or_zero(scores).to(q.dtype)  # a query with no key left: zeros
    elif sinks is not None:
        sink = sinks.float().reshape(1, kv, g, 1, 1)
        top = torch.maximum(scores.amax(-1, keepdim=True), sink)
        e = torch.exp(scores - top)
        probs = (e / (e.sum(-1, keepdim=True) + torch.exp(sink - top))).to(q.dtype)
    elif scores.requires_grad:  # training: autograd keeps what the softmax read
        probs = softmax_ref(scores, -1).to(q.dtype)
    else:  # softmax_ref, in place on scores (a fresh f32 tensor here)
        scores.sub_(scores.amax(-1, keepdim=True)).exp_()
        probs = scores.div_(scores.sum(-1, keepdim=True)).to(q.dtype)
    out = torch.matmul(probs.reshape(b, kv, g * s, t), v)  # (B, KV, G*S, D)
    return out.reshape(b, h, s, d)


def batch_norm_ref(x, w, b, mean, var, eps):
    """x * scale + shift over axis 1, scale = w * rsqrt(var + eps), shift = b - mean * scale."""
    scale = w.float() * torch.rsqrt(var.float() + eps)
    shift = b.float() - mean.float() * scale
    view = (-1,) + (1,) * (x.dim() - 2)
    return (x.float() * scale.reshape(view) + shift.reshape(view)).to(x.dtype)


def group_norm_ref(x, w, b, groups, eps):
    """Each group of channels (with every later axis) centered and scaled in f32, then
    w and b per channel in f32, cast back once (linnet/ir/library.py: group_norm)."""
    h = x.float().reshape(x.shape[0], groups, -1)
    centered = h - h.mean(-1, keepdim=True)
    var = (centered * centered).mean(-1, keepdim=True)
    h = (centered * torch.rsqrt(var + eps)).reshape(x.shape)
    view = (-1,) + (1,) * (x.dim() - 2)
    return (h * w.float().reshape(view) + b.float().reshape(view)).to(x.dtype)


def timestep_embedding(t, dim, flip, shift, max_period):
    """diffusers' get_timestep_embedding, step for step (linnet/ir/library_unet.py);
    t [B, N] gives [B, N * dim]."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device)
    freqs = torch.exp(exponent / (half - shift))
    args = t.float().unsqueeze(-1) * freqs
    parts = (torch.cos(args), torch.sin(args)) if flip else (torch.sin(args), torch.cos(args))
    return torch.cat(parts, dim=-1).reshape(t.shape[0], -1)


# -- numerics="fast": fused kernels, lower precision allowed ------------------------------
def batch_norm_fast(x, w, b, mean, var, eps):
    return F.batch_norm(x, mean, var, w, b, False, 0.0, eps)


def group_norm_fast(x, w, b, groups, eps):
    return F.group_norm(x, groups, w, b, eps)


def _lowp_cpu(x):
    """A bf16/f16 CPU tensor: the step's norm and rope run the f32 C++ ops on it widened,
    with or without a bf16 dot product (F.rms_norm took ~50 us a bf16 decode call on the
    AVX2 EPYC and 13 on an AVX512-BF16 Xeon, the widened op 5-8; rope_ref in bf16 14 us
    there, the widened op 5.5)."""
    return x.dtype in _LOWP_NATIVE and x.is_cpu


_UNIT_WEIGHTS: dict = {}  # n -> f32 ones: the C++ norm's weight when w is applied after


def _rms_norm_lowp(x, w, eps):
    """A bf16/f16 CPU x normalised in f32 by the C++ op, rounded to x's dtype, then times w
    in x's dtype: rms_norm_ref's two roundings (transformers' too). Rounding once after w
    instead, or F.rms_norm in bf16, moved SmolLM2's bf16 logits past the entry's tolerance
    on an AVX512-BF16 Xeon (1.28-1.35 against 1.2); the C++ op is also faster than
    F.rms_norm there (7 against 13 us a decode call; ~50 on the AVX2 EPYC). None where
    the op does not apply."""
    xf = x.float()
    unit = _UNIT_WEIGHTS.get(x.shape[-1])
    if unit is None:
        unit = _UNIT_WEIGHTS[x.shape[-1]] = torch.ones(x.shape[-1])
    ops = _step_ops(xf, unit)
    return None if ops is None else w * ops.rms_norm(xf, unit, eps).to(x.dtype)


def rms_norm_fast(x, w, eps):
    ops = _step_ops(x, w)
    if ops is not None:
        return ops.rms_norm(x, w, eps)  # one pass: 61 calls of a SmolLM2 step
    if w.dtype == torch.bfloat16 and (bf16 := _bf16_ops(x, w)) is not None:
        return bf16.rms_norm_bf16(x, w, eps)  # _rms_norm_lowp's bits in one call
    if _lowp_cpu(x) and w.dtype == x.dtype:
        out = _rms_norm_lowp(x, w, eps)
        if out is not None:
            return out
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def layer_norm_fast(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rope_fast(x, cos, sin, offset):
    ops = None if type(offset) is not int else _step_ops(x, cos)
    if ops is not None and sin.dtype == torch.float32:
        return ops.rope(x, cos, sin, offset)  # rope_ref's products and sums, one call
    # bf16 rounded once after the f32 sums: closer to f32 than rope_ref's three roundings
    # in bf16, and SmolLM2's bf16 logits no further from transformers' (0.50 against 0.67)
    if type(offset) is int and _lowp_cpu(x) and cos.dtype == sin.dtype == torch.float32:
        if (bf16 := _bf16_ops(x)) is not None:
            return bf16.rope(x, cos, sin, offset)  # widened in the op
        xf = x.float()
        if _step_ops(xf, cos) is not None:
            return _kernels.step_ops().rope(xf, cos, sin, offset).to(x.dtype)
    return rope_ref(x, cos, sin, offset)


def attention_fast(q, k, v, causal, q_offset, window, scale, key_mask=None, sinks=None):
    out = _decode_attention(q, k, v, causal, q_offset, window, scale, key_mask, sinks)
    if out is None:
        out = _rows_attention(q, k, v, causal, q_offset, window, scale, key_mask, sinks)
    if out is not None:
        return out
    if sinks is not None:  # no fused kernel takes sinks
        return attention_ref(q, k, v, causal, q_offset, window, scale, key_mask, sinks)
    s, t = q.shape[2], k.shape[2]
    if s == 1 and q.device.type == "cpu" and q.dtype in _LOWP_NATIVE and not _LOWP_NATIVE[q.dtype]:
        # one query over a bf16/f16 cache: the f32 kernel is 2-4x faster on such CPUs
        out = attention_fast(
            q.float(), k.float(), v.float(), causal, q_offset, window, scale, key_mask
        )
        return out.to(q.dtype)
    static = isinstance(q_offset, torch.Tensor)  # keys cover the whole cache: mask them
    if window or static or (causal and s > 1 and t != s) or key_mask is not None:
        mask = torch.ones(s, t, dtype=torch.bool, device=q.device)
        if causal or window:
            mask = _allowed(q_offset, s, t, window, q.device, causal)
        if key_mask is not None:  # (B, 1, 1, T) padding, broadcast over heads and queries
            mask = mask & (key_mask[:, None, None, :] != 0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    # decode of one token sees every cached key; a square prefill is plain causal
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True if causal and s > 1 else False, scale=scale, enable_gqa=True
    )


# -- mixture of experts (GPT-OSS): only the chosen experts' weights are read -----------------
def _clamped_swiglu(h, alpha, limit):
    """GPT-OSS's expert activation on gate/up interleaved along the last axis."""
    gate, up = h[..., 0::2].clamp(max=limit), h[..., 1::2].clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def moe_ref(x, router_w, router_b, w_in, b_in, w_out, b_out, top_k, alpha, limit):
    """Route each token to its top_k experts (softmax over their logits) and sum their
    outputs. Few tokens (decode): each token's experts' weights gathered by index_select;
    more: a loop over the experts some token chose, each on its tokens (as transformers)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    top, idx = torch.topk(F.linear(x2, router_w, router_b), top_k, dim=-1)
    weights = softmax_ref(top, -1)  # (N, k)
    n = x2.shape[0]
    fused = getattr(w_in, "moe_few_tokens", None)  # MXFP4 experts: one C++ call a step
    y = fused and fused(x2, idx, weights, b_in, w_out, b_out, alpha, limit)
    if y is not None:
        return y.to(x.dtype).reshape(shape)
    if n * top_k <= w_in.shape[0] and x.device.type != "cpu":
        flat = idx.reshape(-1)
        rows = x2.repeat_interleave(top_k, 0)[:, None]  # (N*k, 1, D)
        h = torch.bmm(rows, w_in.index_select(0, flat))[:, 0] + b_in.index_select(0, flat)
        act = _clamped_swiglu(h, alpha, limit)[:, None]
        y = torch.bmm(act, w_out.index_select(0, flat))[:, 0] + b_out.index_select(0, flat)
        return (y.reshape(n, top_k, -1) * weights[..., None]).sum(1).reshape(shape)
    out = torch.zeros_like(x2)
    for e in torch.unique(idx).tolist():
        tokens, slot = torch.where(idx == e)
        h = x2[tokens] @ w_in[e] + b_in[e]
        y = _clamped_swiglu(h, alpha, limit) @ w_out[e] + b_out[e]
        out.index_add_(0, tokens, y * weights[tokens, slot, None])
    return out.reshape(shape)


def moe_fast(x, router_w, router_b, w_in, b_in, w_out, b_out, top_k, alpha, limit):
    """moe_ref; a decode step's f32 MXFP4 experts take the whole op in one C++ call (router,
    top-k, softmax, the experts on x rounded to int8 per block: kernels/mxfp4_int8.cpp)."""
    routed = getattr(w_in, "moe_routed", None)
    if routed and x.dtype == torch.float32 and not (torch.is_grad_enabled() and x.requires_grad):
        args = (router_w, router_b, top_k, b_in, w_out, b_out, alpha, limit)
        y = routed(x.reshape(-1, x.shape[-1]), *args)  # None: not a case it runs
        if y is not None:
            return y.reshape(x.shape)
    return moe_ref(x, router_w, router_b, w_in, b_in, w_out, b_out, top_k, alpha, limit)


# -- layers split across devices, weights streamed from host memory (issue 19) -------------
_COPY_STREAMS = {}  # device -> its side stream for weight copies


def move_to(x, device):
    """x on `device`, where a pipeline hands activations over; a copy even on x's own
    device, so a split over `cpu,cpu` runs the same hand-overs (docs/parallel.md). A
    Python number (a scalar constant of generated code) is on every device."""
    if not isinstance(x, torch.Tensor):
        return x
    y = x.to(device)
    return y.clone() if y is x else y


def prefetch_to(x, device):
    """Start copying host weights x to `device` (on CUDA: from pinned memory, on a side
    stream, while the compute stream runs the layer before); `await_copy` before use."""
    device = torch.device(device)
    if device.type != "cuda":
        return x.to(device, copy=True)
    stream = _COPY_STREAMS.get(device)
    if stream is None:
        stream = _COPY_STREAMS[device] = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        y = x.to(device, non_blocking=True)
        y._linnet_copied = torch.cuda.Event()
        y._linnet_copied.record(stream)
    return y


def await_copy(x):
    """x once its `prefetch_to` copy has landed: the compute stream waits for it, and the
    allocator keeps its memory until the compute stream is done with it."""
    event = getattr(x, "_linnet_copied", None)
    if event is not None:
        current = torch.cuda.current_stream(x.device)
        current.wait_event(event)
        x.record_stream(current)
    return x
