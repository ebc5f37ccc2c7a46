"""Leave initializers' type and shape to their tensors (no value_info added on writing)."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["InitializerInfoFromTensorPass"]


class InitializerInfoFromTensorPass(ir.passes.InPlacePass):
    """Clear the type and shape of initializers that are neither graph inputs nor outputs.

    ``onnx_ir`` writes a ``value_info`` for every value with a type, and reading a model
    gives each initializer its tensor's type: a model read and written back would gain
    one ``value_info`` per initializer. The tensor itself carries both, so nothing is lost.
    A graph input or output declares its type in the graph's interface (the checker
    requires it), so those keep theirs, of the main graph and of every subgraph.
    Reports no modification: the serialized model is what it was.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        for graph in (model.graph, *model.graph.subgraphs()):
            for value in graph.initializers.values():
                if not (value.is_graph_input() or value.is_graph_output()):
                    value.type = None
                    value.shape = None
        return ir.passes.PassResult(model, modified=False)
