"""Is the bidirectional merge no slower than the two halves it replaces? (issue 32)

    python -m benchmarks.merge_costs                 # the grid -> docs/merge_costs.md
    python -m benchmarks.merge_costs --quick --out /tmp/m.md   # a smoke run

``bidirectional``'s ``MergeHandBuiltBidirectional`` turns a forward node and one on the
time-reversed input (``rnn_rewrite_rules.testing.thirdparty.hand_built_bidirectional``)
into one ``direction="bidirectional"`` node: other kernels run. For every op, hidden size
(input size the same) and sequence length at batch 1, ``benchmarks.rewrite_costs`` times
the original and the merged model side by side per runtime. The rule is not gated by this
table: every cell of it is read as a check that the merge is no slower anywhere on the
grid.
"""

from __future__ import annotations

import functools

import onnx

import rnn_rewrite_rules
from benchmarks import rewrite_costs
from benchmarks.rewrite_costs import Point, render
from rnn_rewrite_rules.testing import thirdparty

__all__ = ["CASE", "Point", "main", "render"]


@functools.cache
def _build(op: str, hidden: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    before = thirdparty.hand_built_bidirectional(op, input_size=hidden, hidden=hidden)
    after = rnn_rewrite_rules.rewrite(before, ["bidirectional"])
    merged = [n for n in after.graph.node if n.op_type == op]
    assert len(merged) == 1, f"{op} {hidden}: not merged"
    return before, after


CASE = rewrite_costs.Case(
    module="merge_costs",
    title="The bidirectional merge: measured against the halves it replaces",
    description=(
        "Ratio merged / original (a forward node and one on the reversed input,\n"
        "input size = hidden)."
    ),
    out=rewrite_costs.ROOT / "docs" / "merge_costs.md",
    build=lambda op, hidden, _seq: _build(op, hidden),  # the nodes read any length
    feeds=lambda before, seq, batch: thirdparty.thirdparty_inputs(before, batch, seq),
    ops=("LSTM", "GRU", "RNN"),
    seqs=(1, 16, 128),
)


def main(argv: list[str] | None = None) -> int:
    return rewrite_costs.main(CASE, argv)


if __name__ == "__main__":
    raise SystemExit(main())
