"""Re-roll unrolled ``nn.RNN`` recurrences into one ONNX ``RNN`` node per layer and direction.

* :mod:`.rnn`: the ``nn.RNN`` chain (torch dynamo form) -> ``RNN``.
* :mod:`.cells`: Python loops over ``nn.LSTMCell`` / ``nn.GRUCell`` -> ``LSTM`` / ``GRU``.
* :mod:`.seq1_chain`: a chain of one-step ``GRU``/``RNN``/``LSTM`` nodes (a layer called
  once per step) -> one node over the steps.
* :mod:`._chain`: what both share (the walk back along a chain, the check's tail, the
  rewrite's emission).
"""

from __future__ import annotations

from onnxscript.rewriter import RewriteRule

from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules.reroll.cells import RerollCell, plan_cell_chain
from rnn_rewrite_rules.rules.reroll.rnn import ACTIVATIONS, RerollRnn, plan_chain
from rnn_rewrite_rules.rules.reroll.seq1_chain import MergeSeq1Chain, plan_seq1_chain
from rnn_rewrite_rules.rules.reroll.seq1_chain import make_rules as seq1_chain_rules

__all__ = [
    "FAMILY",
    "MergeSeq1Chain",
    "RerollCell",
    "RerollRnn",
    "make_rules",
    "plan_cell_chain",
    "plan_chain",
    "plan_seq1_chain",
]


def make_rules(target: str = "portable") -> list[RewriteRule]:
    """The rules for ``target``: each declines where the measured cost table says its
    node is slower there (``rnn_rewrite_rules.costs``); ``portable`` never emits ``RNN``."""
    return (
        [RerollRnn.rule(activation, target) for activation in ACTIVATIONS]
        + [RerollCell.rule(op_type, target) for op_type in ("LSTM", "GRU")]
        + seq1_chain_rules(target)
    )


FAMILY = RuleFamily.measured("reroll", __doc__, make_rules)
