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

from benchmarks import rewrite_costs

__all__ = ["CASE", "main"]


CASE = rewrite_costs.cell_loop_case(
    "batch_first_costs",
    "Re-rolled batch-first cell loops",
    (
        "Ratio re-rolled (Transpose, one node, Transpose) / original (the unrolled cell\n"
        "steps over `x[:, t]`), input size = hidden."
    ),
    batch_first=True,
    form="batch_first",
)


def main(argv: list[str] | None = None) -> int:
    return rewrite_costs.main(CASE, argv)


if __name__ == "__main__":
    raise SystemExit(main())
