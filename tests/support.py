"""Test helpers: equivalence in ONNX Runtime at several sizes, op counts, rule application."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence

import onnx
import onnx_ir as ir
from onnxscript.rewriter import RewriteRuleSet

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.testing import RnnConfig, random_inputs

#: (batch, seq) sizes, none of them equal to each other, so a frozen axis shows.
SIZES: tuple[tuple[int, int], ...] = ((1, 1), (3, 5), (7, 2))


def op_counts(model: onnx.ModelProto | ir.Model) -> collections.Counter[str]:
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    return collections.Counter(node.op_type for node in model.graph.node)


def apply(
    rules: RewriteRuleSet | Sequence, model: onnx.ModelProto, *, check: bool = True
) -> tuple[onnx.ModelProto, int]:
    """Apply a rule set once, remove dead nodes; return the new proto and the number of rewrites.

    ``check`` runs the full onnx checker on the result (off for deliberately invalid inputs).
    """
    ir_model = ir.serde.deserialize_model(model)
    rule_set = rules if isinstance(rules, RewriteRuleSet) else RewriteRuleSet(list(rules))
    count = rule_set.apply_to_model(ir_model)
    ir.passes.common.RemoveUnusedNodesPass()(ir_model)
    result = ir.serde.serialize_model(ir_model)
    if check:
        onnx.checker.check_model(result, full_check=True)
    return result, count


def assert_equivalent(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    cfg: RnnConfig,
    sizes: Iterable[tuple[int, int]] = SIZES,
    *,
    atol: float = 1e-5,
    optimize: bool = True,
) -> None:
    """Same outputs (and shapes) in ORT at every (batch, seq) size."""
    for seed, (batch, seq) in enumerate(sizes):
        feeds = random_inputs(cfg, batch, seq, rng=seed)
        expected = runtime.run(before, feeds, optimize=optimize)
        actual = runtime.run(after, feeds, optimize=optimize)
        diff = runtime.max_abs_diff(expected, actual)
        assert diff <= atol, f"batch={batch} seq={seq}: max abs diff {diff}"
