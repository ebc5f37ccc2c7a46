"""Why rules did not fire: the reasons their checks gave, for near-miss tests to assert."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir
from onnxscript.rewriter import MatchingTracer, MatchStatus, RewriteRule, RewriteRuleSet


def refusal_reasons(rules: Sequence[RewriteRule], model: onnx.ModelProto) -> list[str]:
    """Every reason a condition failed while applying ``rules`` once to a copy of ``model``.

    Each refusal must also name the nodes or values it concerns: onnxscript's tracer shows
    them next to the reason (``Failure at or around nodes/values``), so a refusal without
    them is a diagnostic lost.
    """
    tracer = MatchingTracer()
    RewriteRuleSet(list(rules)).apply_to_model(ir.serde.deserialize_model(model), tracer=tracer)
    refusals = [
        match.match_result
        for matches in tracer.best_matches_map.values()
        for match in matches
        if match.status == MatchStatus.CONDITION_FAILED
    ]
    unplaced = [str(r.reason) for r in refusals if not r.failure_nodes_and_values]
    assert not unplaced, f"refusals that name no node or value: {unplaced}"
    return [str(r.reason) for r in refusals]
