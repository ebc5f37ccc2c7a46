"""Drop RNN outputs (Y, Y_h, Y_c) that nothing reads, so the node never materialises them.

Pattern: an ``LSTM``/``GRU``/``RNN`` or ``com.microsoft`` ``DynamicQuantizeLSTM`` node.

Condition: its last output has no consumer (in the graph or any subgraph reading it
from the outer scope) and is not an output of the graph it lives in. Every output
of these ops is optional, so the node without it computes the same other outputs.

Replacement: the same node with every output after the last used one removed.

An unused output *before* a used one (``Y`` when only ``Y_h`` is read) can only be
made empty (name ``""``). Inside ``RewriteRuleSet.apply_to_model`` that cannot
last: onnx-ir's ``NameFixPass``, which onnxscript runs after every pass that changed
something (and ``optimize_ir`` runs last), names every empty output again. So that
case is handled by :class:`rnn_rewrite_rules.passes.EmptyUnusedRnnOutputsPass`, which
:func:`rnn_rewrite_rules.rewrite` and the CLI run after the rules; onnx-ir's own
``RemoveUnusedNodesPass`` does the same for default-domain ops only.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRule

from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, copy_rnn_node, rnn_node_rules

__all__ = [
    "FAMILY",
    "PENDING_READS",
    "DropTrailingUnusedOutputs",
    "is_unused",
    "make_rules",
]


#: ``Value.meta`` key set on a value whose readers a rule moves to it once the rewriter
#: has applied the rewrites of its graph (``bidirectional._state_reads``): it is read.
PENDING_READS = "rnn_rewrite_rules.pending_reads"


def is_unused(value: ir.Value) -> bool:
    """No consumer anywhere (subgraph readers register as uses), not a graph output and
    no readers pending (:data:`PENDING_READS`)."""
    return not value.uses() and not value.is_graph_output() and PENDING_READS not in value.meta


class DropTrailingUnusedOutputs(RnnNodeRule):
    """RNN(...) -> (Y, Y_h, <unused Y_c>) becomes RNN(...) -> (Y, Y_h)."""

    def check_node(self, context: MatchContext, node: ir.Node) -> MatchResult:
        check_result = MatchResult()
        used = [i for i, value in enumerate(node.outputs) if not is_unused(value)]
        if not used:
            return check_result.fail("no output is used: the node is dead code", node)
        if used[-1] == len(node.outputs) - 1:
            return check_result.fail("the last output is used", node.outputs[-1])
        self._keep = used[-1] + 1
        return check_result

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        kept = copy_rnn_node(op, node, self._keep, {})
        # The dropped outputs are dead: hand them back unchanged, they leave with the node.
        return [*kept, *node.outputs[self._keep :]]


def make_rules() -> list[RewriteRule]:
    return rnn_node_rules(DropTrailingUnusedOutputs)


FAMILY = RuleFamily(
    name="unused_outputs",
    description=(__doc__ or "").partition("\n")[0],
    make_rules=make_rules,
    install_by_default=True,
    fixes=(),
)
