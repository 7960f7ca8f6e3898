"""The onnxruntime array adapter of the model contract (see `linnet/backends/arrays.py`):
inputs are numpy arrays; states are OrtValues, each holding the numpy buffer it borrows."""

from __future__ import annotations

import numpy as np

from linnet.backends.arrays import check_ids
from linnet.core.dtypes import numpy_dtype
from linnet.errors import LinnetError


class OnnxArrays:
    """Every state is an OrtValue made from a numpy buffer (`ortvalue_from_numpy` keeps a
    reference to it) or one onnxruntime allocated; `OnnxModel._execute` keeps the value it
    bound for a part written in place, so no buffer is freed under a live state."""

    @staticmethod
    def tokens(x, dtype: str, rank: int, vocab: int | None) -> np.ndarray:
        return check_ids(x, vocab).astype(numpy_dtype(dtype))

    @staticmethod
    def convert(name: str, dtype: str, x) -> np.ndarray:
        x = np.asarray(x)
        if dtype in ("i64", "i32") and not np.issubdtype(x.dtype, np.integer):
            if x.dtype != np.bool_:
                raise LinnetError(f"`{name}` must hold integers, got {x.dtype}")
        return np.ascontiguousarray(x, dtype=numpy_dtype(dtype))

    @staticmethod
    def mask_like(ids) -> np.ndarray:
        return np.ones(ids.shape[:2], dtype=np.int64)

    @staticmethod
    def zeros(shape, dtype: str):
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, numpy_dtype(dtype)))

    # rows.py steps only the rows in use: a slice of rows is a view or a copy of those rows
    # alone, which costs far less than computing every row (docs/serve.md: 2.6 ms of CPU
    # to cut and put back one row of SmolLM2's 16-row cache, 209 vs 75 ms for a step)
    row_views = True

    @staticmethod
    def row(x, axis: int, r: int, count: int = 1):
        """Rows r..r+count of a state along its batch axis: an OrtValue over a view of x's
        memory when that view is contiguous (a part written in place then writes x), else
        a copy."""
        import onnxruntime as ort

        view = x.numpy()[(slice(None),) * axis + (slice(r, r + count),)]
        if not view.flags.c_contiguous:
            view = np.ascontiguousarray(view)
        return ort.OrtValue.ortvalue_from_numpy(view)

    @staticmethod
    def put_row(x, axis: int, r: int, part):
        """x with rows r.. replaced by `part` (nothing to copy when part wrote in place)."""
        import onnxruntime as ort

        whole = x.numpy()  # shares x's memory on the CPU
        if whole.ctypes.data != x.data_ptr():  # a copy after all: own it
            x = ort.OrtValue.ortvalue_from_numpy(whole)
        count = part.shape()[axis]
        view = whole[(slice(None),) * axis + (slice(r, r + count),)]
        if part.data_ptr() != view.ctypes.data:
            view[...] = part.numpy()
        return x

    @staticmethod
    def concat(parts) -> np.ndarray:
        return np.concatenate(parts, axis=1)

    @staticmethod
    def shape(x) -> tuple:
        return tuple(x.shape())  # an OrtValue

    @staticmethod
    def normalize(x) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)

    @staticmethod
    def sampler(do_sample, temperature, top_k, seed: int = 0):
        rng = np.random.default_rng(seed)
        return lambda logits: pick(logits, do_sample, temperature, top_k, rng)


def pick(logits: np.ndarray, do_sample: bool, temperature: float, top_k, rng) -> np.ndarray:
    """Token ids [B] from logits [B, V]: argmax, or drawn from the tempered top-k."""
    if not do_sample:
        return logits.argmax(axis=-1)
    scores = logits.astype(np.float64) / max(temperature, 1e-6)
    if top_k:
        kth = np.sort(scores, axis=-1)[:, -top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(len(p), p=p) for p in probs])
