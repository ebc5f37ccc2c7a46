"""What every normalisation pass shares: a visit of each node of one op, in the model's
graph, its functions and (unless the pass says otherwise) every subgraph, with a journal
for the edits and a list of refusals.

A pass names its op (``op_type``, default domain) and gives the per-node edit
(:meth:`NodePass.edit`), as onnx_ir's ``passes.common`` passes give theirs; the loop is here.
"""

from __future__ import annotations

from typing import ClassVar

import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._journal import Edit, Journal
from rnn_rewrite_rules.normalize._values import model_graphs

__all__ = ["NodePass"]


class NodePass(ir.passes.InPlacePass):
    """An in-place pass over every node of ``op_type`` (default domain).

    ``journal``: records each edit (:meth:`record`), to put back where no rule used it;
    ``refusals``: (node name, reason) for each node the pass left as written where it says
    why (:meth:`refuse`).
    """

    #: The op this pass edits (default domain).
    op_type: ClassVar[str]
    #: Visit functions and subgraphs too (False: the model's main graph only).
    subgraphs: ClassVar[bool] = True

    def __init__(self, journal: Journal | None = None) -> None:
        super().__init__()
        self.journal = journal
        self.refusals: list[tuple[str, Refusal]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.start(model)
        graphs = model_graphs(model) if self.subgraphs else [model.graph]
        modified = False
        for graph in graphs:
            for node in list(graph):
                if node.op_type == self.op_type and node.domain == "":
                    modified |= self.edit(node, model)
        return ir.passes.PassResult(model, modified=modified)

    def start(self, model: ir.Model) -> None:
        """Before the visit: reset what the pass keeps per model (nothing by default)."""
        del model

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        """Normalise ``node`` (of ``op_type``) in place; True when the graph changed."""
        raise NotImplementedError

    def record(self, edit: Edit) -> None:
        """Record ``edit`` in the journal, when there is one."""
        if self.journal is not None:
            self.journal.record(edit)

    def refuse(self, node: ir.Node, reason: Refusal) -> None:
        """Note that ``node`` stays as written, and why."""
        self.refusals.append((node.name or "", reason))
