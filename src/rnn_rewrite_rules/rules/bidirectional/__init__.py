"""Merge a bidirectional layer built by hand from forward RNNs into one ONNX RNN node.

* :mod:`.hand_built`: a forward RNN and one on the time-reversed input (or a reverse one).
* :mod:`.states`: a forward/reverse pair whose ``Y`` or states are concatenated.
* :mod:`._pair`: what both prove of a pair and how the merged node is emitted.
"""

from __future__ import annotations

from onnxscript.rewriter import RewriteRule

from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules.bidirectional.hand_built import (
    MergeHandBuiltBidirectional,
    MergeHandBuiltReverse,
    is_reversal,
)
from rnn_rewrite_rules.rules.bidirectional.states import state_rules

__all__ = [
    "FAMILY",
    "MergeHandBuiltBidirectional",
    "MergeHandBuiltReverse",
    "is_reversal",
    "make_rules",
]


def make_rules(target: str = "portable") -> list[RewriteRule]:
    return [
        MergeHandBuiltBidirectional.rule(),
        MergeHandBuiltReverse.rule(target),
        *state_rules(),
    ]


FAMILY = RuleFamily(
    name="bidirectional",
    description=(__doc__ or "").partition("\n")[0],
    make_rules=make_rules,
    install_by_default=True,
    target_rules={"onnxruntime": lambda: make_rules("onnxruntime")},
    fixes=("hand-built-direction",),
)
