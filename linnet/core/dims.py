"""Symbolic dimensions: integer polynomials over named atoms.

Shapes in a source mention config fields (`n_heads * head_dim`) and symbolic
dims (`B`, `S`, `P`). Two shapes are equal when their polynomials are equal, so
`at + S - at` is `S` and `2 * dim` equals `dim + dim`. Division that is not
exact, and `%`, become opaque atoms: they only equal themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Monomial = tuple[str, ...]  # sorted atom names, repeated for powers; () is the constant


@dataclass(frozen=True)
class Poly:
    terms: tuple[tuple[Monomial, int], ...]  # sorted, no zero coefficients

    # -- construction -------------------------------------------------------
    @staticmethod
    def const(value: int) -> Poly:
        return Poly(((((), int(value)),)) if value else ())

    @staticmethod
    def atom(name: str) -> Poly:
        return Poly((((name,), 1),))

    @staticmethod
    def _make(acc: dict[Monomial, int]) -> Poly:
        return Poly(tuple(sorted((m, c) for m, c in acc.items() if c)))

    @staticmethod
    def from_terms(terms) -> Poly:
        """A polynomial from (coefficient, atoms) pairs, as JSON stores `terms`."""
        return Poly._make({tuple(atoms): int(coef) for coef, atoms in terms})

    def to_terms(self) -> list:
        """[[coefficient, [atoms]], ...]: `terms` in a form JSON keeps."""
        return [[coef, list(mono)] for mono, coef in self.terms]

    @staticmethod
    def lift(value: Poly | int) -> Poly:
        return value if isinstance(value, Poly) else Poly.const(value)

    # -- arithmetic ---------------------------------------------------------
    def __add__(self, other: Poly | int) -> Poly:
        acc = dict(self.terms)
        for m, c in Poly.lift(other).terms:
            acc[m] = acc.get(m, 0) + c
        return Poly._make(acc)

    __radd__ = __add__

    def __neg__(self) -> Poly:
        return Poly(tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other: Poly | int) -> Poly:
        return self + (-Poly.lift(other))

    def __rsub__(self, other: Poly | int) -> Poly:
        return Poly.lift(other) - self

    def __mul__(self, other: Poly | int) -> Poly:
        acc: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in Poly.lift(other).terms:
                m = tuple(sorted(m1 + m2))
                acc[m] = acc.get(m, 0) + c1 * c2
        return Poly._make(acc)

    __rmul__ = __mul__

    def exact_div(self, other: Poly | int) -> Poly | None:
        """self / other when it divides exactly term by term, else None."""
        other = Poly.lift(other)
        if len(other.terms) != 1:
            return self if other == self and self.terms else None
        ((dm, dc),) = other.terms
        out: dict[Monomial, int] = {}
        for m, c in self.terms:
            rest = list(m)
            for a in dm:
                if a not in rest:
                    return None
                rest.remove(a)
            if c % dc:
                return None
            out[tuple(rest)] = c // dc
        return Poly._make(out)

    def floordiv(self, other: Poly | int) -> Poly:
        other = Poly.lift(other)
        if self.is_const and other.is_const and other.value:
            return Poly.const(self.value // other.value)
        exact = self.exact_div(other)
        if exact is None and other.is_const and other.value > 0:  # (k*A + c) // k = A + c // k
            c = sum(coef for m, coef in self.terms if not m)
            rest = (self - c).exact_div(other)
            exact = None if rest is None else rest + c // other.value
        return exact if exact is not None else Poly.atom(f"({self} // {other})")

    def mod(self, other: Poly | int) -> Poly:
        other = Poly.lift(other)
        if self.is_const and other.is_const and other.value:
            return Poly.const(self.value % other.value)
        if self.exact_div(other) is not None:
            return Poly.const(0)
        return Poly.atom(f"({self} % {other})")

    # -- inspection ---------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return all(not m for m, _ in self.terms)

    @property
    def value(self) -> int:
        if not self.is_const:
            raise ValueError(f"{self} is not a constant")
        return self.terms[0][1] if self.terms else 0

    def atoms(self) -> set[str]:
        return {a for m, _ in self.terms for a in m}

    def as_atom(self) -> str | None:
        """The atom name when the polynomial is exactly one atom."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and len(self.terms[0][0]) == 1:
            return self.terms[0][0][0]
        return None

    def as_scaled_atom(self) -> tuple[str, int] | None:
        """(atom, k) when the polynomial is exactly k * atom (k >= 1): an input axis of
        `4 * H` binds H to its size / 4."""
        if len(self.terms) == 1 and self.terms[0][1] >= 1 and len(self.terms[0][0]) == 1:
            return self.terms[0][0][0], self.terms[0][1]
        return None

    def subs(self, env: Mapping[str, Poly | int]) -> Poly:
        out = Poly.const(0)
        for m, c in self.terms:
            term = Poly.const(c)
            for a in m:
                term = term * (Poly.lift(env[a]) if a in env else Poly.atom(a))
            out = out + term
        return out

    def eval(self, env: Mapping[str, int]) -> int:
        total = 0
        for m, c in self.terms:
            prod = c
            for a in m:
                prod *= env[a]
            total += prod
        return total

    def provably_nonneg(self, minimum: Mapping[str, int]) -> bool:
        """True when self >= 0 for every atom at or above its minimum (default 0)."""
        if any(c < 0 for m, c in self.terms if m):
            return False
        return self.eval({a: minimum.get(a, 0) for a in self.atoms()}) >= 0

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in sorted(self.terms, key=lambda t: (-len(t[0]), t[0])):
            body = " * ".join(m)
            if not m:
                text = str(abs(c))
            elif abs(c) == 1:
                text = body
            else:
                text = f"{abs(c)} * {body}"
            parts.append(("- " if c < 0 else "+ ") + text)
        out = " ".join(parts)
        return out[2:] if out.startswith("+ ") else "-" + out[2:]

    __repr__ = __str__


def shape_str(dims: tuple[Poly, ...]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"
