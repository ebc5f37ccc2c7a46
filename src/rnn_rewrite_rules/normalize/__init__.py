"""Normalisation passes: one spelling of what exporters write many ways, before any rule.

:func:`rnn_rewrite_rules.rewrite` and ``rnn-rewrite`` run them, in this order, before the
rule families (``_api.apply_rounds``), and afterwards undo every edit no rule used
(:class:`Journal`): the model keeps the exporter's spelling wherever no rule rewrote it.
``install()`` adds rules to onnxscript's defaults and has no hook before them: its users,
and those of :func:`rnn_rewrite_rules.rules`, call :func:`normalize` on the ``ir.Model``
first (with a :class:`Journal` and ``journal.restore()`` after, to keep the spelling).
Each is an onnx-ir pass, one module each, as in ``onnx_ir.passes.common``, and a
``_node_pass.NodePass``: the visit of every node of its op is shared, the pass gives the edit;
each module's docstring gives the pattern, the condition, the replacement and why the
outputs are equal.
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules.normalize._journal import Journal
from rnn_rewrite_rules.normalize.gemm import GemmPass
from rnn_rewrite_rules.normalize.identity import IdentityPass
from rnn_rewrite_rules.normalize.loop_condition import LoopConditionPass
from rnn_rewrite_rules.normalize.loop_invariant import LoopInvariantPass
from rnn_rewrite_rules.normalize.loop_trip_count import LoopTripCountPass
from rnn_rewrite_rules.normalize.mul_by_ones import MulByOnesPass
from rnn_rewrite_rules.normalize.no_op_cast import NoOpCastPass
from rnn_rewrite_rules.normalize.no_op_slice import NoOpStateSlicePass
from rnn_rewrite_rules.normalize.sequence_scan import SequenceScanPass
from rnn_rewrite_rules.normalize.slice_bounds import ProvenSliceBoundsPass

__all__ = [
    "GemmPass",
    "IdentityPass",
    "Journal",
    "LoopConditionPass",
    "LoopInvariantPass",
    "LoopTripCountPass",
    "MulByOnesPass",
    "NoOpCastPass",
    "NoOpStateSlicePass",
    "ProvenSliceBoundsPass",
    "SequenceScanPass",
    "normalization_passes",
    "normalize",
]


def normalization_passes(journal: Journal | None = None) -> list[ir.passes.InPlacePass]:
    """The passes in the order they run (fresh objects: each keeps its refusals), each
    recording its edits in ``journal`` when given."""
    return [
        NoOpCastPass(journal),
        IdentityPass(journal),
        MulByOnesPass(journal),
        GemmPass(journal),
        SequenceScanPass(journal),
        LoopInvariantPass(journal),
        LoopTripCountPass(journal),
        LoopConditionPass(journal),
        ProvenSliceBoundsPass(journal),
        NoOpStateSlicePass(journal),
    ]


def normalize(model: ir.Model, journal: Journal | None = None) -> bool:
    """Run :func:`normalization_passes` on ``model`` in place; True when one changed it.

    ``journal``: records the edits; ``journal.restore()`` after the rules puts back the
    exporter's spelling wherever no rule used the normalised one (see
    :class:`Journal`)."""
    modified = False
    for normalization in normalization_passes(journal):
        modified |= normalization(model).modified
    return modified
