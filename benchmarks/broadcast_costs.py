"""Is a cell loop seeded by states of their own batch no slower re-rolled? (issue 32)

    python -m benchmarks.broadcast_costs             # the grid -> docs/broadcast_costs.md
    python -m benchmarks.broadcast_costs --quick --out /tmp/b.md   # a smoke run

``reroll``'s ``RerollCell`` turns an unrolled ``LSTMCell``/``GRUCell`` loop whose ``h_0``
(``c_0``) is not proven of ``X``'s batch (an encoder's final state, graph inputs:
``rnn_rewrite_rules.testing.unrolled.UnrolledCellConfig(initial_state="inputs")``) into one
node reading ``X`` and the states expanded to the batch they broadcast to (``Expand``s and
their shapes, ``rules._broadcast``). The rule reads the measured cost table for an explicit
state (form ``zeros``); this grid times that form with its broadcast side by side with the
unrolled steps it replaces, per runtime (``benchmarks.rewrite_costs``), as a check that it
is no slower.
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
        initial_state="inputs",
    )
    before = build_unrolled_cell(config)
    with costs.ignored():  # the grid measures the form the cost table is read for
        after = rnn_rewrite_rules.rewrite(before)
    nodes = [n for n in after.graph.node if n.op_type == op]
    assert len(nodes) == 1, f"{op} {hidden} {seq}: not re-rolled"
    return before, after


def _feeds(model: onnx.ModelProto, seq: int, batch: int) -> dict[str, np.ndarray]:
    """``x [seq, batch, I]`` and states ``[batch, H]`` (the loop's own length is ``seq``)."""
    rng = np.random.default_rng(0)
    sizes = {"batch": batch, "state_batch": batch}
    feeds = {}
    for value in model.graph.input:
        dims = [
            d.dim_value if d.HasField("dim_value") else sizes[d.dim_param]
            for d in value.type.tensor_type.shape.dim
        ]
        assert value.name != "x" or dims[0] == seq
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


CASE = rewrite_costs.Case(
    module="broadcast_costs",
    title="Re-rolled cell loops seeded by states of their own batch",
    description=(
        "Ratio re-rolled (one node, X and the states expanded to their broadcast batch) /\n"
        "original (the unrolled cell steps), input size = hidden, the states of X's batch."
    ),
    out=rewrite_costs.ROOT / "docs" / "broadcast_costs.md",
    build=_build,
    feeds=_feeds,
    ops=("LSTM", "GRU"),
    seqs=(2, 4, 16),
    batches=(1, 8),
)


def main(argv: list[str] | None = None) -> int:
    return rewrite_costs.main(CASE, argv)


if __name__ == "__main__":
    raise SystemExit(main())
