"""rten (the Rust runtime) is a runtime users run: the default rewrite converts with
``rten-convert`` wherever the original does (rten has no ``RNN`` op)."""

from __future__ import annotations

import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import costs
from rnn_rewrite_rules.testing import rten
from rnn_rewrite_rules.testing.unrolled import (
    UnrolledCellConfig,
    UnrolledRnnConfig,
    build_unrolled_cell,
    build_unrolled_rnn,
)
from tests.support import running_nodes

pytest.importorskip("rten_convert", reason="rten-convert (part of the test extra) is not installed")
from tests.test_portability import CASES


def test_the_converter_names_what_rten_lacks() -> None:
    unrolled = build_unrolled_rnn(UnrolledRnnConfig(hidden_size=8, seq=4, num_layers=2))
    assert rten.convert(unrolled).ok
    # what target onnxruntime emits, wherever the cost table lets it
    ignored = costs.Context(ignore=True)
    rolled = rnn_rewrite_rules.rewrite(unrolled, target="onnxruntime", context=ignored)
    assert any(n.op_type == "RNN" for n in rolled.graph.node)
    verdict = rten.convert(rolled)
    assert not verdict.ok and verdict.unsupported == {"RNN"}
    assert verdict.summary == "unsupported: RNN"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_default_rewrite_converts_where_the_original_converts(case) -> None:
    original = case.build()
    if not rten.convert(original).ok:
        pytest.skip("rten-convert refuses the original: nothing to keep")
    verdict = rten.convert(rnn_rewrite_rules.rewrite(original))
    assert verdict.ok, verdict.errors


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_portable_re_rolls_cell_loops_into_what_rten_converts(op: str) -> None:
    model = build_unrolled_cell(UnrolledCellConfig(op_type=op, hidden_size=8, seq=4))
    # what is emitted, wherever the cost table lets it fire
    rolled = rnn_rewrite_rules.rewrite(model, context=costs.Context(ignore=True))
    assert [n.op_type for n in running_nodes(rolled) if n.op_type == op] == [op]
    assert rten.convert(rolled).ok
