"""Remove every node no graph output depends on, however the graph is ordered."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

__all__ = ["RemoveDeadNodesPass"]


class RemoveDeadNodesPass(ir.passes.InPlacePass):
    """onnx-ir's ``RemoveUnusedNodesPass`` (and unused main-graph initializers), to a fixpoint.

    That pass walks the graph once, in reverse order. A rewrite puts its replacement where
    the matched root was, so a dead reader of a replaced value (a node of the old chain)
    can sit before its new producer; one walk then keeps the producer, whose reader it
    removes only after. Run between rule rounds, this also keeps the rules from rewriting
    dead code (a rerolled chain's leftover steps, rerolled again into a node nothing reads).
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        while common_passes.RemoveUnusedNodesPass()(model).modified:
            modified = True
        return ir.passes.PassResult(model, modified=modified)
