"""Name unused RNN outputs ``""`` and drop trailing ones (see ``rules/unused_outputs.py``).

Inside ``RewriteRuleSet.apply_to_model`` an empty output name cannot last (onnx-ir's
``NameFixPass`` names it again), so this runs after the rules.
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._rnn_ops import is_rnn
from rnn_rewrite_rules.rules.unused_outputs import is_unused

__all__ = ["EmptyUnusedRnnOutputsPass", "empty_unused_rnn_outputs"]


def empty_unused_rnn_outputs(graph_like: ir.Graph | ir.Function) -> int:
    """Name unused RNN outputs ``""`` and drop trailing ones, in subgraphs too.

    Returns the number of outputs changed. Run it after the rewriter (see module docs).
    """
    count = 0
    for node in ir.traversal.RecursiveGraphIterator(graph_like):
        if not is_rnn(node):
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
