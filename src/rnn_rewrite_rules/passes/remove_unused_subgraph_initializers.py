"""Drop initializers of If/Loop/Scan bodies that nothing reads any more."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["RemoveUnusedSubgraphInitializersPass"]


class RemoveUnusedSubgraphInitializersPass(ir.passes.InPlacePass):
    """Drop initializers of If/Loop/Scan bodies that nothing reads any more.

    onnx-ir's ``RemoveUnusedNodesPass`` drops unused initializers of the main graph
    only (read in onnx-ir 1.1.0, newer than the lowest supported 0.1.15); without this,
    folding weights stored inside a subgraph would keep the originals next to the folded
    tensors. onnx-ir's ``LiftSubgraphInitializersToMainGraphPass`` would move every body
    initializer to the main graph, a different layout than the exporter's, used or not;
    no onnx-ir pass drops a body's unused initializers in place, hence this one.
    :func:`rnn_rewrite_rules.rewrite` runs it.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = 0
        for graph in model.graphs():
            if graph is model.graph:
                continue
            for name, value in tuple(graph.initializers.items()):
                if not (value.uses() or value.is_graph_output() or value.is_graph_input()):
                    del graph.initializers[name]
                    count += 1
        return ir.passes.PassResult(model, modified=bool(count))
