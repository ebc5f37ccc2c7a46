"""Why rules did not fire: the reasons their checks gave, for near-miss tests to assert."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir
from onnxscript.rewriter import MatchStatus, RewriteRule, RewriteRuleSet

from rnn_rewrite_rules import costs
from rnn_rewrite_rules._api import _RefusalTracer
from rnn_rewrite_rules.rules.loop_scan.guards import NOT_GUARDS


def refusal_reasons(
    rules: Sequence[RewriteRule], model: onnx.ModelProto, context: costs.Context | None = None
) -> list[str]:
    """Every reason a condition failed while applying ``rules`` once to a copy of ``model``.

    Every one, not only the best match per rule that onnxscript's ``MatchingTracer`` keeps:
    a refusal on one node is not hidden by the same rule firing on another.
    ``loop_scan``'s guard merge tries every Concat: its refusal of one that reads no guard
    (:data:`NOT_GUARDS`) is left out. Each refusal must also name the nodes or values it
    concerns: onnxscript's tracer shows
    them next to the reason (``Failure at or around nodes/values``), so a refusal without
    them is a diagnostic lost. ``context``: the cost tables the rules read (default: the
    checked-in ones).
    """
    tracer = _RefusalTracer()
    copy = ir.serde.deserialize_model(model)
    with costs.attached(copy, context or costs.Context()):
        RewriteRuleSet(list(rules)).apply_to_model(copy, tracer=tracer)
    refusals = [
        match for _, _, match, status in tracer.failures if status == MatchStatus.CONDITION_FAILED
    ]
    unplaced = [str(r.reason) for r in refusals if not r.failure_nodes_and_values]
    assert not unplaced, f"refusals that name no node or value: {unplaced}"
    return [str(r.reason) for r in refusals if str(r.reason) != NOT_GUARDS]
