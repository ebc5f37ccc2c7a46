"""Two guarded recurrences concatenated: one ``If`` around both, the ``Concat`` inside.

Pattern: ``Concat(a, b)`` where ``a`` and ``b`` are outputs (through ``Identity``) of two
``If`` nodes on one condition, as ``loop_scan`` writes a forward and a backward Loop over
``X``'s length (``If(len(X) == 0)``: the Loop's outputs after no step, else the node's).

Condition: the two conditions are one value or one computation written twice
(``rules._graph.same_value``); both ``If``s are in the ``Concat``'s graph; each ``If``'s
other outputs are unread, the concatenated one
is read only by the ``Concat`` (through its ``Identity``), and neither branch holds
initializers (a branch's constants are ``Constant`` nodes).

Replacement: one ``If`` on that condition whose branches hold both ``If``'s branch nodes
and the ``Concat`` of their outputs: ``Concat(If(c, t1, e1), If(c, t2, e2)) = If(c,
Concat(t1, t2), Concat(e1, e2))``. The forward and the reverse node then share a graph,
where ``bidirectional`` merges them into one node (the rewriter visits subgraphs).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from rnn_rewrite_rules._refusal import Inapplicable
from rnn_rewrite_rules.rules._graph import free_name, same_value, taken_names
from rnn_rewrite_rules.rules.cell import through_identity

__all__ = ["NOT_GUARDS", "MergeGuards"]

_BRANCHES = ("then_branch", "else_branch")
#: The refusal on a Concat of anything else (every Concat is tried): says nothing about a
#: recurrence, so reports leave it out.
NOT_GUARDS = Inapplicable("a concatenated value is not an If's output")


def _guard_output(value: ir.Value) -> tuple[ir.Node, int] | None:
    """The ``If`` whose output ``value`` is (through ``Identity``s), and its index."""
    source = through_identity(value)
    node = None if source is None else source.producer()
    if node is None or node.domain != "" or node.op_type != "If":
        return None
    return node, source.index()  # type: ignore[union-attr]


def _reason(node: ir.Node, index: int, value: ir.Value) -> str | None:
    """Why ``node``'s output ``index`` (read as ``value`` by the Concat) cannot move into
    the fused ``If`` (None: it can)."""
    for i, output in enumerate(node.outputs):
        if i != index and (output.uses() or output.is_graph_output()):
            return "another output of a guard is read"
    current = node.outputs[index]
    while current is not value:  # the Identity chain to the Concat: read only along it
        uses = current.uses()
        if len(uses) != 1 or current.is_graph_output():
            return "a concatenated guard output has another reader"
        ((user, _),) = uses
        current = user.outputs[0]
    if len(value.uses()) != 1 or value.is_graph_output():
        return "a concatenated guard output has another reader"
    for name in _BRANCHES:
        attr = node.attributes.get(name)
        if attr is None or attr.type != ir.AttributeType.GRAPH:
            return "an If without both branches"
        if attr.as_graph().initializers:
            return "a guard's branch holds initializers"
    return None


class MergeGuards(RewriteRuleClassBase):
    """Concat(If(c, t1, e1), If(c, t2, e2)) -> If(c, Concat(t1, t2), Concat(e1, e2))."""

    def pattern(self, op, a, b):
        return op.Concat(a, b, _allow_other_attributes=True)

    def check(self, context, a: ir.Value, b: ir.Value, **_) -> MatchResult:
        check_result = MatchResult()
        found = [_guard_output(v) for v in (a, b)]
        if found[0] is None or found[1] is None:
            return check_result.fail(NOT_GUARDS, context.root)
        (first, i), (second, j) = found
        if first is second:
            return check_result.fail("both values come from one If", context.root)
        if first.graph is not context.graph_or_function or second.graph is not first.graph:
            reason = "a guard is in another graph than the Concat (it would move into it)"
            return check_result.fail(reason, context.root)
        if not same_value(first.inputs[0], second.inputs[0]):
            return check_result.fail("the two Ifs have different conditions", context.root)
        for node, index, value in ((first, i, a), (second, j, b)):
            reason = _reason(node, index, value)
            if reason is not None:
                return check_result.fail(reason, node)
        self._plan = (first, i, second, j, context.root.attributes.get_int("axis", 0))
        self._model = context.model
        return check_result

    def rewrite(self, op, a: ir.Value, **_):
        first, i, second, j, axis = self._plan
        taken = taken_names(self._model)
        branches = {}
        for name in _BRANCHES:
            fused = first.attributes[name].as_graph().clone(allow_outer_scope_values=True)
            other = second.attributes[name].as_graph().clone(allow_outer_scope_values=True)
            left, right = fused.outputs[i], other.outputs[j]
            other.outputs.clear()  # the clone is dropped: its outputs are no graph's now
            nodes = list(other)
            other.remove(nodes)
            # sibling scopes may reuse a name: one of the other branch's is renamed
            inner = {v.name for node in fused for v in node.outputs if v.name}
            for node in nodes:
                for value in node.outputs:
                    if value.name is None or value.name in inner:
                        value.name = free_name(taken | inner, value.name or "guard")
                    inner.add(value.name)
            fused.extend(nodes)
            concat = ir.node("Concat", [left, right], attributes={"axis": axis})
            out = concat.outputs[0]
            out.name = free_name(taken, f"{fused.name or 'guard'}_concat")
            taken.add(out.name)
            out.type = left.type
            rank = None if left.shape is None else len(left.shape)
            out.shape = None if rank is None else ir.Shape([None] * rank)
            fused.append(concat)
            fused.outputs.clear()
            fused.outputs.append(out)
            branches[name] = fused
        return op.If(first.inputs[0], **branches)
