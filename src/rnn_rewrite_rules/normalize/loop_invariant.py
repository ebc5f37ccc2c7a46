"""Read a value a ``Loop`` carries unchanged as the outer value it starts from
(jax2onnx's scan carries the weights and the sequence around the loop through Identity).

Pattern: ``Loop(M, cond, ..., v0, ...)`` whose body passes carried input ``v_in`` to its
carried output ``v_out`` unchanged (``v_out`` is ``v_in``, through Identity nodes).
Condition: ``v0`` is given (not empty); the Loop stacks no scan output, or runs at least
one iteration (``M`` a constant >= 1, the first condition absent or a constant true).
Replacement: every other reader of ``v_in`` in the body reads ``v0`` (a body may read any
value of the scopes around it); the carried slot stays, so the Loop's signature and its
final value are as written.
Equality: by induction ``v_in`` is ``v0`` at every iteration (``v_in(0) = v0``,
``v_in(k+1) = v_out(k) = v_in(k)``). A Loop of zero iterations runs no body, but ONNX
Runtime shapes a stack of no step from the body's scan output as it infers it, and a body
reading the typed outer value infers more (jax2onnx's nnx LSTM at seq 0: ``(0, 0, 8)``
instead of the original's ``(0, 0, 0)``): hence the condition.

onnx_ir and onnxscript have no such pass (onnxscript's loop rules do not read bodies'
carried values); the Loop rules find the sequence read by ``Gather(X, t)`` outside the
body only after it, hence this pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Sequence

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._node_pass import NodePass

__all__ = ["LoopInvariantPass", "Redirected"]


@dataclasses.dataclass
class Redirected:
    """``readers`` read ``outer`` instead of ``inner`` (equal to it)."""

    inner: ir.Value
    outer: ir.Value
    readers: Sequence[tuple[ir.Node, int]]

    def undo(self, original: Container[ir.Node]) -> bool:
        del original  # a node a rule emitted reads the outer value by the rule's choice
        readers = [
            (user, index)
            for user, index in self.readers
            if user.graph is not None and index < len(user.inputs)
            if user.inputs[index] is self.outer
        ]
        for user, index in readers:
            user.replace_input_with(index, self.inner)
        return bool(readers)


def _passed_through(value_out: ir.Value, value_in: ir.Value) -> bool:
    current: ir.Value | None = value_out
    while current is not None and current is not value_in:
        node = current.producer()
        if node is None or node.op_type != "Identity" or node.domain != "" or not node.inputs:
            return False
        current = node.inputs[0]
    return current is value_in


_MAY_RUN_NO_STEP = Refusal(
    "the Loop may run no step and stacks outputs: ONNX Runtime shapes a stack of no step"
    " from the body's inferred shapes, which reading the outer values can change"
)


def _scalar(value: ir.Value | None) -> np.ndarray | None:
    array = None if value is None else const_array(value)
    return None if array is None or array.size != 1 else array.reshape(())


def _runs_a_step(node: ir.Node) -> bool:
    """``node`` (a Loop) runs at least one iteration: a constant trip count >= 1 and no
    first condition or a constant true one."""
    trips = _scalar(node.inputs[0] if node.inputs else None)
    if trips is None or trips.dtype.kind not in "iu" or int(trips) < 1:
        return False
    if len(node.inputs) < 2 or node.inputs[1] is None:
        return True
    first = _scalar(node.inputs[1])
    return first is not None and bool(first)


class LoopInvariantPass(NodePass):
    """Every body reader of a value carried unchanged reads the outer value (see the
    module docstring); ``journal`` records each, to put back where no rule used it;
    ``refusals``: (Loop name, reason) for each Loop carrying values unchanged left as
    written."""

    op_type = "Loop"

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        return self._loop(node)

    def _loop(self, node: ir.Node) -> bool:
        attr = node.attributes.get("body")
        if attr is None or attr.type != ir.AttributeType.GRAPH:
            return False
        body = attr.as_graph()
        initial = list(node.inputs[2:])
        carried_in = list(body.inputs[2:])
        carried_out = list(body.outputs[1:])
        if len(carried_in) != len(initial) or len(carried_out) < len(initial):
            return False
        stacks = len(carried_out) > len(initial)
        if stacks and not _runs_a_step(node):
            if any(
                v0 is not None and _passed_through(v_out, v_in)
                for v0, v_in, v_out in zip(initial, carried_in, carried_out, strict=False)
            ):
                self.refuse(node, _MAY_RUN_NO_STEP)
            return False
        modified = False
        for v0, v_in, v_out in zip(initial, carried_in, carried_out, strict=False):
            if v0 is None or not _passed_through(v_out, v_in):
                continue
            readers = [
                (user, index)
                for user, index in v_in.uses()
                if not (user.op_type == "Identity" and _passed_through(v_out, user.outputs[0]))
            ]
            for user, index in readers:
                user.replace_input_with(index, v0)
            if readers:
                self.record(Redirected(v_in, v0, readers))
            modified |= bool(readers)
        return modified
