"""Model-unique names for the nodes rules emitted."""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import onnx_ir as ir

__all__ = ["UniqueRewrittenNodeNamesPass", "model_nodes"]

#: The metadata key onnxscript's rewriter (0.6.0 and later) puts on every node a rule emitted.
_RULE_NAME_TAG = "pkg.onnxscript.rewriter.rule_name"


def model_nodes(model: ir.Model) -> list[ir.Node]:
    """Every node of ``model``: its graph's, its subgraphs' and its functions'."""
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    for function in model.functions.values():
        nodes.extend(ir.traversal.RecursiveGraphIterator(function))
    return nodes


class UniqueRewrittenNodeNamesPass(ir.passes.InPlacePass):
    """Rename nodes a rule emitted whose name another node of the model already has.

    Each graph and subgraph names new nodes with its own counter (``node_Constant_0`` in
    both branches of an ``If``). A node a rewrite re-emitted under its original name keeps
    it (the original is gone); nodes of the original model are never renamed.

    A rule emitted the nodes not in ``original`` (the model's nodes before the rules ran,
    held weakly so that the nodes the rules removed are freed). Without it, those that
    carry onnxscript's rule-name tag, which onnxscript 0.5 does not put.
    """

    def __init__(self, original: Iterable[ir.Node] | None = None) -> None:
        super().__init__()
        self._original = None if original is None else weakref.WeakSet(original)

    def _emitted(self, node: ir.Node) -> bool:
        if self._original is None:
            return _RULE_NAME_TAG in node.metadata_props
        return node not in self._original

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        nodes = model_nodes(model)
        taken = {n.name for n in nodes if n.name and not self._emitted(n)}
        modified = False
        for node in nodes:
            if not node.name or not self._emitted(node):
                continue
            if node.name in taken:
                base, index = node.name, 1
                while f"{base}_{index}" in taken:
                    index += 1
                node.name = f"{base}_{index}"
                modified = True
            taken.add(node.name)
        return ir.passes.PassResult(model, modified=modified)
