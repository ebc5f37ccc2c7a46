"""Two guarded recurrences concatenated: one ``If`` around both, the ``Concat`` inside.

Pattern: ``Concat(a, b)`` where ``a`` and ``b`` are outputs (through ``Identity``) of two
``If`` nodes on one condition, as ``loop_scan`` writes a forward and a backward Loop over
``X``'s length (``If(Size(X) == 0)``: the Loop's outputs where ``X`` is empty, else the
node's).

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

import dataclasses

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
    node = source.producer()
    index = source.index()
    if node is None or index is None or node.domain != "" or node.op_type != "If":
        return None
    return node, index


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


@dataclasses.dataclass(frozen=True)
class _Merge:
    """What :meth:`MergeGuards.check` proved: the two ``If``s, which output of each the
    ``Concat`` reads, and its axis."""

    first: ir.Node
    i: int
    second: ir.Node
    j: int
    axis: int
    model: ir.Model


class MergeGuards(RewriteRuleClassBase):
    """Concat(If(c, t1, e1), If(c, t2, e2)) -> If(c, Concat(t1, t2), Concat(e1, e2)).

    Not a two-``If`` pattern: the guards' output counts vary with the Loop they replaced,
    the ``Concat`` may read any of them, and through a chain of ``Identity``s of any length;
    an onnxscript pattern fixes all three (one rule per count and index)."""

    def pattern(self, op, a, b):
        return op.Concat(a, b, _allow_other_attributes=True)

    # onnxscript passes (context, **bindings); its base class declares (op, *args, **kwargs)
    def check(self, context, a: ir.Value, b: ir.Value, **_) -> MatchResult:
        check_result = MatchResult()
        first_found, second_found = _guard_output(a), _guard_output(b)
        if first_found is None or second_found is None:
            return check_result.fail(NOT_GUARDS, context.root)
        (first, i), (second, j) = first_found, second_found
        if first is second:
            return check_result.fail("both values come from one If", context.root)
        if first.graph is not context.graph_or_function or second.graph is not first.graph:
            reason = "a guard is in another graph than the Concat (it would move into it)"
            return check_result.fail(reason, context.root)
        if not same_value(first.inputs[0], second.inputs[0]):
            return check_result.fail("the two Ifs have different conditions", context.root)
        for node, index, value in ((first, i, a), (second, j, b)):
            refused = _reason(node, index, value)
            if refused is not None:
                return check_result.fail(refused, node)
        axis = context.root.attributes.get_int("axis", 0)
        self._merge = _Merge(first, i, second, j, axis, context.model)
        return check_result

    def rewrite(self, op, a: ir.Value, **_):
        merge = self._merge
        first, i, second, j, axis = merge.first, merge.i, merge.second, merge.j, merge.axis
        taken = taken_names(merge.model)
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
