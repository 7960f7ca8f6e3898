"""The row-decoding contract, and `SerialRows`: an exact fallback for models without a
native `rows` (one row at a time through the model's own `decode`).

    rows = row_decoder(model, 8)        # model.rows(8, positions) when the model has it
    logits = rows.prefill(0, [5, 9, 2]) # f32[vocab] after the last id
    logits = rows.step([0, 3], [7, 1])  # f32[2, vocab]: one token for each listed row
    rows.free(0)                        # length back to 0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from linnet.errors import LinnetError


class RowDecoder(Protocol):
    """R fixed cache rows, each with its own position and length (docs/serve.md)."""

    rows: int
    positions: int

    def prefill(self, row: int, ids: Sequence[int]) -> np.ndarray: ...

    def step(self, rows: Sequence[int], ids: Sequence[int]) -> np.ndarray: ...

    def free(self, row: int) -> None: ...

    def length(self, row: int) -> int: ...


def row_decoder(model, count: int, positions: int | None = None) -> RowDecoder:
    """The model's native rows when it has them, else `SerialRows` over its decode."""
    if hasattr(model, "rows"):
        return model.rows(count, positions=positions)
    return SerialRows(model, count, positions)


class SerialRows:
    """Rows as separate caches of one `Decoder`: each call swaps a row's cache (and its
    length) into the model and runs the model's ordinary `decode` at that row's position.
    Exact (the same calls as a solo generation), one row per call, so slow."""

    def __init__(self, model, count: int, positions: int | None = None):
        if count < 1:
            raise LinnetError(f"rows must be at least 1, got {count}")
        if positions is not None and positions > model.max_positions:
            raise LinnetError(
                f"positions {positions} exceed the model's cache ({model.max_positions}); "
                "load it with max_positions >= positions"
            )
        self.model = model
        self.rows = count
        self.positions = positions or model.max_positions
        self._caches: list[dict] = [{} for _ in range(count)]
        self._lengths = [0] * count

    def prefill(self, row: int, ids: Sequence[int]) -> np.ndarray:
        ids = list(ids)
        if not ids:
            raise LinnetError("prefill needs at least one token id")
        return self._run(row, ids)

    def step(self, rows: Sequence[int], ids: Sequence[int]) -> np.ndarray:
        if len(rows) != len(ids) or len(set(rows)) != len(rows):
            raise LinnetError("step takes one token for each of distinct rows")
        return np.stack([self._run(row, [int(i)]) for row, i in zip(rows, ids)])

    def free(self, row: int) -> None:
        self._check_row(row)
        self._caches[row] = {}  # a fresh cache at the next prefill: nothing stale survives
        self._lengths[row] = 0

    def length(self, row: int) -> int:
        self._check_row(row)
        return self._lengths[row]

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.rows:
            raise LinnetError(f"row {row} is not in [0, {self.rows})")

    def _run(self, row: int, ids: list[int]) -> np.ndarray:
        self._check_row(row)
        start = self._lengths[row]
        if start + len(ids) > self.positions:
            raise LinnetError(
                f"row {row} holds {start} tokens; {len(ids)} more pass its {self.positions}"
            )
        model = self.model
        model.state = self._caches[row]
        try:
            logits = model.decode(np.asarray([ids], dtype=np.int64), start)
        finally:
            self._caches[row] = model.state
            model.state = {}
        self._lengths[row] = start + len(ids)
        return host_f32(logits)[0]


def host_f32(x) -> np.ndarray:
    """A backend's logits as a host numpy f32 array (torch bf16 has no numpy dtype)."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu()
    return np.asarray(x, dtype=np.float32)
