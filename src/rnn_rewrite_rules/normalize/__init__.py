"""Normalisation passes: one spelling of what exporters write many ways, before any rule.

:func:`rnn_rewrite_rules.rewrite` and ``rnn-rewrite`` run them, in this order, before the
rule families (``_api.apply_rounds``); users of ``install()`` run :func:`normalize` on the
model first. Each is an onnx-ir pass, one module each, as in ``onnx_ir.passes.common``;
each module's docstring gives the pattern, the condition, the replacement and why the
outputs are equal.
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules.normalize.gemm import GemmPass
from rnn_rewrite_rules.normalize.identity import IdentityPass
from rnn_rewrite_rules.normalize.no_op_cast import NoOpCastPass

__all__ = ["GemmPass", "IdentityPass", "NoOpCastPass", "normalization_passes", "normalize"]


def normalization_passes() -> list[ir.passes.InPlacePass]:
    """The passes in the order they run (fresh objects: each keeps its refusals)."""
    return [NoOpCastPass(), IdentityPass(), GemmPass()]


def normalize(model: ir.Model) -> bool:
    """Run :func:`normalization_passes` on ``model`` in place; True when one changed it."""
    modified = False
    for normalization in normalization_passes():
        modified |= normalization(model).modified
    return modified
