"""The PyTorch array adapter of the model contract (see `linnet/backends/arrays.py`)."""

from __future__ import annotations

import torch

from linnet.backends.torch.interp import TORCH_DTYPES
from linnet.core.dtypes import INT_DTYPES
from linnet.errors import LinnetError


class TorchArrays:
    def __init__(self, device) -> None:
        self.device = torch.device(device)

    def tokens(self, x, dtype: str, rank: int, vocab: int | None) -> torch.Tensor:
        x = torch.as_tensor(x)
        if x.dim() == rank - 1:
            x = x[None]  # one sequence
        self._integers("tokens", x)
        if x.numel() and vocab and (int(x.min()) < 0 or int(x.max()) >= vocab):
            raise LinnetError(
                f"token ids must lie in [0, {vocab}), got {int(x.min())} to {int(x.max())}"
            )
        return x.to(device=self.device, dtype=TORCH_DTYPES[dtype])

    def convert(self, name: str, dtype: str, x) -> torch.Tensor:
        x = torch.as_tensor(x)
        if dtype in INT_DTYPES:
            self._integers(name, x)
        return x.to(device=self.device, dtype=TORCH_DTYPES[dtype])

    @staticmethod
    def _integers(name: str, x: torch.Tensor) -> None:
        if x.dtype.is_floating_point or x.dtype.is_complex:
            raise LinnetError(f"`{name}` must hold integers, got {x.dtype}")

    def mask_like(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.ones(ids.shape[:2], dtype=torch.int64, device=ids.device)

    def zeros(self, shape, dtype: str) -> torch.Tensor:
        with torch.inference_mode():  # as the runners use it
            return torch.zeros(shape, dtype=TORCH_DTYPES[dtype], device=self.device)

    row_views = True  # `row` is a view at any count: rows.py steps only the rows in use

    @staticmethod
    def row(x: torch.Tensor, axis: int, r: int, count: int = 1) -> torch.Tensor:
        """Rows r..r+count of a state along its batch axis: a view (writes reach x)."""
        return x.narrow(axis, r, count)

    @staticmethod
    def put_row(x: torch.Tensor, axis: int, r: int, part: torch.Tensor) -> torch.Tensor:
        """x with rows r.. replaced by `part` (nothing to copy when part is x's view)."""
        view = x.narrow(axis, r, part.shape[axis])
        if part.data_ptr() != view.data_ptr() or part.stride() != view.stride():
            with torch.inference_mode():
                view.copy_(part)
        return x

    @staticmethod
    def concat(parts) -> torch.Tensor:
        return torch.cat(parts, dim=1)

    @staticmethod
    def shape(x) -> tuple:
        return tuple(x.shape)

    @staticmethod
    def normalize(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x, p=2.0, dim=-1)

    @staticmethod
    def sampler(do_sample, temperature, top_k, generator=None):
        return lambda logits: pick(logits, do_sample, temperature, top_k, generator)


def pick(logits, do_sample, temperature, top_k, generator) -> torch.Tensor:
    """Token ids [B] from logits [B, V]: argmax, or drawn from the tempered top-k."""
    if not do_sample:
        return logits.argmax(dim=-1)
    scores = logits.float() / max(temperature, 1e-6)
    if top_k:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
