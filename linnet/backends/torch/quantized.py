"""Weight-only quantized linears: q8_0, q4_0, q4_K and q5_0 weights kept packed.

    w = PackedWeight.build("q4_k", codes, scale, offset, dtype=torch.float32)
    F.linear(x, w)          # runs `packed_linear`: never the whole f32 weight at once
    w.dequantize()          # the reference: every element scale * code + offset, in f32

A `PackedWeight` is a tensor subclass with the logical shape (rows, cols) and the model's
dtype, holding int8 codes (q8_0) or two 4-bit codes per byte (the low nibbles a row's
first half, the high ones its second; q5_0 then each row's fifth bits), and one f32 scale
(and offset) per 32 elements.
It goes wherever a param goes
(the interpreter's folded transpose, `load_state_dict`, `fuse_linears`' stacking), and
`__torch_function__` answers what a weight meets: `F.linear` and `matmul` against its
transpose run `packed_linear`; row slices, `cat` and a transpose stay packed; row
gathers (an embedding) dequantize the rows taken; anything else sees the dequantized
tensor (correct, not fast).

Batches of up to KERNEL_MAX_ROWS rows (decode) run Linnet's C++ kernel
(`kernels/packed_gemv.cpp`: one pass over the packed weights on both cores, each weight
dequantized in registers exactly as the reference does and multiplied by x in f32). Larger
batches, and machines where the kernel cannot build or run (or `LINNET_KERNELS=0`), take
the PyTorch path: a block of output rows at a time dequantized (scale * code) into a reused
f32 buffer and multiplied by x in f32 (MKL), the 4-bit offsets applied to x's group sums
instead of to every weight (one small matmul). Either way sums are f32 (the reference's up
to summation order) and the result is cast to x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linnet.backends.torch import kernels
from linnet.backends.torch.packed_tensor import PackedTensor, device_and_dtype

GROUP = 32  # elements per scale
_DERIVED_OFFSETS = ("q4_0", "q5_0")  # offsets -8 and -16 times the scale
KERNEL_MAX_ROWS = 64  # batches above this take the dequantize-then-GEMM path (MKL)
_CHUNK = 1 << 18  # weight elements dequantized at a time: 1 MB of f32, L2-sized
_buffers: dict = {}  # (device, dtype, elements) -> reused scratch


class PackedWeight(PackedTensor):
    """A quantized 2-D weight in its packed form; see the module docstring."""

    @staticmethod
    def __new__(cls, kind, codes, scale, offset, dtype, transposed):
        shape = (codes.shape[0], scale.shape[1] * GROUP)
        return torch.Tensor._make_wrapper_subclass(
            cls, shape[::-1] if transposed else shape, dtype=dtype, device=codes.device
        )

    def __init__(self, kind, codes, scale, offset, dtype, transposed):
        self.kind, self.codes, self.scale, self.offset = kind, codes, scale, offset
        self.transposed = transposed  # the interpreter's folded transpose of a linear
        self.int8_x = False  # numerics="fast": x may be rounded to int8 (the VNNI kernel)
        parts = (codes, scale) if offset is None else (codes, scale, offset)
        # what the C++ kernels take (checked once here, not on every call)
        self.kernel_ready = all(p.device.type == "cpu" and p.is_contiguous() for p in parts)

    @classmethod
    def build(cls, kind, codes, scale, offset=None, *, dtype=torch.float32):
        if codes.device.type == "cpu":  # build or load the kernels now, not while
            kernels.load()  # torch.compile traces the first linear
        return cls(kind, codes, scale, offset, dtype, False)

    def _with(self, codes, scale, offset, *, transposed=False, dtype=None):
        out = PackedWeight(self.kind, codes, scale, offset, dtype or self.dtype, transposed)
        out.int8_x = self.int8_x
        return out

    def __repr__(self):
        return f"PackedWeight({self.kind}, rows={self.rows}, cols={self.cols}, {self.dtype})"

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    @property
    def cols(self) -> int:
        return self.scale.shape[1] * GROUP

    @property
    def nbytes_packed(self) -> int:
        parts = (self.codes, self.scale, self.offset)
        return sum(p.numel() * p.element_size() for p in parts if p is not None)

    def dequantize_rows(self, lo=0, hi=None, out=None, offset=True) -> torch.Tensor:
        """Rows lo:hi in f32 (into `out` when given); offset=False leaves out the
        4-bit types' offsets (scale * code only). Codes widen and scale in one pass."""
        hi = self.rows if hi is None else hi
        n, groups = hi - lo, self.cols // GROUP
        out = torch.empty(n, self.cols, device=self.codes.device) if out is None else out
        codes, scale = self.codes[lo:hi], self.scale[lo:hi, :, None]
        ops = None if self.kind == "q8_0" else self._row_ops(out)
        if self.kind == "q8_0":
            torch.mul(codes.view(n, groups, GROUP), scale, out=out.view(n, groups, GROUP))
        elif ops is not None:  # 4- and 5-bit rows in one pass, in C++
            one_pass = ops.q5_0_scaled_codes if self.kind == "q5_0" else ops.q4_scaled_codes
            one_pass(codes, self.scale[lo:hi], out)
        elif self.kind == "q5_0":
            codes = self._q5_codes(codes)
            torch.mul(codes.view(n, groups, GROUP), scale, out=out.view(n, groups, GROUP))
        elif groups % 2 == 0:  # each row's low nibbles are its first half of groups
            tmp = _scratch(codes.numel(), codes.device, torch.uint8)[: codes.numel()]
            tmp, half = tmp.view(n, groups // 2, GROUP), groups // 2
            halves = out.view(n, 2, half, GROUP)
            torch.bitwise_and(codes.view(n, half, GROUP), 0x0F, out=tmp)
            torch.mul(tmp, scale[:, :half], out=halves[:, 0])
            torch.bitwise_right_shift(codes.view(n, half, GROUP), 4, out=tmp)
            torch.mul(tmp, scale[:, half:], out=halves[:, 1])
        else:  # a group straddles the two halves: widen first, then scale
            out[:, : self.cols // 2].copy_(codes & 0x0F)
            out[:, self.cols // 2 :].copy_(codes >> 4)
            out.view(n, groups, GROUP).mul_(scale)
        if offset and self.offset is not None:
            out.view(n, groups, GROUP).add_(self.offset[lo:hi, :, None])
        return out

    def _row_ops(self, out: torch.Tensor):
        """The kernels for dequantize_rows' 4- and 5-bit one pass (CPU, out contiguous, not
        while torch.compile traces); None: the PyTorch ops below."""
        if torch.compiler.is_compiling() or not self.codes.is_cpu or not out.is_contiguous():
            return None
        return kernels.load()

    def _q5_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """q5_0 rows (nibbles, then fifth bits in element order) as uint8 codes 0..31."""
        half = self.cols // 2
        nibbles, plane = codes[:, :half], codes[:, half:]
        bits = (plane[:, :, None] >> torch.arange(8, dtype=torch.uint8, device=codes.device)) & 1
        low = torch.cat([nibbles & 0x0F, nibbles >> 4], 1)
        return low | (bits.reshape(len(codes), self.cols) << 4)

    def dequantize(self) -> torch.Tensor:
        """The whole weight in f32 (the reference decomposition's weight)."""
        with torch._C.DisableTorchFunctionSubclass():
            return self.dequantize_rows()

    def dense(self) -> torch.Tensor:
        dense = self.dequantize_rows().to(self.dtype)
        return dense.t() if self.transposed else dense


def _scratch(elements: int, device, dtype=torch.float32) -> torch.Tensor:
    """A reused buffer: fresh allocations of this size page-fault on every call."""
    key = (str(device), dtype, elements)
    buf = _buffers.get(key)
    if buf is None:
        buf = _buffers[key] = torch.empty(elements, device=device, dtype=dtype)
    return buf


def _offset_terms(x2: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """(rows of w, rows of x): sum over groups of offset * (sum of x over the group), the
    4-bit types' offsets applied once to x instead of to every weight element."""
    # Sum along x's own layout: a prefill's down projection gets x column-major (a blocked
    # linear's result is `out_t.t()`), and summing across it took 4.8 ms for 512 x 1536
    # where along it takes 0.15.
    groups = w.cols // GROUP
    if x2.t().is_contiguous():
        sums = x2.t().reshape(groups, GROUP, len(x2)).sum(1)
    else:
        sums = x2.reshape(len(x2), groups, GROUP).sum(-1).t()
    return torch.mm(w.offset, sums)


def packed_linear(x: torch.Tensor, w: PackedWeight, b=None) -> torch.Tensor:
    """x @ dequantize(w)^T + b, with f32 sums, in x's dtype: Linnet's C++ kernel for small
    batches where it runs (`kernels.load()`), else `w` dequantized a block of rows at a time.
    Decode calls this ~120 times a step, so the common case (f32 x, contiguous parts) makes
    no copies and as few Python calls as it can."""
    with torch._C.DisableTorchFunctionSubclass():
        xf = x if x.dtype == torch.float32 else x.float()
        y = None
        if xf.numel() <= KERNEL_MAX_ROWS * w.cols and w.kernel_ready and xf.device.type == "cpu":
            # the kernels take x (..., cols) and give (..., rows); None: they do not run here
            y = _kernel_linear(xf if xf.is_contiguous() else xf.contiguous(), w)
        if y is None:
            y = _blocked_linear(xf.reshape(-1, w.cols), w).reshape(*x.shape[:-1], w.rows)
        if b is not None:
            y = y + b.float()
        return y if y.dtype == x.dtype else y.to(x.dtype)


def decode_linear(x: torch.Tensor, w: PackedWeight):
    """A decode step's packed linear straight to the C++ op, or None where `packed_linear`'s
    other paths apply: plain f32 contiguous CPU x of at most KERNEL_MAX_ROWS rows, no bias.
    With x and the weight's parts plain tensors, no torch-function guard or cast is needed:
    9.3 -> ~5 us a call, 121 calls a SmolLM2 step."""
    if (
        x.dtype is not torch.float32
        or not x.is_cpu
        or not w.kernel_ready
        or x.numel() > KERNEL_MAX_ROWS * w.cols
        or not x.is_contiguous()
    ):
        return None
    return _kernel_linear(x, w)


def _kernel_linear(x: torch.Tensor, w: PackedWeight):
    """The integer kernel (x rounded to int8 per 32-block) for a weight that allows it,
    where the CPU has VNNI and the rows suit it (4-bit: whole 64-blocks); else the f32 one;
    None where neither runs (each asks `kernels.load()` once: it reads the environment)."""
    if w.int8_x and (w.offset is None or w.cols % 64 == 0):
        int8x = kernels.int8x_linear_op()
        if int8x is not None:
            derived = w.kind in _DERIVED_OFFSETS and kernels.int8x_derived_offsets()
            return int8x(x, w.codes, w.scale, None if derived else w.offset)
    ops = kernels.load()
    return None if ops is None else ops.packed_linear(x, w.codes, w.scale, w.offset)


def allow_int8_activations(params: dict, numerics: str) -> None:
    """Under numerics="fast" the packed weights among `params` may run the integer kernel
    (x quantized per 32-block as ggml's q8_0 activations); "equivalent" keeps f32 x."""
    for p in params.values():
        if isinstance(p, PackedWeight):
            p.int8_x = numerics == "fast"


def _blocked_linear(x2: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """The PyTorch path: blocks of rows dequantized (scale * code) into one reused buffer,
    each multiplied by x; the 4-bit offsets applied to x's group sums (in f32). In f32,
    or in bf16 where `_bf16_blocks` says so."""
    step = max(1, min(w.rows, _CHUNK // w.cols))
    buf = _scratch(step * w.cols, x2.device)
    low = _bf16_blocks(x2, w)
    xs = x2.to(torch.bfloat16) if low else x2
    low_buf = _scratch(len(buf), x2.device, torch.bfloat16) if low else None
    if w.offset is None:  # rows of the result contiguous, one block at a time
        out_t = torch.empty(w.rows, len(x2), device=x2.device)
    else:
        out_t = _offset_terms(x2, w)
    for lo in range(0, w.rows, step):
        hi = min(lo + step, w.rows)
        rows = buf[: (hi - lo) * w.cols].view(hi - lo, w.cols)
        chunk = w.dequantize_rows(lo, hi, out=rows, offset=False)
        if low:  # scale * code rounded to bf16, f32 sums, the block's result in bf16
            chunk = low_buf[: chunk.numel()].view_as(rows).copy_(rows)
            part = torch.mm(chunk, xs.t())
            if w.offset is None:
                out_t[lo:hi].copy_(part)
            else:
                out_t[lo:hi].add_(part)
        elif w.offset is None:
            torch.mm(chunk, x2.t(), out=out_t[lo:hi])
        else:
            out_t[lo:hi].addmm_(chunk, x2.t())
    return out_t.t()


# AVX512-BF16 or AMX: torch's bf16 GEMM runs on the CPU's own dot products (prelude's
# `_cpu_has_lowp_dot` asks the same probes; prelude runs standalone, so it cannot import this)
_BF16_DOT = any(
    getattr(getattr(torch, "cpu", None), probe, lambda: False)()
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
)
BF16_MIN_ROWS = 16  # fewer: rounding the block to bf16 costs more than the GEMM saves


def _bf16_blocks(x2: torch.Tensor, w: PackedWeight) -> bool:
    """Whether the blocked path multiplies in bf16: under numerics="fast" (`w.int8_x`: x
    may be rounded, as the integer kernel rounds it to int8), on a CPU with bf16 dot
    products, for a batch of BF16_MIN_ROWS or more (a prefill). On the Zen 4 EPYC a
    512-token q8_0 prefill's 1536x576 linear took 5.0 ms in bf16 blocks against 9.5 in f32
    (bench/prefill_linear.py; docs/torch.md, "Session 23"); the error is of the order of
    the integer kernel's."""
    return w.int8_x and _BF16_DOT and x2.is_cpu and len(x2) >= BF16_MIN_ROWS


def _linear(x, w, b=None):
    if not isinstance(w, PackedWeight) or w.transposed or isinstance(x, PackedWeight):
        return NotImplemented
    return packed_linear(x, w, b)


def _matmul(x, w):
    if not isinstance(w, PackedWeight) or not w.transposed or isinstance(x, PackedWeight):
        return NotImplemented
    return packed_linear(x, w._with(w.codes, w.scale, w.offset))


def _transpose_2d(w, *dims):
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    if w.dim() != 2 or (dims and sorted(d % 2 for d in dims) != [0, 1]):
        return NotImplemented
    return w._with(w.codes, w.scale, w.offset, transposed=not w.transposed)


def _getitem(w, index):
    if w.transposed:
        return NotImplemented
    if isinstance(index, tuple) and len(index) == 1:
        index = index[0]
    if isinstance(index, slice) and index.step in (None, 1):
        off = None if w.offset is None else w.offset[index]
        return w._with(w.codes[index], w.scale[index], off)
    if isinstance(index, torch.Tensor) and not index.dtype.is_floating_point:
        flat = index.reshape(-1)  # an embedding: dequantize the rows taken
        off = None if w.offset is None else w.offset[flat]
        dense = w._with(w.codes[flat], w.scale[flat], off).dequantize_rows()
        return dense.to(w.dtype).reshape(*index.shape, w.cols)
    return NotImplemented


def _cat(tensors, dim=0, **kwargs):
    parts = list(tensors)
    if dim != 0 or not all(isinstance(t, PackedWeight) and not t.transposed for t in parts):
        return NotImplemented
    if len({(t.kind, t.cols, t.dtype) for t in parts}) != 1:
        return NotImplemented
    offsets = None if parts[0].offset is None else torch.cat([t.offset for t in parts])
    return parts[0]._with(
        torch.cat([t.codes for t in parts]), torch.cat([t.scale for t in parts]), offsets
    )


def _to(w, *args, **kwargs):
    device, dtype = device_and_dtype(args, kwargs)
    if dtype is not None and not dtype.is_floating_point:
        return NotImplemented
    move = (lambda t: t) if device is None else (lambda t: None if t is None else t.to(device))
    return w._with(
        move(w.codes), move(w.scale), move(w.offset), transposed=w.transposed, dtype=dtype
    )


def _same(w, *args, **kwargs):
    return w


_HANDLERS = {
    F.linear: _linear,
    torch._C._nn.linear: _linear,
    torch.matmul: _matmul,
    torch.Tensor.matmul: _matmul,
    torch.Tensor.permute: _transpose_2d,
    torch.permute: _transpose_2d,
    torch.Tensor.t: _transpose_2d,
    torch.Tensor.transpose: _transpose_2d,
    torch.Tensor.__getitem__: _getitem,
    torch.cat: _cat,
    torch.Tensor.to: _to,
    torch.Tensor.detach: _same,
    torch.Tensor.contiguous: _same,
    torch.Tensor.requires_grad_: _same,
}
PackedWeight.handlers = _HANDLERS
