"""onnx-ir passes :func:`rnn_rewrite_rules.rewrite` and the CLI run after the rules.

One module per pass, as in ``onnx_ir.passes.common``.
"""

from rnn_rewrite_rules.passes.batch_zero_guard import BatchZeroGuardPass
from rnn_rewrite_rules.passes.declared_output_shapes import DeclaredOutputShapesPass
from rnn_rewrite_rules.passes.empty_unused_rnn_outputs import (
    EmptyUnusedRnnOutputsPass,
    empty_unused_rnn_outputs,
)
from rnn_rewrite_rules.passes.forward_reverse_nodes import ForwardReverseNodesPass
from rnn_rewrite_rules.passes.initializer_info_from_tensor import InitializerInfoFromTensorPass
from rnn_rewrite_rules.passes.remove_dead_nodes import RemoveDeadNodesPass
from rnn_rewrite_rules.passes.remove_unused_subgraph_initializers import (
    RemoveUnusedSubgraphInitializersPass,
)
from rnn_rewrite_rules.passes.unique_rewritten_node_names import UniqueRewrittenNodeNamesPass

__all__ = [
    "BatchZeroGuardPass",
    "DeclaredOutputShapesPass",
    "EmptyUnusedRnnOutputsPass",
    "ForwardReverseNodesPass",
    "InitializerInfoFromTensorPass",
    "RemoveDeadNodesPass",
    "RemoveUnusedSubgraphInitializersPass",
    "UniqueRewrittenNodeNamesPass",
    "empty_unused_rnn_outputs",
]
