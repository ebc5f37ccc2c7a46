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

import argparse
import dataclasses

import numpy as np
import onnx

import rnn_rewrite_rules
from benchmarks import rewrite_costs

__all__ = ["CASE", "main"]


def merged(op: str, hidden: int, steps: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The chain of ``steps`` one-step nodes (input size = hidden, ``h0`` an input) and its
    merged form, the cost table ignored (the grid measures the form the table is read for)."""
    from rnn_rewrite_rules import costs
    from rnn_rewrite_rules.testing.seq1_chain import Seq1ChainConfig, build_seq1_chain

    config = Seq1ChainConfig(
        op_type=op,  # type: ignore[arg-type]  # one of the Case's ops
        input_size=hidden,
        hidden_size=hidden,
        steps=steps,
    )
    before = build_seq1_chain(config)
    after = rnn_rewrite_rules.rewrite(before, context=costs.Context(ignore=True))
    nodes = [n for n in after.graph.node if n.op_type == op]
    assert len(nodes) == 1, f"{config}: not merged"
    return before, after


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
)


def median_of_runs(runs: list[list[rewrite_costs.Point]]) -> list[rewrite_costs.Point]:
    """Each point of independent runs of the grid as their median ratio, its spread the
    runs' ratios (a shared machine slows a whole run now and then: one run is not a
    measurement)."""
    merged = []
    for same in zip(*runs, strict=True):
        ratios = sorted(p.ratio for p in same)
        middle = ratios[len(ratios) // 2]
        median = middle if len(ratios) % 2 else (ratios[len(ratios) // 2 - 1] + middle) / 2
        first = same[0]
        merged.append(dataclasses.replace(first, ratio=median, low=ratios[0], high=ratios[-1]))
    return merged


def main(argv: list[str] | None = None) -> int:
    """``rewrite_costs.main`` over ``--runs`` independent runs of the grid (default 3),
    each point their median; the table keeps every run's ratio (``ratios``)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--runs", type=int, default=3)
    known, rest = parser.parse_known_args(argv)
    if known.runs == 1 or "--quick" in rest:
        return rewrite_costs.main(CASE, rest)
    runs: list[list[rewrite_costs.Point]] = []
    measure = rewrite_costs.measure_grid

    def measured(*args, **kwargs) -> list[rewrite_costs.Point]:
        for _ in range(known.runs):
            runs.append(measure(*args, **kwargs))
        return median_of_runs(runs)

    table = rewrite_costs.table

    def with_runs(case, points, header) -> dict:
        data = table(case, points, header)
        data["methods"] = {
            "builder": f"median of {known.runs} independent runs of the grid, each: one "
            "thread; repeats x rounds interleaved, best of each; ratio = best(rewritten) / "
            "best(original); ratios = each run's"
        }
        for index, row in enumerate(data["points"]):
            row["ratios"] = [round(run[index].ratio, 4) for run in runs]
        return data

    rewrite_costs.measure_grid, rewrite_costs.table = measured, with_runs
    try:
        return rewrite_costs.main(CASE, rest)
    finally:
        rewrite_costs.measure_grid, rewrite_costs.table = measure, table


if __name__ == "__main__":
    raise SystemExit(main())
