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

from benchmarks import rewrite_costs

__all__ = ["CASE", "main"]


CASE = rewrite_costs.cell_loop_case(
    "broadcast_costs",
    "Re-rolled cell loops seeded by states of their own batch",
    (
        "Ratio re-rolled (one node, X and the states expanded to their broadcast batch) /\n"
        "original (the unrolled cell steps), input size = hidden, the states of X's batch."
    ),
    initial_state="inputs",
)


def main(argv: list[str] | None = None) -> int:
    return rewrite_costs.main(CASE, argv)


if __name__ == "__main__":
    raise SystemExit(main())
