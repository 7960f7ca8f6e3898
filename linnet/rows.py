"""Decoding over R fixed cache rows, each at its own position (issue 13): the row-decoding
contract a server schedules requests through.

    rows = model.rows(8)                      # 8 cache rows of model.max_positions - 1 tokens
    logits = rows.prefill(3, prompt_ids)      # f32[vocab] after the prompt; row 3 only
    logits = rows.step([0, 3], [t0, t3])      # f32[2, vocab]: one token for each listed row
    rows.free(3)                              # row 3 starts afresh at its next prefill

`step` runs the source's `decode_rows` entry over the rows from the first listed to the
last (every row on JAX, where a slice of rows copies the whole cache); rows in that span
that are not listed are fed their next position, so what they write lies past their length
and is overwritten before it is ever read. `prefill` runs the `decode` entry on one row's
slice of the cache, in chunks, so a long prompt costs one row's work and leaves the other
rows untouched; so does a step of one row alone where a row's slice is cheap (PyTorch,
ONNX): `decode` at batch 1, as `linnet run` decodes, without `decode_rows`' per-row rope,
cache writes and mask. The cache has one slot more than a row holds: a full row that is
not stepped still has room for the write it is fed.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np

from linnet.core.dims import Poly
from linnet.errors import LinnetError

ROWS_ENTRY = "decode_rows"
PREFILL_CHUNK = 256


class RowDecoder:
    def __init__(self, model, count: int, positions: int | None = None, chunk: int = PREFILL_CHUNK):
        if ROWS_ENTRY not in model.entries:
            raise LinnetError(f"this model has no `{ROWS_ENTRY}` entry: it cannot decode rows")
        limit = model.max_positions - 1  # the cache's last slot is for idle full rows
        positions = limit if positions is None else int(positions)
        if not 1 <= positions <= limit:
            raise LinnetError(
                f"rows hold 1 to {limit} positions with this cache "
                f"(max_positions {model.max_positions}), got {positions}"
            )
        if count < 1 or chunk < 1:
            raise LinnetError(f"need at least one row and a chunk of 1 or more, got {count}")
        self.model, self.rows, self.positions, self.chunk = model, int(count), positions, chunk
        self.lengths = [0] * self.rows
        self.row_axes = row_axes(model._state_types())
        self.state = {
            name: model.arrays.zeros(shape, dtype)
            for name, shape, dtype in model._state_specs(self.rows)
        }

    def length(self, row: int) -> int:
        return self.lengths[self._row(row)]

    def free(self, row: int) -> None:
        self.lengths[self._row(row)] = 0

    def prefill(self, row: int, ids: Sequence[int]) -> np.ndarray:
        """Append `ids` to the row from its current length, in chunks; f32[vocab] logits
        after the last id. Other rows are untouched."""
        row, ids = self._row(row), [int(i) for i in ids]
        if not ids:
            raise LinnetError("prefill needs at least one token id")
        self._check_room(row, len(ids))
        with self._one_row(row):
            for start in range(0, len(ids), self.chunk):
                part = ids[start : start + self.chunk]
                logits = self.model._decode(self.model._ids([part]), self.lengths[row])
                self.lengths[row] += len(part)
        return _host(logits)[0]

    def prefill_together(
        self, rows: Sequence[int], parts: Sequence[Sequence[int]]
    ) -> tuple[list[int], np.ndarray]:
        """Append the start of each part to its row: (how many ids each row took, f32[len(rows),
        vocab] logits after each row's last id taken). One `decode_rows` call feeds every row
        the same count (the shortest part, at most a chunk, at most the room the other rows of
        the span have for the writes they are fed), so the shortest parts end this call and
        the others continue at the next. Where the span would compute more idle rows than
        listed ones, each row prefills its whole part alone instead."""
        rows = [self._row(r) for r in rows]
        parts = [[int(i) for i in p] for p in parts]
        if len(set(rows)) != len(rows) or len(rows) != len(parts) or not all(parts):
            raise LinnetError(f"prefill_together needs distinct rows, ids for each: {rows}")
        lo, hi = self._span(rows)
        idle = [r for r in range(lo, hi) if r not in rows]
        if len(idle) > len(rows):
            return [len(p) for p in parts], np.stack(list(map(self.prefill, rows, parts)))
        room = [self.model.max_positions - self.lengths[r] for r in idle]
        count = min([self.chunk, *map(len, parts), *room])
        for r in rows:
            self._check_room(r, count)
        picked = [r - lo for r in rows]
        tokens = np.zeros((hi - lo, count), np.int64)
        tokens[picked] = [p[:count] for p in parts]
        return [count] * len(rows), self._rows_call(lo, hi, tokens, rows, picked)

    def step(self, rows: Sequence[int], ids: Sequence[int]) -> np.ndarray:
        """One token for each listed row at its own position; f32[len(rows), vocab]."""
        rows = [self._row(r) for r in rows]
        if len(set(rows)) != len(rows) or len(rows) != len(ids):
            raise LinnetError(f"step needs distinct rows, one id each: rows {rows}, ids {ids}")
        if not rows:
            return np.zeros((0, self.model.config["vocab"]), np.float32)
        for r in rows:
            self._check_room(r, 1)
        if len(rows) == 1 and self._row_views():  # `decode` at batch 1, as `linnet run`
            return self.prefill(rows[0], ids)[None]
        lo, hi = self._span(rows)
        picked = [r - lo for r in rows]
        tokens = np.zeros((hi - lo, 1), np.int64)
        tokens[picked, 0] = [int(i) for i in ids]
        return self._rows_call(lo, hi, tokens, rows, picked)

    def _rows_call(self, lo: int, hi: int, tokens: np.ndarray, rows, picked) -> np.ndarray:
        """`decode_rows` over rows lo..hi-1, each at its length; the listed rows grow by the
        tokens' width, the others' writes lie past their length (overwritten before read)."""
        at = np.asarray(self.lengths[lo:hi], np.int64)
        inputs = self.model._inputs(ROWS_ENTRY, [tokens, at])
        with self._rows_state(lo, hi):
            logits = self.model._execute(ROWS_ENTRY, inputs, {"reach": int(at.max())})
        for r in rows:
            self.lengths[r] += tokens.shape[1]
        return _host(logits)[picked]

    # -- helpers ------------------------------------------------------------------------
    def _row(self, row) -> int:
        if not (isinstance(row, (int, np.integer)) and 0 <= row < self.rows):
            raise LinnetError(f"row must be an int in 0 .. {self.rows - 1}, got {row!r}")
        return int(row)

    def _check_room(self, row: int, more: int) -> None:
        if self.lengths[row] + more > self.positions:
            raise LinnetError(
                f"row {row} holds {self.lengths[row]} of {self.positions} positions: "
                f"{more} more do not fit"
            )

    def _span(self, rows: list[int]) -> tuple[int, int]:
        """The rows a step computes: from the first listed to the last where a slice of
        rows is cheap (a view on PyTorch, a view or a copy of those rows on ONNX: a step
        then costs what the rows in use cost), else all of them (JAX: a slice would copy
        the cache)."""
        if self._row_views():
            return min(rows), max(rows) + 1
        return 0, self.rows

    def _row_views(self) -> bool:
        return bool(getattr(self.model.arrays, "row_views", False))

    @contextmanager
    def _rows_state(self, lo: int, hi: int):
        if (lo, hi) == (0, self.rows):
            with self._all_rows():
                yield
        else:
            with self._one_row(lo, hi - lo):
                yield

    @contextmanager
    def _all_rows(self):
        saved, self.model.state = self.model.state, self.state
        try:
            yield
        finally:
            self.state, self.model.state = self.model.state, saved

    @contextmanager
    def _one_row(self, row: int, count: int = 1):
        """The model's state is the slice of `count` rows from `row` (a view where the
        backend has them) while the block runs; what it wrote goes back into those rows."""
        arrays, saved = self.model.arrays, self.model.state
        cut = {"count": count} if count != 1 else {}  # JAX and ONNX take one row
        self.model.state = {
            name: arrays.row(x, self.row_axes[name], row, **cut) for name, x in self.state.items()
        }
        try:
            yield
        finally:
            part, self.model.state = self.model.state, saved
            for name, x in self.state.items():
                self.state[name] = arrays.put_row(x, self.row_axes[name], row, part[name])


def row_axes(state_types: dict) -> dict[str, int]:
    """Each state's batch axis (the one sized `B`): the axis rows are cut along."""
    axes = {}
    for name, (shape, _) in state_types.items():
        found = [i for i, d in enumerate(shape) if Poly.lift(d) == Poly.atom("B")]
        if len(found) != 1:
            raise LinnetError(f"state `{name}` has no single batch axis B: {list(shape)}")
        axes[name] = found[0]
    return axes


def _host(logits) -> np.ndarray:
    """Logits as a host numpy f32 array, whatever the backend's array type."""
    if hasattr(logits, "detach"):  # torch
        logits = logits.detach().float().cpu()
    return np.asarray(logits, dtype=np.float32)
