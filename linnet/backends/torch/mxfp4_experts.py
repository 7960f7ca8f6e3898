"""GPT-OSS's expert weights kept as MXFP4 blocks at run time (issue 16).

    w = Mxfp4Experts.build(blocks, scales, dtype=torch.float32)  # [E, K, R], x @ w[e]
    x @ w[e]            # one expert: Linnet's C++ kernel (mxfp4_gemv.cpp) or the fallback
    w.dequantize()      # the reference: every weight E2M1[code] * 2^(scale - 127), in f32

An `Mxfp4Experts` is a tensor subclass with the logical shape and dtype of the dense experts
(`[..., G * 32, R]`, the layout transformers' GPT-OSS experts use) holding the checkpoint's
`_blocks` (uint8 `[..., R, G, 16]`, two e2m1 codes a byte, low nibble first) and `_scales`
(uint8 `[..., R, G]`, e8m0): 4.25 bits a weight instead of 32. `__torch_function__` answers
what the `moe` op's PyTorch code asks of it: an integer index or an `index_select` of experts
stays packed, and `x @ w[e]` runs `mxfp4_linear`; anything else sees the dequantized tensor
(correct, not fast).

A batch of up to KERNEL_MAX_ROWS rows on the CPU runs the C++ kernel (each weight looked up
in `VALUES`, the reference's values bit for bit, multiplied by x in f32 and summed in f32);
larger batches, other devices and machines without the kernels (`LINNET_KERNELS=0`)
dequantize that one expert and multiply (the chosen experts only, never all of them).
"""

from __future__ import annotations

import numpy as np
import torch

from linnet.backends.torch import kernels
from linnet.backends.torch.packed_tensor import PackedTensor, device_and_dtype

KERNEL_MAX_ROWS = 64  # tokens on one expert above this: dequantize it and let MKL multiply
BLOCK = 32
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
# VALUES[s, c]: code c's value at scale byte s, as the reference's ldexp rounds it (scale
# 0 is subnormal, 255 gives +-inf and 0 for the zero codes)
with np.errstate(over="ignore"):
    VALUES = np.ldexp(np.concatenate([_E2M1, -_E2M1])[None, :], np.arange(256)[:, None] - 127)
VALUES = VALUES.astype(np.float32)
_tables: dict = {}  # device -> VALUES as a tensor


def values_table(device) -> torch.Tensor:
    key = str(device)
    if key not in _tables:
        _tables[key] = torch.from_numpy(VALUES.copy()).to(device)
    return _tables[key]


class Mxfp4Experts(PackedTensor):
    """MXFP4 weights in their packed form; see the module docstring."""

    @staticmethod
    def __new__(cls, blocks, scales, dtype):
        *lead, rows, groups, _ = blocks.shape
        shape = (*lead, groups * BLOCK, rows)
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=blocks.device)

    def __init__(self, blocks, scales, dtype):
        self.blocks, self.scales = blocks, scales

    @classmethod
    def build(cls, blocks: torch.Tensor, scales: torch.Tensor, dtype=torch.float32):
        """blocks uint8 [..., R, G, 16] and scales uint8 [..., R, G], as a checkpoint stores
        them; builds (or loads) the kernels now, not during the first decode step."""
        if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
            raise TypeError("MXFP4 blocks and scales are uint8")
        if blocks.dim() < 3 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
            raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)}, scales {tuple(scales.shape)}")
        if blocks.device.type == "cpu":
            kernels.load()
        return cls(blocks.contiguous(), scales.contiguous(), dtype)

    def _with(self, blocks, scales, dtype=None):
        return Mxfp4Experts(blocks, scales, dtype or self.dtype)

    def __repr__(self):
        return f"Mxfp4Experts(shape={tuple(self.shape)}, {self.dtype})"

    @property
    def nbytes_packed(self) -> int:
        return self.blocks.numel() + self.scales.numel()

    def dequantize(self) -> torch.Tensor:
        """The dense weights [..., G * 32, R] in f32, exactly the reference's values."""
        with torch._C.DisableTorchFunctionSubclass():
            return _dequantize(self.blocks, self.scales)

    def dense(self) -> torch.Tensor:
        return self.dequantize().to(self.dtype)

    def moe_few_tokens(self, x, idx, gate, b_in, w_out, b_out, alpha, limit):
        """The moe op's experts for a decode step, self being its `w_in`: token n's experts
        idx[n, j] weighted by gate[n, j], in one call of `mxfp4_moe` (no Python per expert);
        None where it does not apply (see `_fused_moe_ops`): the caller's loop runs."""
        with torch._C.DisableTorchFunctionSubclass():
            ops = _fused_moe_ops(x, idx, self, w_out)
            if ops is None:
                return None
            return ops.mxfp4_moe(
                x.contiguous(), idx.contiguous(), gate.float().contiguous(), self.blocks,
                self.scales, b_in.float().contiguous(), w_out.blocks, w_out.scales,
                b_out.float().contiguous(), values_table(x.device), float(alpha), float(limit),
            )  # fmt: skip

    def moe_routed(self, x, router_w, router_b, top_k, b_in, w_out, b_out, alpha, limit):
        """The whole moe op for a decode step under numerics="fast", self being its `w_in`:
        the router, top-k and softmax and the experts with x rounded to int8 per block, in
        one call of `mxfp4_moe_routed`; None where it does not apply (the caller's path runs)."""
        with torch._C.DisableTorchFunctionSubclass():
            if x.dtype != torch.float32 or x.dim() != 2 or x.shape[0] * top_k > self.shape[0]:
                return None
            ops = _kernel_ops(x.shape[0], x.device, self)
            routed = self._routed_weights(router_w, router_b, b_in, w_out, b_out)
            if ops is None or routed is None:
                return None
            router, experts = routed
            return ops.mxfp4_moe_routed(
                x.contiguous(), *router, top_k, *experts, float(alpha), float(limit)
            )

    def _routed_weights(self, router_w, router_b, b_in, w_out, b_out):
        """`mxfp4_moe_routed`'s weight arguments ((router_w, router_b), then the experts'
        seven), or None where the op does not take these weights. Checked once and kept while
        the same f32 contiguous tensors come back: a decode step asks once a layer, and each
        Python call here runs slowly, right after the experts' kernel has evicted the
        interpreter from the caches (~20 us a layer of checks and conversions before)."""
        key = (router_w, router_b, b_in, w_out, b_out)
        seen = self.__dict__.get("_routed")
        if seen is not None and all(a is b for a, b in zip(seen[0], key)) and _still_f32(key):
            return seen[1]
        if not _fused_weights(router_w, router_b, self, w_out):
            return None
        router = (router_w.contiguous(), router_b.float().contiguous())
        b_in, b_out = b_in.float().contiguous(), b_out.float().contiguous()
        table = values_table(self.blocks.device)
        experts = (self.blocks, self.scales, b_in, w_out.blocks, w_out.scales, b_out, table)
        if all(a is b for a, b in zip((*router, b_in, b_out), key[:3] + key[4:])):  # no copies
            self.__dict__["_routed"] = (key, (router, experts))
        return router, experts


def _still_f32(weights) -> bool:
    """Whether the kept tensors are still f32 (`param.data = ...` can swap a tensor's dtype
    under the same Python object); contiguity is checked again by the op itself."""
    router_w, router_b, b_in, _, b_out = weights
    return router_w.dtype == router_b.dtype == b_in.dtype == b_out.dtype == torch.float32


def _fused_weights(router_w, router_b, w_in, w_out) -> bool:
    """The routed op's weights: an f32 router with a bias, both experts packed 3-D on the CPU."""
    if router_b is None or router_w.dtype != torch.float32 or not _packed_pair(w_in, w_out):
        return False
    return w_in.blocks.is_cpu and w_out.blocks.is_cpu


def _packed_pair(w_in, w_out) -> bool:
    """Both expert weights packed 3-D (experts, ...), the first with f32 as its logical dtype:
    what the fused ops read."""
    if not isinstance(w_out, Mxfp4Experts) or w_in.dim() != 3 or w_out.dim() != 3:
        return False
    return w_in.dtype == torch.float32


def _dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    table = values_table(blocks.device)[scales.long()]  # (..., R, G, 16): this block's values
    even = torch.gather(table, -1, (blocks & 15).long())
    odd = torch.gather(table, -1, (blocks >> 4).long())
    rows = torch.stack([even, odd], dim=-1).reshape(*scales.shape[:-1], -1)  # (..., R, K)
    return rows.transpose(-1, -2)


def mxfp4_matmul(x: torch.Tensor, w: Mxfp4Experts) -> torch.Tensor:
    """x [..., K] @ w [K, R] (one expert) with f32 sums, in x's dtype."""
    with torch._C.DisableTorchFunctionSubclass():
        rows = x.numel() // x.shape[-1]
        x2 = x.reshape(rows, x.shape[-1]).float().contiguous()
        ops = _kernel_ops(rows, x2.device, w)
        if ops is not None:
            y = ops.mxfp4_linear(x2, w.blocks, w.scales, values_table(x2.device))
        else:
            y = x2 @ _dequantize(w.blocks, w.scales)
        return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])


def _kernel_ops(rows: int, device, w: Mxfp4Experts):
    if rows > KERNEL_MAX_ROWS or device.type != "cpu" or not w.blocks.is_cpu:
        return None
    return kernels.step_ops()  # load()'s answer, its checks redone only when a switch changed


def _fused_moe_ops(x, idx, w_in, w_out):
    """The kernels for f32 tokens on the CPU, at most one expert's worth of work per expert
    (tokens * top_k <= experts: each token reads its own experts), both weights packed 3-D."""
    if not _packed_pair(w_in, w_out) or x.dtype != torch.float32 or x.dim() != 2:
        return None
    if idx is not None and idx.numel() > w_in.shape[0]:
        return None
    return _kernel_ops(x.shape[0], x.device, w_in)


def _getitem(w, index):
    """Experts by integer or slice on the leading axes stay packed."""
    parts = index if isinstance(index, tuple) else (index,)
    lead = w.dim() - 2
    if len(parts) > lead or not all(isinstance(p, (int, slice)) for p in parts):
        return NotImplemented
    if any(isinstance(p, slice) and p.step not in (None, 1) for p in parts):
        return NotImplemented
    return w._with(w.blocks[index], w.scales[index])


def _index_select(w, dim, index):
    if not isinstance(w, Mxfp4Experts) or dim % w.dim() >= w.dim() - 2:
        return NotImplemented
    return w._with(w.blocks.index_select(dim, index), w.scales.index_select(dim, index))


def _matmul(x, w):
    if isinstance(x, Mxfp4Experts) or not isinstance(w, Mxfp4Experts) or w.dim() != 2:
        return NotImplemented
    return mxfp4_matmul(x, w)


def _to(w, *args, **kwargs):
    device, dtype = device_and_dtype(args, kwargs)
    if dtype is not None and not dtype.is_floating_point:
        return NotImplemented
    if device is None:
        return w._with(w.blocks, w.scales, dtype)
    return w._with(w.blocks.to(device), w.scales.to(device), dtype)


def _same(w, *args, **kwargs):
    return w


def _numpy(w, *args, **kwargs):
    return w.dequantize().to(w.dtype).numpy()


_HANDLERS = {
    torch.Tensor.__getitem__: _getitem,
    torch.index_select: _index_select,
    torch.Tensor.index_select: _index_select,
    torch.matmul: _matmul,
    torch.Tensor.matmul: _matmul,
    torch.Tensor.__matmul__: _matmul,
    torch.Tensor.to: _to,
    torch.Tensor.cpu: lambda w: _to(w, "cpu"),
    torch.Tensor.detach: _same,
    torch.Tensor.contiguous: _same,
    torch.Tensor.requires_grad_: _same,
    torch.Tensor.numpy: _numpy,
}
Mxfp4Experts.handlers = _HANDLERS
