"""``X`` and initial states of batches not proven equal, expanded to the batch they
broadcast to.

A recurrence written op by op (an unrolled cell loop, a Loop or Scan body) adds
``x_t @ W`` to ``h_{t-1} @ R``: where ``h_0`` (or ``c_0``) is a value whose batch the prover
cannot tie to ``X``'s (a graph input, an encoder's final state), NumPy-style broadcasting
makes every step's batch the broadcast of the two (a batch of 1 against ``B`` gives ``B``;
two other sizes fail). One RNN node requires ``X``'s batch and the states' to be equal, so
the rewrite expands ``X`` and the states to that broadcast batch: equal outputs wherever
the original runs, and an error (``Expand`` cannot broadcast) wherever it fails.
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules._graph import Ints, slice_

__all__ = [
    "BROADCAST_MIN_OPSET",
    "broadcast_batches",
    "broadcast_cell_state",
    "broadcast_opset_reason",
    "broadcast_state_nodes",
]

#: ``Expand`` is opset 8: before it, the states cannot be expanded.
BROADCAST_MIN_OPSET = 8


def broadcast_opset_reason(opset: int) -> Refusal | None:
    """Why the broadcast cannot be written at ``opset`` (None: it can)."""
    if opset >= BROADCAST_MIN_OPSET:
        return None
    return Refusal(
        f"the initial states' batch is not proven X's, and opset {opset} has no Expand to "
        "broadcast them"
    )


def broadcast_batches(
    op, x: ir.Value, h0: ir.Value, c0: ir.Value | None, opset: int, ints: Ints
) -> tuple[ir.Value, ir.Value, ir.Value | None]:
    """``X [T, B, I]``, ``h0 [B', H]`` and ``c0 [B'', H]`` (None: none; ``h0`` itself:
    one value for both) expanded to the batch all three broadcast to."""
    x_batch = slice_(op, op.Shape(x), [1], [2], [0], opset, ints)
    same = c0 is h0  # one value for both (tf2onnx's zeros): one expansion
    h0 = op.Expand(h0, op.Concat(x_batch, ints([1]), axis=0))
    if c0 is not None and same:
        c0 = h0
    elif c0 is not None:
        c0 = op.Expand(c0, op.Shape(h0))
        h0 = op.Expand(h0, op.Shape(c0))
    batch = slice_(op, op.Shape(h0), [0], [1], [0], opset, ints)
    x = op.Expand(x, op.Concat(ints([1]), batch, ints([1]), axis=0))
    return x, h0, c0


def broadcast_state_nodes(opset: int) -> int:
    """The nodes :func:`broadcast_cell_state` emits at ``opset`` (``Shape`` slices from 15)."""
    return 6 if opset >= 15 else 7


def broadcast_cell_state(
    op, x: ir.Value, h0: ir.Value, c0: ir.Value, opset: int, ints: Ints
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``x [B, I]`` and ``h0 [B, H]`` of a batch proven equal, and ``c0 [B', H]``, expanded
    to the batch ``B`` and ``B'`` broadcast to: ``x`` and ``h0`` to ``[B', 1]``, ``c0`` to
    ``h0``'s shape (:func:`broadcast_state_nodes` nodes, against 12 for three batches)."""
    if opset >= 15:
        rows = op.Shape(c0, start=0, end=1)
    else:
        rows = slice_(op, op.Shape(c0), [0], [1], [0], opset, ints)
    column = op.Concat(rows, ints([1]), axis=0)
    return op.Expand(x, column), op.Expand(h0, column), op.Expand(c0, op.Shape(h0))
