"""Is a batch-first cell loop no slower re-rolled? (issue 32)

    python -m benchmarks.batch_first_costs           # the grid -> docs/batch_first_costs.md
    python -m benchmarks.batch_first_costs --quick --out /tmp/f.md   # a smoke run

``reroll``'s ``RerollCell`` turns an unrolled ``LSTMCell``/``GRUCell`` loop over
``x[:, t]`` of a batch-first ``x`` stacked by ``torch.stack(hs, 1)``
(``rnn_rewrite_rules.testing.unrolled.UnrolledCellConfig(batch_first=True)``) into one node
between two ``Transpose``s (``X`` to ``[T, batch, I]``, ``Y`` back to ``[batch, T, H]``).
This grid times the form with its Transposes side by side with the unrolled steps it
replaces, per runtime (``benchmarks.rewrite_costs``), and writes
``rnn_rewrite_rules/costs/batch_first.json``: the rule fires on a batch-first loop only
where both the node's measured table and this one say it is no slower.
"""

from __future__ import annotations

import numpy as np
import onnx

import rnn_rewrite_rules
from benchmarks import rewrite_costs
from rnn_rewrite_rules import costs
from rnn_rewrite_rules.testing.unrolled import UnrolledCellConfig, build_unrolled_cell

__all__ = ["CASE", "main"]


def _build(op: str, hidden: int, seq: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    config = UnrolledCellConfig(
        op_type=op,  # type: ignore[arg-type]
        input_size=hidden,
        hidden_size=hidden,
        seq=seq,
        batch_first=True,
    )
    before = build_unrolled_cell(config)
    with costs.ignored():  # the grid measures the form the cost table is read for
        after = rnn_rewrite_rules.rewrite(before)
    nodes = [n for n in after.graph.node if n.op_type == op]
    assert len(nodes) == 1, f"{op} {hidden} {seq}: not re-rolled"
    return before, after


def _feeds(model: onnx.ModelProto, seq: int, batch: int) -> dict[str, np.ndarray]:
    (x,) = model.graph.input
    size = x.type.tensor_type.shape.dim[2].dim_value
    return {"x": np.random.default_rng(0).standard_normal((batch, seq, size)).astype(np.float32)}


CASE = rewrite_costs.Case(
    module="batch_first_costs",
    title="Re-rolled batch-first cell loops",
    description=(
        "Ratio re-rolled (Transpose, one node, Transpose) / original (the unrolled cell\n"
        "steps over `x[:, t]`), input size = hidden."
    ),
    out=rewrite_costs.ROOT / "docs" / "batch_first_costs.md",
    build=_build,
    feeds=_feeds,
    ops=("LSTM", "GRU"),
    seqs=(2, 4, 16),
    batches=(1, 8),
    form="batch_first",
)


def main(argv: list[str] | None = None) -> int:
    return rewrite_costs.main(CASE, argv)


if __name__ == "__main__":
    raise SystemExit(main())
