"""Rewrite batch-first (layout=1) LSTM/GRU/RNN nodes into layout=0 with Transposes around them.

Pattern: an ``LSTM``/``GRU``/``RNN`` node with ``layout=1``: ``X [batch, seq, I]``,
``initial_h``/``initial_c [batch, D, H]``, ``Y [batch, seq, D, H]``,
``Y_h``/``Y_c [batch, D, H]``. ONNX Runtime's CPU kernels reject it ("Batchwise
recurrent operations (layout == 1) are not supported").

Condition: ``layout`` is 1 and the node's direction and weights agree (``rnn_facts``).
The ONNX spec defines layout=1 as exactly layout=0 with those axes swapped, so the
rewrite is an identity on values; ``sequence_lens [batch]``, ``W``/``R``/``B``/``P``
have no batch-dependent layout and pass through unchanged.

Replacement: ``Transpose(X, [1,0,2])`` and ``Transpose(state, [1,0,2])`` into the same
node with ``layout`` removed (0), then ``Transpose(Y', [2,0,1,3])`` and
``Transpose(Y_h', [1,0,2])`` (``Y_c`` alike), only for outputs something reads;
trailing unused outputs are dropped. The Transposes are left for the glue rules (and
onnxscript's Transpose fusion) to cancel against the exporter's own.

Not installed into onnxscript's defaults (its ``FAMILY.install_by_default`` is False): it changes a
node attribute the model's author chose and adds Transposes that runtimes which do
support layout=1 (the reference evaluator, tract, TensorRT) do not need, so it is not a
neutral optimisation. ``rnn-rewrite`` applies it by default because making the model
run on ONNX Runtime is what the command is for; pass ``"layout"`` to
``install()`` / ``rules()`` to opt in.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRule

from rnn_rewrite_rules._compat import emit_node
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules._rnn_ops import RNN_OPS
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, keep_identity, rnn_node_rules
from rnn_rewrite_rules.rules.unused_outputs import is_unused

__all__ = ["FAMILY", "LayoutToTimeMajor", "make_rules"]


class LayoutToTimeMajor(RnnNodeRule):
    """RNN(X, ..., layout=1) -> Transpose(RNN(Transpose(X), ..., layout=0)) per used output."""

    def check_node(self, context: MatchContext, node: ir.Node) -> MatchResult:
        check_result = MatchResult()
        if "layout" not in RNN_OPS[(self.domain, self.op_type)].attributes:
            return check_result.fail(f"{node.op_type} has no layout attribute", node)
        if node.attributes.get_int("layout", 0) != 1:
            return check_result.fail("layout is already 0", node)
        facts = rnn_facts(node)
        if isinstance(facts, Refusal):
            return check_result.fail(facts, node)
        used = [i for i, value in enumerate(node.outputs) if not is_unused(value)]
        if not used:
            return check_result.fail("no output is used: the node is dead code", node)
        self._used = used
        return check_result

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        inputs: list[ir.Value | None] = list(node.inputs)
        inputs[0] = op.Transpose(inputs[0], perm=[1, 0, 2])
        for index in RNN_OPS[(node.domain, node.op_type)].state_inputs:
            if index < len(inputs) and inputs[index] is not None:
                inputs[index] = op.Transpose(inputs[index], perm=[1, 0, 2])
        while inputs and inputs[-1] is None:
            inputs.pop()
        attributes = {k: v for k, v in node.attributes.items() if k != "layout"}
        keep = self._used[-1] + 1
        outputs = emit_node(
            op, node.op_type, inputs, attributes, domain=node.domain, num_outputs=keep
        )
        keep_identity(outputs[0].producer(), node)
        result = []
        for index, old in enumerate(node.outputs):
            if index not in self._used:
                result.append(old)  # dead: leaves with the node
            elif index == 0:
                result.append(op.Transpose(outputs[0], perm=[2, 0, 1, 3]))
            else:
                result.append(op.Transpose(outputs[index], perm=[1, 0, 2]))
        return result


def make_rules() -> list[RewriteRule]:
    return rnn_node_rules(LayoutToTimeMajor)


FAMILY = RuleFamily(
    name="layout",
    description=(__doc__ or "").partition("\n")[0],
    make_rules=make_rules,
    install_by_default=False,
    fixes=("layout-1",),
)
