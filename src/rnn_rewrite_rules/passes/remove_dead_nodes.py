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
    A removed node's subgraphs keep their reads of outer values (onnx-ir detaches the node's
    own inputs only): those stale readers are detached too, so the values' producers die.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        while True:
            removed = common_passes.RemoveUnusedNodesPass()(model).modified
            stale = _stale_readers(model.graph)
            for node in stale:
                for index in range(len(node.inputs)):
                    node.replace_input_with(index, None)
            if not (removed or stale):
                break
            modified = True
        return ir.passes.PassResult(model, modified=modified)


def _stale_readers(graph: ir.Graph) -> set[ir.Node]:
    """Nodes outside ``graph`` (and its subgraphs) that still read its values: the body of
    a removed ``If``/``Loop``/``Scan`` keeps its reads of outer values, which would keep
    their producers alive (a rewrite that replaces an ``If`` by another leaves them)."""
    live = set(ir.traversal.RecursiveGraphIterator(graph))
    values = [*graph.inputs, *graph.initializers.values()]
    values += [v for node in live for v in node.outputs]
    return {user for value in values for user, _ in value.uses() if user not in live}
