"""Symbolic sizes: integer polynomials over the unknown dimensions of a graph.

A :class:`Sym` is one unknown size, "axis ``k`` of value ``v``", anchored at the value
where the prover could follow the dimension no further back (a graph input's symbolic
axis, or an op output whose size it cannot express), or a *narrowed* one, "element ``i``
of ``v``", ``v`` being a ``Cast`` of a size to a narrower integer type (int32): the size
if it fits, else another (possibly negative) number (see :meth:`Sym.narrowing`). A
:class:`Dim` is a polynomial
with integer coefficients over such symbols, so ``seq * batch``, ``2 * H`` and
``L * D - 1`` are all exact. Two equal :class:`Dim` are equal at every size, zero
included: that is what every proof here rests on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import onnx_ir as ir

__all__ = ["ONE", "ZERO", "Dim", "Sym", "known", "product"]

Monomial = tuple["Sym", ...]


@dataclasses.dataclass(frozen=True, order=True)
class Sym:
    """The size of ``axis`` of ``value`` (a non-negative integer), compared by identity."""

    key: tuple[int, int]
    value: ir.Value = dataclasses.field(compare=False, hash=False, repr=False)

    @staticmethod
    def of(value: ir.Value, axis: int) -> Sym:
        return Sym((id(value), axis), value)

    @staticmethod
    def narrowing(value: ir.Value, index: int) -> Sym:
        """Element ``index`` of ``value``, the ``Cast`` of a size to a narrower integer
        type: equal to that size when it fits the type (``ShapeProver.narrowed_from``),
        and otherwise unknown, possibly negative (int32 wraps at ``2**31``)."""
        return Sym((id(value), -1 - index), value)

    @property
    def narrowed(self) -> bool:
        """True for a :meth:`narrowing` symbol (not an axis size: it may be negative)."""
        return self.key[1] < 0

    @property
    def axis(self) -> int:
        """The axis of ``value`` this size is; for a narrowed symbol, ``-1 - index``."""
        return self.key[1]

    @property
    def index(self) -> int:
        """The element of ``value`` a narrowed symbol is."""
        return -1 - self.key[1]

    def __str__(self) -> str:
        if self.narrowed:
            return f"{self.value.name or '?'}<element {self.index}>"
        return f"{self.value.name or '?'}[{self.axis}]"


@dataclasses.dataclass(frozen=True)
class Dim:
    """``sum(coef * prod(monomial))``; monomials sorted, zero coefficients dropped."""

    terms: tuple[tuple[Monomial, int], ...] = ()

    @staticmethod
    def const(value: int) -> Dim:
        return Dim((((), int(value)),)) if value else Dim()

    @staticmethod
    def sym(value: ir.Value, axis: int) -> Dim:
        return Dim((((Sym.of(value, axis),), 1),))

    @staticmethod
    def _make(coefs: dict[Monomial, int]) -> Dim:
        return Dim(tuple(sorted((m, c) for m, c in coefs.items() if c)))

    @property
    def value(self) -> int | None:
        """The integer when the polynomial is a constant, else None."""
        if not self.terms:
            return 0
        if len(self.terms) == 1 and not self.terms[0][0]:
            return self.terms[0][1]
        return None

    @property
    def symbol(self) -> Sym | None:
        """The symbol when the polynomial is exactly one symbol (coefficient 1), else None."""
        if len(self.terms) == 1 and len(self.terms[0][0]) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0][0]
        return None

    @property
    def is_const(self) -> bool:
        return self.value is not None

    @property
    def narrowed(self) -> bool:
        """True when a narrowed symbol (:meth:`Sym.narrowing`) occurs in it."""
        return any(s.narrowed for m, _ in self.terms for s in m)

    @property
    def nonnegative(self) -> bool:
        """True when no size can make it negative (every coefficient is >= 0 and no
        narrowed symbol occurs)."""
        return all(c >= 0 for _, c in self.terms) and not self.narrowed

    @property
    def positive(self) -> bool:
        """True when it is > 0 at every size, zero included (a positive constant term)."""
        return self.nonnegative and any(not m and c > 0 for m, c in self.terms)

    def __add__(self, other: Dim | int) -> Dim:
        other = _as_dim(other)
        coefs = dict(self.terms)
        for m, c in other.terms:
            coefs[m] = coefs.get(m, 0) + c
        return Dim._make(coefs)

    def __neg__(self) -> Dim:
        return Dim(tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other: Dim | int) -> Dim:
        return self + -_as_dim(other)

    def __mul__(self, other: Dim | int) -> Dim:
        other = _as_dim(other)
        coefs: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2))
                coefs[m] = coefs.get(m, 0) + c1 * c2
        return Dim._make(coefs)

    __radd__ = __add__
    __rmul__ = __mul__

    def divide(self, other: Dim | int) -> Dim | None:
        """``self / other`` when it is an exact polynomial quotient, else None.

        ``other`` must be a single monomial (``3``, ``H``, ``2 * batch``): that covers
        every division a shape computation makes, and it is then exact at every size.
        """
        other = _as_dim(other)
        if len(other.terms) != 1:
            return None
        ((divisor, coef),) = other.terms
        coefs: dict[Monomial, int] = {}
        for m, c in self.terms:
            if c % coef:
                return None
            rest = list(m)
            for s in divisor:
                if s not in rest:
                    return None
                rest.remove(s)
            coefs[tuple(rest)] = c // coef
        return Dim._make(coefs)

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in self.terms:
            names = "*".join(map(str, m))
            parts.append(str(c) if not m else names if c == 1 else f"{c}*{names}")
        return " + ".join(parts)


def _as_dim(value: Dim | int) -> Dim:
    return value if isinstance(value, Dim) else Dim.const(value)


ZERO = Dim()
ONE = Dim.const(1)


def product(dims: Iterable[Dim]) -> Dim:
    result = ONE
    for d in dims:
        result = result * d
    return result


def known(sizes: Sequence[Dim | None] | None) -> tuple[Dim, ...] | None:
    """``sizes`` when every one is known (none is None), else None."""
    if sizes is None or any(d is None for d in sizes):
        return None
    return tuple(d for d in sizes if d is not None)
