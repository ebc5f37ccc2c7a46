"""Remove ``Cast`` nodes that return their input: a Cast to the input's own type, and a
round trip through a type that holds every value of the input's type exactly.

Pattern: ``y = Cast(x, to=T)``, or ``y = Cast(Cast(x, to=U), to=T)``.
Condition: ``x``'s element type is proven ``T`` from the graph alone (a constant, a
graph-input declaration, op semantics: see :class:`ElementTypes`), never from
value_info; for the round trip, every ``T`` value is a ``U`` value (numpy's ``safe``
casting: float32 -> float64, int32 -> int64, int16 -> float32, ...); ``y`` is not an
output of the model's graph or a function (see :func:`names_an_output`).
Replacement: ``y``'s readers read ``x``; a graph output keeps its name (see
:func:`bypass`).
Equality: a Cast to the same type copies; ``T -> U`` is exact when ``U`` holds every
``T`` value, so ``U -> T`` returns the original value (a NaN stays a NaN).

onnxscript's ``CastIdentity`` reads the input's type from value_info and ``CastCast``
keeps the second Cast; the Loop rules need ``h_t`` itself as the body output, hence
this pass.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules.normalize._node_pass import NodePass
from rnn_rewrite_rules.normalize._values import ElementTypes, bypass, names_an_output

__all__ = ["NoOpCastPass", "holds_exactly"]


def holds_exactly(narrow: ir.DataType, wide: ir.DataType) -> bool:
    """Every value of ``narrow`` is a value of ``wide``."""
    if narrow == wide:
        return True
    try:
        return bool(np.can_cast(narrow.numpy(), wide.numpy(), casting="safe"))
    except TypeError:  # no numpy type (bfloat16, float8, 4-bit ints): not proven
        return False


def _cast_to(node: ir.Node) -> ir.DataType:
    return ir.DataType(node.attributes.get_int("to", 0))


class NoOpCastPass(NodePass):
    """Every Cast that returns its input, gone (see the module docstring); ``journal``
    records each removal, to put back where no rule used it."""

    op_type = "Cast"

    def start(self, model: ir.Model) -> None:
        self._types = ElementTypes()

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        if not node.inputs or names_an_output(node, model):
            return False
        found = _source(node, self._types)
        if found is None:
            return False
        source, chain = found
        return bypass(node, source, self.journal, chain)


def _source(node: ir.Node, types: ElementTypes) -> tuple[ir.Value, list[ir.Node]] | None:
    """The value ``node`` (a Cast) provably returns and the round trip's first Cast
    (if any) between them, else None."""
    x = node.inputs[0]
    target = _cast_to(node)
    if x is None:
        return None
    if types(x) == target:
        return x, []
    inner = x.producer()
    if inner is None or inner.op_type != "Cast" or inner.domain != "" or not inner.inputs:
        return None
    original = inner.inputs[0]
    if original is None or types(original) != target:
        return None
    return (original, [inner]) if holds_exactly(target, _cast_to(inner)) else None
