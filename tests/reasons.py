"""Why rules did not fire: the reasons their checks gave, for near-miss tests to assert."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
import onnx_ir as ir
from onnxscript.rewriter import MatchingTracer, MatchStatus, RewriteRule, RewriteRuleSet


def refusal_reasons(rules: Sequence[RewriteRule], model: onnx.ModelProto) -> list[str]:
    """Every reason a condition failed while applying ``rules`` once to a copy of ``model``."""
    tracer = MatchingTracer()
    RewriteRuleSet(list(rules)).apply_to_model(ir.serde.deserialize_model(model), tracer=tracer)
    return [
        str(match.match_result.reason)
        for matches in tracer.best_matches_map.values()
        for match in matches
        if match.status == MatchStatus.CONDITION_FAILED
    ]
