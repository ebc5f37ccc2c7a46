"""Apply the rules to a model with the cleanups that make their effect visible."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import RewriteRuleSet

from rnn_rewrite_rules._compat import check_onnxscript
from rnn_rewrite_rules.passes import (
    EmptyUnusedRnnOutputsPass,
    InitializerInfoFromTensorPass,
    RemoveUnusedSubgraphInitializersPass,
    UniqueRewrittenNodeNamesPass,
)
from rnn_rewrite_rules.rules import select_rules

__all__ = ["rewrite", "rules"]

_Model = TypeVar("_Model", onnx.ModelProto, ir.Model)
_MAX_ROUNDS = 4


def rules(names: Sequence[str] | None = None, *, portable: bool = False) -> RewriteRuleSet:
    """Our rules as a set for ``onnxscript.rewriter.rewrite(model, pattern_rewrite_rules=...)``.

    Args:
        names: family or rule names (see ``rnn-rewrite --list-rules``); all by default.
        portable: leave out what runtimes other than ONNX Runtime reject (tract 0.23.9
            panics on RNNs without ``initial_h`` when the batch is symbolic).
    """
    return RewriteRuleSet(select_rules(names, portable=portable))


def rewrite(model: _Model, names: Sequence[str] | None = None, *, portable: bool = False) -> _Model:
    """Rewrite ``model`` until no rule fires, then drop what became unused.

    Returns the same kind of object it was given; an ``ir.Model`` is changed in place.

    Raises:
        rnn_rewrite_rules._compat.UnsupportedVersionError: onnxscript is outside the
            tested range (a ``RuntimeError``); the model is not touched.
    """
    check_onnxscript()
    if isinstance(model, onnx.ModelProto):
        ir_model = ir.serde.deserialize_model(model)
        fired = _rewrite(ir_model, names, portable=portable)
        result = ir.serde.serialize_model(ir_model)
        if not fired:
            untouched = ir.serde.deserialize_model(model)
            InitializerInfoFromTensorPass()(untouched)
            if ir.serde.serialize_model(untouched) == result:
                result = onnx.ModelProto()
                result.CopyFrom(model)  # nothing changed: byte for byte the model given
        return result
    _rewrite(model, names, portable=portable)
    return model


def _rewrite(model: ir.Model, names: Sequence[str] | None, *, portable: bool) -> bool:
    """Rewrite ``model`` in place and clean up; True when a rule fired."""
    rule_set = rules(names, portable=portable)
    fired = False
    for _ in range(_MAX_ROUNDS):
        if not rule_set.apply_to_model(model):
            break
        fired = True
    cleanup(model)
    return fired


def cleanup(model: ir.Model) -> None:
    """The passes :func:`rewrite` runs after the rules (the CLI runs them too)."""
    ir.passes.PassManager(
        [
            common_passes.RemoveUnusedNodesPass(),
            RemoveUnusedSubgraphInitializersPass(),  # the main graph's go in the pass above
            common_passes.RemoveUnusedFunctionsPass(),
            common_passes.RemoveUnusedOpsetsPass(),
            # after every NameFixPass: unused RNN outputs named "" (see unused_outputs)
            EmptyUnusedRnnOutputsPass(),
            InitializerInfoFromTensorPass(),
            UniqueRewrittenNodeNamesPass(),
        ]
    )(model)
