"""Is a chain of one-step nodes no slower merged into one node? (issue 40)

    python -m benchmarks.seq1_chain_costs           # 3 runs of the grid, each point their
                                                    # median -> docs/seq1_chain_costs.md
    python -m benchmarks.seq1_chain_costs --quick --out /tmp/f.md   # a smoke run

``reroll``'s ``MergeSeq1Chain`` turns a layer called once per step (a chain of one-step
``GRU``/``RNN``/``LSTM`` nodes, each step's ``x[:, t:t+1]`` ``Transpose``d in and its ``Y``
``Squeeze``d and ``Transpose``d out, as torch exports a seq2seq encoder:
``rnn_rewrite_rules.testing.seq1_chain``) into one node over ``x[:, :T]`` between two
``Transpose``s. This grid times the merged form side by side with the chain, per runtime
(``benchmarks.rewrite_costs``), and writes ``rnn_rewrite_rules/costs/seq1_chain.json``: the
rule fires only where this table says the merged node is no slower.
"""

from __future__ import annotations

import numpy as np
import onnx

from benchmarks import rewrite_costs

__all__ = ["CASE", "main"]


def merged(op: str, hidden: int, steps: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The chain of ``steps`` one-step nodes (input size = hidden, ``h0`` an input) and its
    merged form (``rewrite_costs.into_one``)."""
    from rnn_rewrite_rules.testing.seq1_chain import Seq1ChainConfig, build_seq1_chain

    config = Seq1ChainConfig(
        op_type=op,  # type: ignore[arg-type]  # one of the Case's ops
        input_size=hidden,
        hidden_size=hidden,
        steps=steps,
    )
    return rewrite_costs.into_one(build_seq1_chain(config), op, f"{config}: not merged")


def feeds(model: onnx.ModelProto, steps: int, batch: int) -> dict[str, np.ndarray]:
    from rnn_rewrite_rules.testing.seq1_chain import seq1_chain_feeds

    return seq1_chain_feeds(model, batch, steps)


CASE = rewrite_costs.Case(
    module="seq1_chain_costs",
    title="Chains of one-step nodes merged",
    description=(
        "Ratio merged (Slice, Transpose, one node over the steps, Squeeze, Transpose) /\n"
        "original (one node per step, each with its Slice, Transposes and Squeeze, the\n"
        "steps' outputs concatenated), input size = hidden, `seq` = the number of steps.\n"
        "Each cell is the median of 3 independent runs of the grid, the runs' range in\n"
        "brackets (not the per-repeat spread the next line names)."
    ),
    out=rewrite_costs.ROOT / "docs" / "seq1_chain_costs.md",
    build=merged,
    feeds=feeds,
    ops=("GRU", "LSTM", "RNN"),
    seqs=(2, 4, 16),
    batches=(1, 8),
    hiddens=(8, 64, 256),
    form="seq1_chain",
    runs=3,
)


def main(argv: list[str] | None = None) -> int:
    """``rewrite_costs.main`` over ``--runs`` independent runs of the grid (default 3),
    each point their median; the table keeps every run's ratio (``ratios``)."""
    return rewrite_costs.main(CASE, argv)


if __name__ == "__main__":
    raise SystemExit(main())
