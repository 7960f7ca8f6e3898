"""Per-tensor transforms of a weights map, each with its inverse (format: docs/weights-maps.md).

    t = parse_transform("transpose", "llama.toml")
    t.invert(t.apply(x))          # == x
    rope_unpermute(rope_permute(w, n_head=4), n_head=4)   # llama.cpp's Q/K layout and back

Tensors are numpy arrays or torch tensors; each function keeps the kind it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from linnet.errors import ConfigError


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def concat(parts: list, axis: int):
    if is_torch(parts[0]):
        import torch

        return torch.cat(parts, dim=axis)
    import numpy as np

    return np.concatenate(parts, axis=axis)


def contiguous(x: Any):
    if is_torch(x):
        return x.contiguous()
    import numpy as np

    return np.ascontiguousarray(x)


@dataclass(frozen=True)
class Transform:
    """One invertible per-tensor transform: `permute` (`transpose` is the 2-D case)."""

    kind: str
    axes: tuple[int, ...]

    @property
    def text(self) -> str:
        if self.kind == "transpose":
            return "transpose"
        return f"permute{list(self.axes)}"

    def _inverse_axes(self) -> tuple[int, ...]:
        inv = [0] * len(self.axes)
        for i, a in enumerate(self.axes):
            inv[a] = i
        return tuple(inv)

    def _check_rank(self, rank: int) -> None:
        if rank != len(self.axes):
            raise ValueError(f"{self.text} needs a rank-{len(self.axes)} tensor, got rank {rank}")

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape after the transform (HF -> source)."""
        self._check_rank(len(shape))
        return tuple(shape[a] for a in self.axes)

    def inverse_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        self._check_rank(len(shape))
        return tuple(shape[a] for a in self._inverse_axes())

    def apply(self, x):
        self._check_rank(x.ndim)
        return x.permute(*self.axes) if is_torch(x) else x.transpose(self.axes)

    def invert(self, x):
        axes = self._inverse_axes()
        self._check_rank(x.ndim)
        return x.permute(*axes) if is_torch(x) else x.transpose(axes)


def parse_transform(spec: Any, where: str) -> Transform:
    if spec == "transpose":
        return Transform("transpose", (1, 0))
    if isinstance(spec, dict) and set(spec) == {"permute"}:
        axes = spec["permute"]
        if (
            isinstance(axes, list)
            and all(isinstance(a, int) for a in axes)
            and sorted(axes) == list(range(len(axes)))
        ):
            return Transform("permute", tuple(axes))
    raise ConfigError(
        f'{where}: unknown transform {spec!r} (known: "transpose", {{ permute = [...] }})'
    )


def _check_heads(rows: int, n_head: int) -> None:
    if rows % (2 * n_head):
        raise ValueError(f"rope_permute: {rows} rows do not split into {n_head} heads of pairs")


def rope_permute(x, n_head: int):
    """llama.cpp's Q/K row permutation (`LlamaModel.permute` in convert_hf_to_gguf.py):
    within each head, rows [first half; second half] become interleaved pairs, so that
    llama.cpp's "normal" rope (pairs 2j, 2j+1) equals HF's half rotation (j, j + d/2).
    x: [n_head * head_dim, ...] (a weight or a bias)."""
    rows = x.shape[0]
    _check_heads(rows, n_head)
    rest = tuple(x.shape[1:])
    y = x.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2)
    return contiguous(y.reshape(rows, *rest))


def rope_unpermute(x, n_head: int):
    """The inverse of `rope_permute`."""
    rows = x.shape[0]
    _check_heads(rows, n_head)
    rest = tuple(x.shape[1:])
    y = x.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2)
    return contiguous(y.reshape(rows, *rest))
