"""Casting weights in numpy, bit-exact with torch: f32, f16 and bf16 (as uint16 bits).

    cast(x, "bf16")                       # a new array of bf16 bits (round to nearest even)
    for block in blocks(tensor_info): ... # a safetensors tensor in flat blocks, from its file
    write_converted(x, "f16", f.write)    # convert and write block by block
    to_torch(x), from_torch(t)            # bf16 bits <-> torch.bfloat16

numpy has no bfloat16: a bf16 array here is its raw bits in a `uint16` array (no model
holds real uint16 tensors). Casts run in cache-sized blocks, rounding like torch. The
dtype names come from the one table, `linnet.core.dtypes`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np

from linnet.core.dtypes import DTYPES as DTYPE_TABLE
from linnet.core.dtypes import FLOAT_DTYPES
from linnet.errors import CheckpointError

DTYPES = FLOAT_DTYPES
# numpy arrays hold bf16 as raw uint16 bits (see the module docstring)
NP_DTYPES = {n: np.dtype(np.uint16 if n == "bf16" else DTYPE_TABLE[n].numpy) for n in DTYPES}
ST_NAMES = {n: DTYPE_TABLE[n].safetensors for n in DTYPES}  # safetensors dtype names
ST_DTYPES = {v: k for k, v in ST_NAMES.items()}
HF_NAMES = {n: DTYPE_TABLE[n].hf for n in DTYPES}  # config.json `dtype`
CHUNK_ELEMENTS = 1 << 18  # casts run in blocks this size (they stay in cache)
CAST_THREADS = min(4, os.cpu_count() or 1)  # threads for casts of large tensors


def dtype_name(x) -> str:
    """f32 / f16 / bf16 for a numpy array (bf16: uint16 bits)."""
    for name, dt in NP_DTYPES.items():
        if x.dtype == dt:
            return name
    raise TypeError(f"not a float tensor Linnet exports: {x.dtype}")


# ----------------------------------------------------------------------------------------
# Casting (numpy, bit-exact with torch's conversions)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = 0x7FC0  # torch's NaN
    return rounded


def _bf16_to_f32(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.uint32) << 16).view(np.float32)


def _cast_block(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    if src == "bf16":
        x = _bf16_to_f32(x)
    if dst == "bf16":
        return _f32_to_bf16(x)
    with np.errstate(over="ignore"):  # out of f16 range: inf, as torch gives
        return x.astype(NP_DTYPES[dst])


def _bf16_to_f16_into(b: np.ndarray, out: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> None:
    """bf16 bits -> f16 bits in integer ops (no f32 pass). Inside f16's normal range
    (2^-14 <= |x| < 2^16, bf16 exponent 113..142) the value is exact: rebias the exponent
    (-112) and widen the mantissa (7 -> 10 bits). Anything else (subnormal, zero, overflow,
    inf, NaN) takes the f32 route, which rounds as torch does."""
    np.bitwise_and(b, 0x7FFF, out=s1)
    np.subtract(s1, 0x3880, out=s1)  # exponent 113 -> 0; below wraps past 0x0EFF
    np.left_shift(s1, 3, out=out)
    np.add(out, 0x400, out=out)  # (e - 112) << 10 | m << 3
    np.bitwise_and(b, 0x8000, out=s2)
    np.bitwise_or(out, s2, out=out)
    bad = s1 > 0x0EFF
    if bad.any():
        out[bad] = _cast_block(b[bad], "bf16", "f16").view(np.uint16)


def cast(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` (f32, f16 or bf16 bits) as `dtype`: a new array unless the dtype already
    matches."""
    if dtype_name(x) == dtype:
        return x
    out = np.empty(x.shape, NP_DTYPES[dtype])
    cast_into(x, out)
    return out


def cast_into(x: np.ndarray, out: np.ndarray) -> None:
    """Convert `x` into the preallocated `out` (same shape; any of f32, f16, bf16 bits),
    in cache-sized blocks, split between threads for large tensors (numpy's loops release
    the GIL). `out` may be a map of the output file: the data is then written once."""
    src, dst = dtype_name(x), dtype_name(out)
    if tuple(x.shape) != tuple(out.shape):
        raise ValueError(f"cast_into: shape {x.shape} into {out.shape}")
    flat = np.ascontiguousarray(x).reshape(-1)
    dest = out.reshape(-1)
    step = CHUNK_ELEMENTS

    def run(lo: int, hi: int) -> None:
        if src == dst:
            dest[lo:hi] = flat[lo:hi]
        elif src == "bf16" and dst == "f16":
            bits = dest.view(np.uint16)
            s1, s2 = np.empty(step, np.uint16), np.empty(step, np.uint16)
            for i in range(lo, hi, step):
                n = min(step, hi - i)
                _bf16_to_f16_into(flat[i : i + n], bits[i : i + n], s1[:n], s2[:n])
        else:
            for i in range(lo, hi, step):
                j = min(i + step, hi)
                dest[i:j] = _cast_block(flat[i:j], src, dst)

    workers = min(CAST_THREADS, flat.size // (4 * step))
    if workers < 2:
        run(0, flat.size)
        return
    per = -(-flat.size // workers // step) * step
    pool = _cast_pool()
    jobs = [pool.submit(run, lo, min(lo + per, flat.size)) for lo in range(per, flat.size, per)]
    run(0, min(per, flat.size))  # this thread takes the first part
    for job in jobs:
        job.result()


_POOL = None


def _cast_pool():
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max(1, CAST_THREADS - 1), thread_name_prefix="linnet-cast")
    return _POOL


BLOCK_ELEMENTS = 1 << 21  # elements per block when streaming a tensor to its file


def blocks(src, elements: int = BLOCK_ELEMENTS) -> Iterator[np.ndarray]:
    """`src` (an array, or the TensorInfo of a safetensors tensor) as consecutive flat blocks
    of `elements` (the last may be shorter). From a file, blocks are read into two buffers
    in turn: a block stays valid until the second next one is asked for, and nothing
    bigger than a block is resident."""
    if isinstance(src, np.ndarray):
        flat = np.ascontiguousarray(src).reshape(-1)
        for i in range(0, flat.size, elements):
            yield flat[i : i + elements]
        return
    n = int(np.prod(src.shape, dtype=np.int64))
    if n == 0:
        return
    dtype = NP_DTYPES[ST_DTYPES[src.dtype]]
    bufs = [np.empty(min(elements, n), dtype) for _ in range(2 if n > elements else 1)]
    with open(src.file, "rb", buffering=0) as f:
        f.seek(src.offsets[0])
        for k, i in enumerate(range(0, n, elements)):
            view = bufs[k % len(bufs)][: min(elements, n - i)]
            raw = memoryview(view).cast("B")
            got = 0
            while got < len(raw):
                r = f.readinto(raw[got:])
                if not r:
                    raise CheckpointError(f"{src.file}: truncated at tensor {src.name}")
                got += r
            yield view


def write_converted(src, dtype: str, write: Callable, elements: int = BLOCK_ELEMENTS) -> None:
    """Write `src` (array or TensorInfo) as `dtype` through `write(bytes)`, block by block:
    read, convert into one of two buffers, and write in a background thread while the
    next block is read and converted (file I/O and numpy release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    outs: list[np.ndarray] = []
    with ThreadPoolExecutor(1, thread_name_prefix="linnet-write") as pool:
        pending = None
        for k, blk in enumerate(blocks(src, elements)):
            if dtype_name(blk) == dtype:
                out = blk
            else:
                if len(outs) < 2:
                    outs.append(np.empty(blk.size, NP_DTYPES[dtype]))
                out = outs[k % 2][: blk.size]
                cast_into(blk, out)
            if pending is not None:
                pending.result()  # the buffer written two blocks ago is free again
            pending = pool.submit(write, memoryview(out).cast("B"))
        if pending is not None:
            pending.result()


def from_torch(t) -> np.ndarray:
    """A torch tensor as a numpy array (bf16 as uint16 bits; no copy on CPU)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    if t.dtype not in (torch.float32, torch.float16):
        t = t.float()
    return t.contiguous().numpy()


def to_torch(x: np.ndarray, torch_dtype=None):
    """A numpy array (bf16 as uint16 bits) as a torch tensor, cast to `torch_dtype`."""
    import torch

    x = np.ascontiguousarray(x)
    if x.dtype == np.uint16:
        t = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(x)
    return t if torch_dtype is None else t.to(torch_dtype)
