"""Drop initial states that are provably all zeros (the ONNX default) and their shape work.

Pattern: an ``LSTM``/``GRU``/``RNN`` node whose ``initial_h`` (input 5) or
``initial_c`` (input 6, LSTM) is computed from a zero constant by ops that
preserve "every element is zero": torchlib's
``Slice(Expand(0.0, Concat([L*D], Shape(x)[batch], [H])), [l*D], [(l+1)*D], axes=[0])``.

Condition: the state's value is produced by a chain of ``Slice`` / ``Expand`` /
``Identity`` (data input only) ending in a constant tensor whose elements are
all zero. The runtime already requires the state to have shape
``[D, batch, H]``, so its shape carries no information; ONNX defines a missing
state as zeros. Replacement: the same RNN node with that input empty, which
lets the ``Shape``/``Concat``/``Expand``/``Slice`` chain die.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleSet

from rnn_rewrite_rules._rnn import const_array
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, copy_rnn_node, rnn_node_rules

__all__ = ["INSTALL_BY_DEFAULT", "DropZeroInitialState", "is_all_zeros", "rules"]

INSTALL_BY_DEFAULT = True

#: Ops whose output is all zeros whenever their first (data) input is.
_ZERO_PRESERVING = frozenset({"Slice", "Expand", "Identity"})
_MAX_DEPTH = 8


def is_all_zeros(value: ir.Value | None) -> bool:
    """True when every element of ``value`` is provably zero (never for graph inputs)."""
    for _ in range(_MAX_DEPTH):
        if value is None or value.is_graph_input():
            return False
        array = const_array(value)
        if array is not None:
            return bool(np.all(array == 0))
        node = value.producer()
        if node is None or node.domain != "" or node.op_type not in _ZERO_PRESERVING:
            return False
        value = node.inputs[0]
    return False


def _state_indices(op_type: str) -> tuple[int, ...]:
    return (5, 6) if op_type in ("LSTM", "DynamicQuantizeLSTM") else (5,)


class DropZeroInitialState(RnnNodeRule):
    """RNN(..., initial_h=zeros, initial_c=zeros) -> RNN(..., "", "")."""

    def check(self, context, out0: ir.Value, **_) -> MatchResult:
        check_result = MatchResult()
        node = self.node(out0)
        inputs = node.inputs
        self._zero_states = [
            i for i in _state_indices(self.op_type) if i < len(inputs) and is_all_zeros(inputs[i])
        ]
        if not self._zero_states:
            return check_result.fail("no initial state is a provable all-zero tensor")
        return check_result

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        return copy_rnn_node(op, node, self.num_outputs, dict.fromkeys(self._zero_states))


rules = RewriteRuleSet(rnn_node_rules(DropZeroInitialState))
