"""Static facts about ONNX recurrent nodes that the rule conditions rely on.

Everything here is read from attributes and what the shape prover proves, never from
value-info annotations, so a fact returned is a fact the runtime must honour.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn_ops import rnn_op
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["RnnFacts", "rnn_facts"]


@dataclasses.dataclass(frozen=True)
class RnnFacts:
    """What an RNN node fixes statically about its ``Y`` output."""

    node: ir.Node
    num_directions: int
    hidden_size: int
    layout: int

    @property
    def op_type(self) -> str:
        return self.node.op_type


def rnn_facts(node: ir.Node | None, prover: ShapeProver | None = None) -> RnnFacts | Refusal:
    """The static facts of an RNN node, or a reason why they cannot be proven.

    ``num_directions`` and ``hidden_size`` come from the attributes and the sizes of
    ``W``/``R`` that ``prover`` proves (pass the check's own to share its work), never
    from value_info.
    """
    if node is None:
        return Refusal("value is not produced by a node")
    if rnn_op(node) is None:
        return Refusal(f"producer is {node.op_type}, not an RNN op")
    sizes = (prover or ShapeProver()).rnn_sizes(node)
    if isinstance(sizes, Refusal):
        return sizes
    return RnnFacts(node, *sizes)
