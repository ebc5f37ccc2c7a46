"""An elementwise expression read as a polynomial of the values it combines.

A cell's state update is written many ways: ``z * h + (1 - z) * n``, ``n + z * (h - n)``,
``(h - n) * z + n``, ``n - z * (n - h)``, one-minus as ``Sub(1, z)`` or ``Add(Neg(z), 1)``,
any operand order and association. :func:`polynomial` walks ``Add``, ``Sub``, ``Mul``,
``Neg`` and ``Identity`` from a value down to its *atoms* (any other value: an
activation's output, a state) and scalar constants, and expands the product of sums: every
spelling of one formula gives one :class:`Polynomial`, which a cell proof compares with
the formula it expects. Coefficients are the scalar constants' values multiplied and added
(float64): ``1 - z`` is ``{(): 1, (z,): -1}``.

Equality: the polynomial is the expression's value in exact arithmetic (distributivity,
commutativity, associativity), so a node computing the same polynomial gives the same
outputs up to rounding (the order of the float operations). Shapes: every atom the cell
proofs accept is ``[batch, H]`` and a scalar constant (one element, rank <= 1) broadcasts
without changing a shape, so the expansion changes no shape either.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.shape.constant import Constants

__all__ = ["Monomial", "Polynomial", "polynomial", "render"]

#: Atoms multiplied (ordered by first appearance, repeated for a power).
Monomial = tuple[ir.Value, ...]
#: Monomial -> coefficient; no zero coefficients.
Polynomial = dict[Monomial, float]

#: Expansion stops beyond this many monomials (a state update has 3 or 4).
_MAX_TERMS = 16
#: ... or this many nodes walked.
_MAX_NODES = 32


def _key(monomial: Monomial, order: dict[ir.Value, int]) -> Monomial:
    return tuple(sorted(monomial, key=order.__getitem__))


class _Expansion:
    def __init__(self, constants: Constants, state: Callable[[ir.Value], ir.Value | None]) -> None:
        self.constants = constants
        self.state = state
        self.order: dict[ir.Value, int] = {}
        self.nodes = 0

    def add(self, a: Polynomial, b: Polynomial, sign: float = 1.0) -> Polynomial:
        result = dict(a)
        for monomial, coefficient in b.items():
            result[monomial] = result.get(monomial, 0.0) + sign * coefficient
        return {m: c for m, c in result.items() if c != 0.0}

    def mul(self, a: Polynomial, b: Polynomial) -> Polynomial | Refusal:
        result: Polynomial = {}
        for ma, ca in a.items():
            for mb, cb in b.items():
                key = _key(ma + mb, self.order)
                result[key] = result.get(key, 0.0) + ca * cb
        result = {m: c for m, c in result.items() if c != 0.0}
        if len(result) > _MAX_TERMS:
            return Refusal(f"the expansion has more than {_MAX_TERMS} terms")
        return result

    def _atom(self, atom: ir.Value) -> Polynomial:
        self.order.setdefault(atom, len(self.order))
        return {(atom,): 1.0}

    def __call__(self, value: ir.Value | None) -> Polynomial | Refusal:
        if value is None:
            return Refusal("an operand is missing")
        state = self.state(value)
        if state is not None:  # a state, or a constant standing for one (a first step's)
            return self._atom(state)
        array = self.constants(value)
        if array is not None:
            if array.size != 1 or array.ndim > 1 or array.dtype.kind != "f":
                return Refusal(f"{value.name or 'a constant'} is not a float scalar")
            number = float(array.reshape(()))
            return {(): number} if number != 0.0 else {}
        node = value.producer()
        op = None if node is None or node.domain != "" else node.op_type
        if op not in ("Add", "Sub", "Mul", "Neg", "Identity"):
            return self._atom(value)
        assert node is not None
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            return Refusal(f"the expression has more than {_MAX_NODES} nodes")
        operands = []
        for operand in node.inputs:
            part = self(operand)
            if isinstance(part, Refusal):
                return part
            operands.append(part)
        if op in ("Neg", "Identity"):
            return self.add({}, operands[0], -1.0 if op == "Neg" else 1.0)
        if len(operands) != 2:
            return Refusal(f"{node.name or op} does not have two operands")
        if op == "Mul":
            return self.mul(*operands)
        return self.add(operands[0], operands[1], -1.0 if op == "Sub" else 1.0)


def polynomial(
    value: ir.Value,
    constants: Constants,
    state: Callable[[ir.Value], ir.Value | None] = lambda _: None,
) -> tuple[Polynomial, list[ir.Value]] | Refusal:
    """``value`` as a polynomial of its atoms and the atoms in order of first appearance;
    ``state`` gives the state a value stands for (the state itself, or a constant of its
    bits on a first step), an atom whatever it computes. A reason when another constant
    is not a float scalar or the expression is too large to be a cell's."""
    expansion = _Expansion(constants, state)
    found = expansion(value)
    if isinstance(found, Refusal):
        return found
    return found, list(expansion.order)


def render(poly: Polynomial, name: Callable[[ir.Value], str]) -> str:
    """``poly`` as text (``z * h_(t-1) + n - z * n``), atoms named by ``name``."""
    if not poly:
        return "0"
    parts = []
    for monomial, coefficient in poly.items():
        factors = [name(atom) for atom in monomial]
        if abs(coefficient) != 1.0 or not factors:
            factors.insert(0, f"{abs(coefficient):g}")
        sign = "-" if coefficient < 0 else "+"
        parts.append((sign, " * ".join(factors)))
    text = " ".join(f"{sign} {term}" for sign, term in parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]
