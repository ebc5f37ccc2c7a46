"""A rule base for rewrites that replace an RNN node by a copy with other inputs.

The onnxscript matcher refuses a match when an output the pattern does not name is used
outside it, so a rule rooted at an RNN node is one pattern per number of outputs; those
patterns are one rule per op (:class:`~rnn_rewrite_rules.rules._forms.FormRule`), named
``Class[OP]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRule, RewriteRuleClassBase

from rnn_rewrite_rules._compat import emit_node
from rnn_rewrite_rules._refusal import Inapplicable
from rnn_rewrite_rules._rnn_ops import (
    REPLACES_BATCH_0_RUN,
    RNN_OPS,
    RULE_MADE,
    is_rule_made,
    replaces_batch_0_run,
)
from rnn_rewrite_rules.rules._forms import FormRule

__all__ = ["RnnNodeRule", "copy_rnn_node", "keep_identity", "rnn_node_rules"]


class RnnNodeRule(RewriteRuleClassBase):
    """Matches one RNN op with ``num_outputs`` outputs, any inputs and attributes.

    Subclasses implement ``check_node(self, context, node)`` and ``rewrite(self, op, out0,
    **_)`` (the node is ``self.node(out0)``). The matcher also accepts a node with fewer
    outputs than the pattern names; :meth:`check` refuses those before ``check_node``.
    """

    def __init__(self, domain: str, op_type: str, num_outputs: int) -> None:
        super().__init__(name=f"{type(self).__name__}[{op_type}/{num_outputs}]")
        self.domain = domain
        self.op_type = op_type
        self.num_outputs = num_outputs

    def pattern(self, op, x):
        return getattr(op, self.op_type)(
            x,
            _domain=self.domain,
            _allow_other_inputs=True,
            _allow_other_attributes=True,
            _outputs=[f"out{i}" for i in range(self.num_outputs)],
        )

    def check(self, context: MatchContext, out0: ir.Value, **_: Any) -> MatchResult:
        node = self.node(out0)
        if len(node.outputs) != self.num_outputs:
            return MatchResult().fail(
                Inapplicable(f"node has {len(node.outputs)} outputs, not {self.num_outputs}"), node
            )
        return self.check_node(context, node)

    def check_node(self, context: MatchContext, node: ir.Node) -> MatchResult:
        raise NotImplementedError

    @staticmethod
    def node(out0: ir.Value) -> ir.Node:
        node = out0.producer()
        assert node is not None
        return node


def copy_rnn_node(
    op, node: ir.Node, num_outputs: int, new_inputs: Mapping[int, ir.Value | None]
) -> Sequence[ir.Value]:
    """Emit ``node`` again with some inputs replaced; trailing empty inputs are dropped."""
    inputs = list(node.inputs)
    for index, value in new_inputs.items():
        inputs += [None] * (index + 1 - len(inputs))
        inputs[index] = value
    while inputs and inputs[-1] is None:
        inputs.pop()
    result = emit_node(
        op, node.op_type, inputs, node.attributes, domain=node.domain, num_outputs=num_outputs
    )
    keep_identity(result[0].producer(), node)
    return result


def keep_identity(new: ir.Node | None, old: ir.Node) -> None:
    """Give the node a rewrite emits in place of ``old`` its name, doc string and metadata
    (and ``old``'s marks, :data:`~rnn_rewrite_rules._rnn_ops.RULE_MADE` and
    :data:`~rnn_rewrite_rules._rnn_ops.REPLACES_BATCH_0_RUN`).

    Set before the rewriter inserts the node, so the graph's name authority keeps the name
    (it names only unnamed nodes); ``--check`` and the report then show the original name.
    """
    if new is None:
        return
    if old.name:
        new.name = old.name
    if old.doc_string:
        new.doc_string = old.doc_string
    for key, value in old.metadata_props.items():
        new.metadata_props.setdefault(key, value)
    if is_rule_made(old):
        new.meta[RULE_MADE] = True
    if replaces_batch_0_run(old):
        new.meta[REPLACES_BATCH_0_RUN] = True


def rnn_node_rules(rule_class: type[RnnNodeRule]) -> list[RewriteRule]:
    """One rule per RNN op, ``Class[OP]``, trying each output count, most outputs first."""
    return [
        FormRule(
            f"{rule_class.__name__}[{spec.op_type}]",
            [
                rule_class.rule(spec.domain, spec.op_type, n)
                for n in range(len(spec.outputs), 0, -1)
            ],
        )
        for spec in RNN_OPS.values()
    ]
