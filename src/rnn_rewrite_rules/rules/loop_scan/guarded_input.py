"""The sequence a Loop reads from the zero-step guard of the layer before it.

A second layer's ``X`` is an output of the ``If`` that guards the first layer's node
(``_common._emit_guarded``): the node's ``Y`` in its ``else`` branch, and in its ``then``
branch the first layer's stack where its ``X0`` is empty (the lean guard's pass-through
``Loop``, ``zero_step.is_zero_step_loop``) or the first Loop as written (the exact guard,
``_common._kept_loop``). Neither branch alone proves ``X``'s rank, so nothing is proven of
the ``If``'s output for every run.

But the second layer's node runs only where ``X`` is not empty: behind its own guard
(``Size(X) == 0``), or where the original fails at 0 steps. A lean ``then`` branch runs
where ``X0`` is empty and stacks the empty initial state (``X0``'s batch) over ``X0``'s
length: an empty stack (and of length 0 where its trip count is a constant 0, the guard
of a cell reading no input, which tests the length: wherever ``len(X) != 0`` the
``else`` branch ran). An exact ``then`` branch gives the first Loop's stack of ``h_t``, whose
``h_t`` has ``X0``'s batch (the cell the rule proved broadcasts ``x_t``'s rows): where
the first guard took it ``X0`` is empty. At length or batch 0 the stack has no element;
at input size 0 the body's ``x_t @ W`` fails unless ``W`` has no row, and then the stack
is ``[T, batch, H]`` as the node's ``Y`` is. So wherever ``Size(X) != 0`` the ``else``
branch's facts hold, and the second layer's plan reads ``X`` by them
(``ShapeProver(else_taken=...)``): they hold wherever its node runs.
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array
from rnn_rewrite_rules.rules.cell import through_identity
from rnn_rewrite_rules.rules.loop_scan.zero_step import is_zero_step_loop, through_transposes

__all__ = ["guard_read_by_else", "mark_guard"]

#: ``node.meta`` key of a guard ``If`` the rules wrote (a file cannot forge it).
_GUARD = "rnn_rewrite_rules.zero_step_guard"


def mark_guard(output: ir.Value) -> None:
    """Mark the ``If`` producing ``output`` as a zero-step guard the rules wrote."""
    node = output.producer()
    if node is not None:
        node.meta[_GUARD] = True


def guard_read_by_else(x: ir.Value, size_guarded: bool) -> ir.Node | None:
    """The rule-made guard ``If`` producing ``x`` whose ``else`` branch gave ``x`` wherever
    ``x`` is not empty (``size_guarded``: the reader's node runs only where
    ``Size(x) != 0``; ``x`` may then be read through ``Transpose``s and ``Identity``s,
    which keep the number of elements) or has a length other than 0 (else), or None."""
    if size_guarded:
        x, _ = through_transposes(x)
    node = x.producer()
    index = x.index()
    if node is None or index is None or (node.domain, node.op_type) != ("", "If"):
        return None
    if not node.meta.get(_GUARD, False):
        return None
    attr = node.attributes.get("then_branch")
    then = None if attr is None else attr.as_graph()
    if then is None or index >= len(then.outputs):
        return None
    stack = through_identity(then.outputs[index])
    loop, position = stack.producer(), stack.index()
    if loop is None or position is None or (loop.domain, loop.op_type) != ("", "Loop"):
        return None
    if position < len(loop.inputs) - 2:  # a carried value: no stack
        return None
    if is_zero_step_loop(loop) and _runs_no_step(loop):  # a stack of length 0
        return node
    return node if size_guarded and loop.graph is then else None


def _runs_no_step(loop: ir.Node) -> bool:
    """The pass-through Loop's trip count is a constant 0 (a cell that reads no ``x_t``)."""
    trips = const_array(loop.inputs[0]) if loop.inputs else None
    return trips is not None and trips.size == 1 and int(trips.reshape(())) == 0
