"""Remove ``Identity`` nodes, in the main graph, functions and every subgraph.

Pattern: ``y = Identity(x)``.
Condition: ``y`` is not an output of the model's graph or a function (those keep their
producer: see :func:`names_an_output`); where ``y`` is a body's output and ``x`` is not
computed in that body (a body input, an outer value or an initializer) or is an output
itself, the node stays.
Replacement: ``y``'s readers read ``x``; a graph output ``y`` keeps its name (``x`` takes
it).
Equality: ``Identity`` returns its input; names are not values.

onnx-ir's ``IdentityEliminationPass`` renames an outer value to a body's output name when
the body passes it through; ONNX Runtime and the Loop rules (which read a passed-through
body output through its ``Identity``) need that ``Identity`` kept, hence this pass.
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules.normalize._node_pass import NodePass
from rnn_rewrite_rules.normalize._values import bypass, names_an_output

__all__ = ["IdentityPass"]


class IdentityPass(NodePass):
    """Every ``Identity`` that can go, gone (see the module docstring); ``journal``
    records each removal, to put back where no rule used it."""

    op_type = "Identity"

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        if names_an_output(node, model) or not node.inputs or len(node.outputs) != 1:
            return False
        source = node.inputs[0]
        return source is not None and bypass(node, source, self.journal)
