"""reroll fires only where the measured cost table says its node is no slower on the
target, says why when it declines, and ``portable`` never emits ``RNN`` (rten has none)."""

from __future__ import annotations

import numpy as np
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules.rules import reroll
from rnn_rewrite_rules.testing.unrolled import (
    UnrolledCellConfig,
    UnrolledRnnConfig,
    build_unrolled_cell,
    build_unrolled_rnn,
    cell_inputs,
    rnn_inputs,
)
from tests.reasons import refusal_reasons
from tests.support import op_counts, running_nodes

RUNTIMES = ("ort", "ort_noopt", "openvino")
#: Why portable keeps nn.RNN unrolled (rules._kernels: rten has no RNN op).
NO_RNN = "re-roll kept unrolled: rten has no RNN op (target 'portable')"


def _table(op: str, slow: dict[tuple[str, str, int], float]) -> costs.CostTable:
    """``op`` at hidden 8/64, seq 2/16, batch 1/5, both forms, every runtime: ratio 0.5
    except ``slow``'s, by (runtime, form, batch) at hidden 64 seq 16."""
    points = []
    for runtime_key in RUNTIMES:
        for form in costs.FORMS:
            for hidden in (8, 64):
                for seq in (2, 16):
                    for batch in (1, 5):
                        ratio = 0.5
                        if (hidden, seq) == (64, 16):
                            ratio = slow.get((runtime_key, form, batch), 0.5)
                        points.append(
                            costs.Point(
                                runtime_key,
                                op,
                                form,
                                "forward",
                                hidden,
                                seq,
                                batch,
                                ratio,
                                ratio,
                                ratio,
                            )
                        )
    return costs.CostTable(points, {})


def _ops(model, op_type: str) -> int:
    return op_counts(model)[op_type]


def test_portable_keeps_nn_rnn_unrolled_and_says_why() -> None:
    model = build_unrolled_rnn(UnrolledRnnConfig(hidden_size=8, seq=4, num_layers=2))
    ignored = costs.Context(ignore=True)  # not a cost decision: rten has no RNN op
    assert _ops(rnn_rewrite_rules.rewrite(model, context=ignored), "RNN") == 0
    rolled = rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=ignored)
    assert _ops(rolled, "RNN") == 2
    reasons = refusal_reasons(reroll.FAMILY.rules_for("portable"), model)
    assert NO_RNN in reasons


def test_onnxruntime_re_rolls_nn_rnn_only_where_the_table_says_no_slower() -> None:
    cfg = UnrolledRnnConfig(input_size=64, hidden_size=64, seq=16)
    model = build_unrolled_rnn(cfg)
    fast = _table("RNN", {})
    slow = _table("RNN", {("ort", "none", 5): 1.6})
    rolled = rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=costs.Context(fast))
    assert _ops(rolled, "RNN") == 1
    feeds = rnn_inputs(cfg, 3)
    np.testing.assert_allclose(
        runtime.run(rolled, feeds)[0], runtime.run(model, feeds)[0], atol=1e-5
    )
    context = costs.Context(slow)  # the batch is symbolic: batch 5's slowdown counts
    assert _ops(rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=context), "RNN") == 0
    reasons = refusal_reasons(reroll.FAMILY.rules_for("onnxruntime"), model, context)
    assert (
        "re-roll kept unrolled: hidden 64, seq 16, batch symbolic: ONNX Runtime's RNN kernel "
        "is slower at hidden 64, seq 16, batch 5 (1.60x [1.60-1.60]) (measured hidden 64, "
        "seq 16, batch 1/5)"
    ) in reasons


def test_a_static_batch_reads_its_own_corner() -> None:
    slow = _table("RNN", {("ort", "none", 5): 1.6})
    for batch, rolled in ((1, 1), (5, 0)):
        cfg = UnrolledRnnConfig(
            input_size=64, hidden_size=64, seq=16, batch=batch, initial_state="folded"
        )
        result = rnn_rewrite_rules.rewrite(
            build_unrolled_rnn(cfg), target="onnxruntime", context=costs.Context(slow)
        )
        assert _ops(result, "RNN") == rolled, batch


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_portable_weighs_the_zero_state_a_symbolic_batch_forces(op: str) -> None:
    """portable keeps an explicit zero state for a symbolic batch (tract needs it): the
    ``zeros`` form's points decide; target onnxruntime drops it: the ``none`` form's."""
    cfg = UnrolledCellConfig(op_type=op, input_size=64, hidden_size=64, seq=16)
    model = build_unrolled_cell(cfg)
    zeros_slow = _table(op, {("openvino", "zeros", 1): 1.3})
    context = costs.Context(zeros_slow)
    assert _ops(rnn_rewrite_rules.rewrite(model, context=context), op) == 0
    assert _ops(rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=context), op) == 1
    reasons = refusal_reasons(reroll.FAMILY.rules_for("portable"), model, context)
    assert (
        f"re-roll kept unrolled: hidden 64, seq 16, batch symbolic: OpenVINO's {op} kernel is "
        "slower at hidden 64, seq 16, batch 1 (1.30x [1.30-1.30])"
    ) in " ".join(reasons)
    rolled = rnn_rewrite_rules.rewrite(model, context=costs.Context(_table(op, {})))
    assert _ops(rolled, op) == 1
    (node,) = [n for n in running_nodes(rolled) if n.op_type == op]
    assert node.input[5]  # the shared explicit zero state
    feeds = cell_inputs(cfg, 3)
    np.testing.assert_allclose(
        runtime.run(rolled, feeds)[0], runtime.run(model, feeds)[0], atol=1e-5
    )


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_portable_drops_the_zero_state_of_a_static_batch(op: str) -> None:
    cfg = UnrolledCellConfig(op_type=op, input_size=64, hidden_size=64, seq=16, batch=3)
    model = build_unrolled_cell(cfg)
    zeros_slow = _table(op, {("ort", "zeros", 5): 1.3})  # never read: the state is dropped
    rolled = rnn_rewrite_rules.rewrite(model, context=costs.Context(zeros_slow))
    (node,) = [n for n in running_nodes(rolled) if n.op_type == op]
    assert len(node.input) <= 5 or not node.input[5]
    assert _ops(rolled, "ConstantOfShape") == 0
    feeds = cell_inputs(cfg, 3)
    np.testing.assert_allclose(
        runtime.run(rolled, feeds)[0], runtime.run(model, feeds)[0], atol=1e-5
    )


def test_sizes_outside_the_table_take_the_nearest_and_between_every_corner() -> None:
    slow = _table("GRU", {("ort_noopt", "none", 1): 1.3})
    small = build_unrolled_cell(UnrolledCellConfig(op_type="GRU", hidden_size=4, seq=3))
    between = build_unrolled_cell(
        UnrolledCellConfig(op_type="GRU", input_size=8, hidden_size=32, seq=8)
    )
    context = costs.Context(slow)
    assert _ops(rnn_rewrite_rules.rewrite(small, target="onnxruntime", context=context), "GRU") == 1
    assert (
        _ops(rnn_rewrite_rules.rewrite(between, target="onnxruntime", context=context), "GRU") == 0
    )


def test_a_rule_named_is_the_targets_own() -> None:
    model = build_unrolled_rnn(UnrolledRnnConfig(hidden_size=8, seq=4))
    ignored = costs.Context(ignore=True)
    ort = rnn_rewrite_rules.rewrite(
        model, ["RerollRnn[Tanh]"], target="onnxruntime", context=ignored
    )
    portable = rnn_rewrite_rules.rewrite(model, ["RerollRnn[Tanh]"], context=ignored)
    assert _ops(ort, "RNN") == 1 and _ops(portable, "RNN") == 0


def test_a_recurrence_left_unrolled_is_recorded_once_per_chain() -> None:
    model = build_unrolled_rnn(UnrolledRnnConfig(hidden_size=8, seq=4, num_layers=2))
    context = costs.Context()
    rnn_rewrite_rules.rewrite(model, context=context)
    declined = context.declined
    assert [(d.rule, d.reason) for d in declined] == [("RerollRnn[Tanh]", NO_RNN)] * 2
    assert len({d.node for d in declined}) == 2
    context = costs.Context(ignore=True)
    rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=context)
    assert context.declined == []


def _batch_first_table(op: str, ratio: float) -> costs.CostTable:
    """The node's table (``_table``, every point fast) and the ``batch_first`` form's
    points, ``ratio`` at hidden 64 seq 16 batch 5 on ONNX Runtime, else 0.5."""
    points = list(_table(op, {}).points)
    for runtime_key in RUNTIMES:
        for hidden in (8, 64):
            for seq in (2, 16):
                for batch in (1, 5):
                    slow = (runtime_key, hidden, seq, batch) == ("ort", 64, 16, 5)
                    value = ratio if slow else 0.5
                    points.append(
                        costs.Point(
                            runtime_key,
                            op,
                            "batch_first",
                            "forward",
                            hidden,
                            seq,
                            batch,
                            value,
                            value,
                            value,
                        )
                    )
    return costs.CostTable(points, {})


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_a_batch_first_loop_reads_its_own_forms_table(op: str) -> None:
    """The two Transposes a batch-first loop needs are measured as a form of their own
    (``costs.FORM_TABLES``): slower there, the loop stays unrolled, with the reason."""
    cfg = UnrolledCellConfig(op_type=op, input_size=64, hidden_size=64, seq=16, batch_first=True)
    model = build_unrolled_cell(cfg)
    fast = costs.Context(_batch_first_table(op, 0.9))
    rolled = rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=fast)
    assert _ops(rolled, op) == 1
    feeds = cell_inputs(cfg, 3)
    assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(rolled, feeds)) <= 1e-5
    slow = costs.Context(_batch_first_table(op, 1.2))
    assert _ops(rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=slow), op) == 0
    reasons = refusal_reasons(reroll.FAMILY.rules_for("onnxruntime"), model, slow)
    expected = (
        "re-roll kept unrolled: batch-first, Transposes included: hidden 64, seq 16, batch "
        f"symbolic: ONNX Runtime's {op} kernel is slower at hidden 64, seq 16, batch 5 (1.20x "
        "[1.20-1.20]) (measured hidden 64, seq 16, batch 1/5)"
    )
    assert expected in reasons, reasons
    time_major = build_unrolled_cell(
        UnrolledCellConfig(op_type=op, input_size=64, hidden_size=64, seq=16)
    )
    # a time-major loop does not read it
    rolled = rnn_rewrite_rules.rewrite(time_major, target="onnxruntime", context=slow)
    assert _ops(rolled, op) == 1
