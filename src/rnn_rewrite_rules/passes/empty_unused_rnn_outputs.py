"""Name unused RNN outputs ``""`` and drop trailing ones, in subgraphs too.

onnx-ir's ``RemoveUnusedNodesPass`` (which :class:`~rnn_rewrite_rules.passes
.RemoveDeadNodesPass` runs before this, in :func:`rnn_rewrite_rules._api.cleanup`) does the
same for ops of the ONNX domain from their schemas in recent releases, but not inside an
``If`` branch on onnx-ir 0.1.15 (the lowest supported), and it skips other domains
(``com.microsoft``'s ``DynamicQuantizeLSTM``, an input ORT's quantizer made): this pass
covers every RNN op on every supported version. Inside ``RewriteRuleSet.apply_to_model``
an empty output name cannot last (onnx-ir's ``NameFixPass`` names it again), so both run
after the rules (see ``rules/unused_outputs.py``).
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._rnn_ops import is_rnn
from rnn_rewrite_rules.rules.unused_outputs import is_unused

__all__ = ["EmptyUnusedRnnOutputsPass", "empty_unused_rnn_outputs"]


def empty_unused_rnn_outputs(
    graph_like: ir.Graph | ir.Function, *, onnx_domain: bool = True
) -> int:
    """Name unused RNN outputs ``""`` and drop trailing ones, in subgraphs too (with
    ``onnx_domain=False``, only of RNN ops outside the ONNX domain).

    Returns the number of outputs changed. Run it after the rewriter (see module docs).
    """
    count = 0
    for node in ir.traversal.RecursiveGraphIterator(graph_like):
        if not is_rnn(node) or (not onnx_domain and node.domain in ("", "ai.onnx")):
            continue
        for value in node.outputs:
            if value.name and is_unused(value):
                value.name = ""
                count += 1
        keep = len(node.outputs)
        while keep > 1 and not node.outputs[keep - 1].name:
            keep -= 1
        if keep != len(node.outputs):
            node.resize_outputs(keep)
    return count


class EmptyUnusedRnnOutputsPass(ir.passes.InPlacePass):
    """:func:`empty_unused_rnn_outputs` over the main graph and every function."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = empty_unused_rnn_outputs(model.graph)
        for function in model.functions.values():
            count += empty_unused_rnn_outputs(function)
        return ir.passes.PassResult(model, modified=bool(count))
