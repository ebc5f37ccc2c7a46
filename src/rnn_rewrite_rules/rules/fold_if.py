"""Replace an ``If`` whose condition the shape prover decides by the branch that runs.

Pattern: an ``If`` node, as exporters wrap rank and size checks around an RNN (torch's
unbatched-input support), for example
``If(Not(Equal(Size(Shape(x)), 2)), Identity(x), Unsqueeze(x, 1))`` before the RNN and
``If(Equal(Gather(Shape(Y_h), 0), 1), Squeeze(Y_h, 0), Identity(Y_h))`` after it.

Condition: the shape prover (``rnn_rewrite_rules.shape``) proves the condition is one
constant at every size (from graph-input ranks, static sizes and attributes, such as
an input's declared rank or an RNN's number of directions); the branch that runs has no
initializers and no nested subgraphs, and computes each of its outputs (as ONNX
requires). A condition that depends on a runtime size or value (the batch, a data
tensor) is left alone.

Replacement: the nodes of the branch that runs, inlined with their names; a branch
that only forwards an outer value (``Identity(x)``) becomes that value (an ``Identity``
when either is a graph input, output or initializer: the rewriter renames the
replacement). A value the branch returns for more than one output is copied by an
``Identity`` for each further output, so that every output keeps its name. The
condition's ``Shape``/``Size``/``Equal`` chain then dies.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRule, RewriteRuleClassBase

from rnn_rewrite_rules._compat import emit_node
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._forms import FormRule
from rnn_rewrite_rules.rules._rnn_node import keep_identity
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["FAMILY", "FoldProvenIf", "condition_reason", "make_rules"]

_MAX_OUTPUTS = 8


def condition_reason(node: ir.Node, prover: ShapeProver) -> bool | Refusal:
    """The proven value of ``node``'s condition, or why it is not proven."""
    cond = node.inputs[0] if node.inputs else None
    taken = prover.ints(cond)
    if taken is None or len(taken) != 1:
        return Refusal("the If condition is not provable from the graph (a runtime value or size)")
    return bool(taken[0])


class FoldProvenIf(RewriteRuleClassBase):
    """If(proven cond, then, else) -> the nodes of the branch that runs."""

    def __init__(self, num_outputs: int) -> None:
        super().__init__(name=f"FoldProvenIf[{num_outputs}]")
        self.num_outputs = num_outputs

    def pattern(self, op, cond):
        return op.If(
            cond,
            _allow_other_attributes=True,
            _outputs=[f"out{i}" for i in range(self.num_outputs)],
        )

    def check(self, context: MatchContext, cond: ir.Value, out0: ir.Value, **_: Any) -> MatchResult:
        check_result = MatchResult()
        node = out0.producer()
        assert node is not None
        if len(node.outputs) != self.num_outputs:
            return check_result.fail(f"If has {len(node.outputs)} outputs", node)
        taken = condition_reason(node, ShapeProver(context.model.graph))
        if isinstance(taken, Refusal):
            return check_result.fail(taken, cond)
        attr = node.attributes.get("then_branch" if taken else "else_branch")
        if attr is None:
            return check_result.fail("the If has no such branch", node)
        branch = attr.as_graph()
        if branch.initializers:
            return check_result.fail("the branch that runs has initializers", node)
        for inner in branch:
            if any(
                a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                for a in inner.attributes.values()
            ):
                return check_result.fail("the branch that runs has a nested subgraph", inner)
        if len(branch.outputs) != len(node.outputs):
            return check_result.fail("the branch's outputs do not match the If's", node)
        for value in branch.outputs:
            producer = value.producer()
            if producer is None or producer.graph is not branch:
                reason = f"the branch's output {value.name!r} is not computed in it (invalid ONNX)"
                return check_result.fail(reason, node)
        self._node = node
        self._branch = branch
        return check_result

    def rewrite(self, op, cond: ir.Value, **_):
        node, branch = self._node, self._branch
        mapped: dict[ir.Value, ir.Value] = {}
        for inner in branch:
            inputs = [None if v is None else mapped.get(v, v) for v in inner.inputs]
            outs = emit_node(
                op,
                inner.op_type,
                inputs,
                inner.attributes,
                domain=inner.domain,
                num_outputs=len(inner.outputs),
            )
            keep_identity(outs[0].producer(), inner)
            mapped.update(zip(inner.outputs, outs, strict=True))
        results = []
        for old, value in zip(node.outputs, branch.outputs, strict=True):
            new = mapped[value]  # the check proved each output computed in the branch
            forward = new.producer()
            if forward is not None and forward.domain == "" and forward.op_type == "Identity":
                source = forward.inputs[0]  # the branch only forwards this value
                # the rewriter gives the replacement the old name: not for a graph's own values
                if source is not None and not (
                    old.is_graph_output()
                    or source.is_graph_input()
                    or source.is_graph_output()
                    or source.is_initializer()
                ):
                    new = source
            if new in results:  # one value for two outputs: each output keeps its own value
                new = op.Identity(new)
            results.append(new)
        return results if len(results) > 1 else results[0]


def make_rules() -> list[RewriteRule]:
    """One rule, ``FoldProvenIf``, for an ``If`` of up to 8 outputs."""
    return [FormRule("FoldProvenIf", [FoldProvenIf.rule(n) for n in range(1, _MAX_OUTPUTS + 1)])]


FAMILY = RuleFamily(
    name="fold_if",
    description=(__doc__ or "").partition("\n")[0],
    make_rules=make_rules,
    install_by_default=True,
    fixes=("runtime-rank-check",),
)
