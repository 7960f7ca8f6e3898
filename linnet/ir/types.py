"""Tensor types of the Core IR and of the checker: a dtype and a symbolic shape."""

from __future__ import annotations

from dataclasses import dataclass

from linnet.core.dims import Poly
from linnet.core.dtypes import DTYPES, FLOAT_DTYPES, INT_DTYPES  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class TensorType:
    dtype: str  # one of DTYPES, or a config dtype field (e.g. "act") while checking
    shape: tuple[Poly, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, shape) -> TensorType:
        return TensorType(self.dtype, tuple(Poly.lift(d) for d in shape))

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


def is_float(dtype: str) -> bool:
    """Float dtypes, and config dtype fields (which only ever name float dtypes)."""
    return dtype in FLOAT_DTYPES or dtype not in DTYPES


class OpTypeError(Exception):
    """An op's shape or dtype rule failed; the checker adds the source position."""

    def __init__(
        self,
        message: str,
        expected: str | None = None,
        received: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.expected = expected
        self.received = received
        self.hint = hint
