"""Sizes a node proves equal by running: facts from a value's consumers.

A node that requires two sizes to be equal proves them equal on every run where it runs
without error:

* ``Concat``: every axis but the concatenated one, in all its inputs;
* ``MatMul``: the contracted sizes (``a``'s last, ``b``'s second to last);
* ``Add``/``Sub``/``Mul``/``Div``: sizes aligned by broadcasting, only where neither can
  be 1 (the gcd of the size's coefficients is at least 2: ``2*B`` is never 1); a size
  of 1 broadcasts against any other, so ``B`` against ``B'`` proves nothing.

Soundness is the caller's: these are facts only on runs where the node runs. A node in
an ``If`` branch, a ``Loop`` body (zero iterations run none) or one whose outputs no
observed value depends on (runtimes prune it) proves nothing about the values a rewrite
replaces; a caller passes only nodes every replaced value is computed from.

One caveat, ONNX Runtime's: its ``Concat`` skips an input with no elements (ONNX's
specification and ``onnx.reference`` refuse one of another size), and fills those
columns of its output with whatever its buffer held. Its outputs there are not defined
(they differ from run to run), so no rewrite can equal them: they count as a failing run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import onnx_ir as ir

from rnn_rewrite_rules.shape.dim import ONE, Dim
from rnn_rewrite_rules.shape.prover import ShapeProver
from rnn_rewrite_rules.shape.semantics import normalize_axes

__all__ = ["SizeEquality", "never_one", "required_equal"]

_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div"})


class SizeEquality:
    """Sizes proven equal: the prover's own equality, joined with the consumers' facts."""

    def __init__(self) -> None:
        self._parent: dict[Dim, Dim] = {}

    def _find(self, dim: Dim) -> Dim:
        root = dim
        while (parent := self._parent.get(root, root)) != root:
            root = parent
        return root

    def unite(self, a: Dim, b: Dim) -> None:
        """Record ``a == b`` (and ``a / g == b / g``, ``g`` the gcd of their coefficients:
        ``2*A == 2*B`` is ``A == B``)."""
        for x, y in ((a, b), _reduced(a, b)):
            rx, ry = self._find(x), self._find(y)
            if rx != ry:
                self._parent[rx] = ry

    def same(self, a: Dim | None, b: Dim | None) -> bool:
        """``a`` and ``b`` are proven equal (False where either is unknown)."""
        return a is not None and b is not None and self._find(a) == self._find(b)


def _reduced(a: Dim, b: Dim) -> tuple[Dim, Dim]:
    """``a`` and ``b`` divided by the gcd of all their coefficients."""
    g = math.gcd(*(c for _, c in a.terms), *(c for _, c in b.terms))
    da, db = (a.divide(g), b.divide(g)) if g >= 2 else (a, b)
    return (da, db) if da is not None and db is not None else (a, b)


def never_one(dim: Dim) -> bool:
    """True when no sizes make ``dim`` 1: every coefficient shares a factor of at least 2."""
    return math.gcd(*(abs(c) for _, c in dim.terms)) >= 2 if dim.terms else True


def _pairs(prover: ShapeProver, node: ir.Node) -> Iterable[tuple[Dim, Dim]]:
    """The sizes ``node`` requires equal to run (nothing where a rank is unknown)."""
    if node.domain != "":
        return
    inputs = [prover.dims(v) for v in node.inputs]
    if any(dims is None for v, dims in zip(node.inputs, inputs, strict=True) if v is not None):
        return
    shapes = [dims for dims in inputs if dims is not None]
    if node.op_type == "Concat" and shapes and len({len(s) for s in shapes}) == 1:
        axes = normalize_axes([node.attributes.get_int("axis", 0)], len(shapes[0]))
        for other in shapes[1:] if axes is not None else ():
            pairs = enumerate(zip(shapes[0], other, strict=True))
            yield from ((a, b) for k, (a, b) in pairs if axes is not None and k != axes[0])
    elif node.op_type == "MatMul" and len(shapes) == 2 and min(map(len, shapes)) >= 1:
        left, right = shapes
        yield left[-1], right[-2] if len(right) >= 2 else right[0]
    elif node.op_type in _BROADCASTING and len(shapes) == 2:
        aligned = zip(reversed(shapes[0]), reversed(shapes[1]), strict=False)
        yield from (
            (a, b) for a, b in aligned if a != ONE and b != ONE and never_one(a) and never_one(b)
        )


def required_equal(prover: ShapeProver, nodes: Iterable[ir.Node]) -> SizeEquality:
    """The sizes ``nodes`` require equal to run (see the module's soundness note)."""
    equal = SizeEquality()
    for node in nodes:
        for a, b in _pairs(prover, node):
            equal.unite(a, b)
    return equal
