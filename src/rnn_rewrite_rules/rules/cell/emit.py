"""The ``RNN``/``LSTM``/``GRU`` node every rule that builds one emits.

:func:`recurrent_node` writes the node with the inputs and attributes every opset from 7
on reads the same way (``layout`` is left at its default, 0, where it exists): the
form of the opset of any graph the rules rewrite.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from rnn_rewrite_rules._rnn_ops import mark_rule_made

__all__ = ["EMPTY_INPUT_REASON", "recurrent_node"]

#: Why a cell that reads no input (``W`` has no column) is not an LSTM or GRU node: ``X``
#: is empty at every size, and ONNX Runtime 1.32 aborts the process on a GRU node reading
#: an empty input and on an LSTM node at batch 0 (its RNN runs on both), where the cell's
#: ops run; and a guard testing ``Size(X) == 0`` would skip every step.
EMPTY_INPUT_REASON = (
    "the cell's input size is 0: its {op} node would read an empty X at every size, where"
    " ONNX Runtime aborts the process (a GRU always, an LSTM at batch 0)"
)

#: Outputs of each op: ``Y``, ``Y_h`` (and ``Y_c``).
_OUTPUTS = {"RNN": 2, "GRU": 2, "LSTM": 3}


def recurrent_node(
    op,
    op_type: str,
    inputs: Sequence[ir.Value | None],
    *,
    hidden_size: int,
    reverse: bool,
    activations: Sequence[str] | None = None,
    linear_before_reset: int | None = None,
) -> Sequence[ir.Value]:
    """``op_type(*inputs)`` built with ``op`` (trailing absent inputs dropped, the node
    marked ``_rnn_ops.RULE_MADE``), its outputs ``Y, Y_h[, Y_c]``. ``activations`` and
    ``linear_before_reset`` are written when given (None: the op's default, not written)."""
    trimmed = list(inputs)
    while trimmed and trimmed[-1] is None:
        trimmed.pop()
    attributes: dict[str, object] = {
        "hidden_size": int(hidden_size),
        "direction": "reverse" if reverse else "forward",
    }
    if activations is not None:
        attributes["activations"] = list(activations)
    if linear_before_reset is not None:
        attributes["linear_before_reset"] = linear_before_reset
    outputs = getattr(op, op_type)(*trimmed, _outputs=_OUTPUTS[op_type], **attributes)
    mark_rule_made(outputs[0])
    return outputs
