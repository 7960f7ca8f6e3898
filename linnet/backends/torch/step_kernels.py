"""Calls of Linnet's decode-step C++ ops (kernels/decode_ops.cpp) for the prelude's `fast`
helpers: each answers None where its op does not apply (dtype, device, shapes, autograd,
torch.compile tracing) and the helper runs its PyTorch path. A generated module run
without linnet imports none of this and always takes that path.
"""

from __future__ import annotations

import math

import torch

from linnet.backends.torch import kernels


def ops_for(x, w):
    """Linnet's C++ ops of a decode step (kernels/decode_ops.cpp) for f32 CPU tensors
    outside torch.compile (Inductor fuses these ops itself) and autograd; else None.
    Called ~150 times a step: cheap checks only (`x.device.type` alone costs ~1 us)."""
    if x.dtype != torch.float32 or w.dtype != torch.float32:
        return None
    if not x.is_cpu or torch.compiler.is_compiling():
        return None
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return None
    return kernels.step_ops()


def bf16_ops(x, *others):
    """The step ops for bf16 CPU tensors the ops read as they lie, widening each element
    (the norm and rope, a decode step's cache); None where `ops_for` would say None."""
    if x.dtype != torch.bfloat16 or not x.is_cpu or torch.compiler.is_compiling():
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *others)):
        return None
    return kernels.step_ops()


def decode_attention(q, k, v, causal, q_offset, window, scale, key_mask, sinks):
    """A decode step's attention in one C++ call: one query at position q_offset (an int:
    not per-row positions) over the cache's keys 0..q_offset (a window's last `window` of
    them), no padding mask; None where that is not the case. f32, or bf16: the query
    widened, the cache read as it lies, the result rounded once (12.6 against 35 us a call
    of torch's bf16 SDPA on an AVX512-BF16 Xeon, docs/torch.md)."""
    if key_mask is not None or not causal or type(q_offset) is not int:
        return None
    t = k.shape[2]
    if t != q_offset + 1 or q.shape[2] != 1 or not q.dtype == k.dtype == v.dtype:
        return None
    ops = ops_for(q, k) if q.dtype == torch.float32 else bf16_ops(q, k, v)
    if ops is None:
        return None
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[3])
    start = t - window if window and t > window else 0
    sinks = None if sinks is None else sinks.float().contiguous()
    if q.dtype == torch.float32:
        return ops.decode_attention(q, k, v, scale, start, sinks)
    return ops.decode_attention(q.float(), k, v, scale, start, sinks).to(q.dtype)


def rows_attention(q, k, v, causal, q_offset, window, scale, key_mask, sinks):
    """A step over cache rows in one C++ call: one f32 query per row at its own position
    (q_offset [B, 1]), each row attending its own keys only (none of the longer rows'
    reach the causal mask would hide); None where that is not the case."""
    if key_mask is not None or not causal or not isinstance(q_offset, torch.Tensor):
        return None
    if q.shape[2] != 1 or q_offset.numel() != q.shape[0] or v.dtype != torch.float32:
        return None
    ops = ops_for(q, k)
    if ops is None:
        return None
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[3])
    sinks = None if sinks is None else sinks.float().contiguous()
    return ops.decode_attention_rows(q, k, v, scale, q_offset.reshape(-1), window or 0, sinks)


def attend_cached(
    y, lo, heads, cos, sin, at, k_cache, v_cache, window, scale, sinks=None, norms=None
):
    """A decode layer's attention from its fused qkv output in one C++ call (what
    `step_fusion` emits): y [B, 1, W] with q, k and v at columns `lo` (a triple), the new
    k (normalised by `norms`' k weights and rotated where `cos` is given) and v written to
    the caches at row `at`, q normalised and rotated alike, each head over keys 0..at (a
    window's last `window` of them), the heads merged, [B, 1, H * D]. `norms`: (q weights,
    k weights, eps) of a per-head RMSNorm before the rope (Qwen3), in y's dtype. f32, or
    bf16 (the cache as it lies). None where that is not the case (a prompt, per-row
    positions, another dtype): the generated code then runs the separate ops."""
    if type(at) is not int or y.dim() != 3 or y.shape[1] != 1 or y.stride(2) != 1:
        return None
    if not y.dtype == k_cache.dtype == v_cache.dtype:
        return None
    if y.dtype == torch.float32:
        ops = ops_for(y, k_cache)
    else:
        ops = bf16_ops(y, k_cache, v_cache)
    if ops is None or (cos is not None and cos.dtype != torch.float32):
        return None
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or at >= k_cache.shape[2]:
        return None
    q_norm, k_norm, eps = norms if norms is not None else (None, None, 0.0)
    if norms is not None and not (q_norm.dtype == k_norm.dtype == y.dtype):
        return None  # the separate norms take another path then (prelude.rms_norm_fast)
    t = at + 1
    scale = scale if scale is not None else 1.0 / math.sqrt(k_cache.shape[3])
    start = t - window if window and t > window else 0
    sinks = None if sinks is None else sinks.float().contiguous()
    return ops.attend_cached(
        y, *lo, heads, cos, sin, at, k_cache, v_cache, scale, start, sinks, q_norm, k_norm, eps
    )
