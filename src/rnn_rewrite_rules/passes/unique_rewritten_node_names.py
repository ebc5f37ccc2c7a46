"""Model-unique names for the nodes rules emitted."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["UniqueRewrittenNodeNamesPass"]

#: The metadata key onnxscript's rewriter puts on every node a rule emitted.
_RULE_NAME_TAG = "pkg.onnxscript.rewriter.rule_name"


class UniqueRewrittenNodeNamesPass(ir.passes.InPlacePass):
    """Rename nodes a rule emitted whose name another node of the model already has.

    Each graph and subgraph names new nodes with its own counter (``node_Constant_0`` in
    both branches of an ``If``). A node a rewrite re-emitted under its original name keeps
    it (the original is gone); nodes of the original model are never renamed.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
        for function in model.functions.values():
            nodes.extend(ir.traversal.RecursiveGraphIterator(function))
        taken = {n.name for n in nodes if n.name and _RULE_NAME_TAG not in n.metadata_props}
        modified = False
        for node in nodes:
            if not node.name or _RULE_NAME_TAG not in node.metadata_props:
                continue
            if node.name in taken:
                base, index = node.name, 1
                while f"{base}_{index}" in taken:
                    index += 1
                node.name = f"{base}_{index}"
                modified = True
            taken.add(node.name)
        return ir.passes.PassResult(model, modified=modified)
