"""``LoopInvariantPass`` on a Loop that stacks a scan output: values carried unchanged are
read from outside only where the Loop runs at least one step.

ONNX Runtime shapes the stack of a Loop that runs no step from the body's scan output as
it infers it; a body that reads the typed outer value infers more (jax2onnx's nnx LSTM at
seq 0 gave ``(0, 0, 8)`` instead of ``(0, 0, 0)``), so a trip count that may be 0 keeps the
body as written, with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.normalize import Journal, LoopInvariantPass

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
#: ``h`` carried and stacked, ``w`` carried unchanged; TRIPS and COND are filled in.
STACKED = """
agraph (float[N, 3] x, float[3, 3] w, int64 n, bool go) => (float[N, 3] h, float[T, N, 3] ys) {
    cond = Constant<value = bool {1}>()
    three = Constant<value = int64 {3}>()
    zero = Constant<value = int64 {0}>()
    h, w_last, ys = Loop(TRIPS, COND, x, w) <body = loop_body (int64 i, bool c_in,
        float[N, 3] h_in, float[3, 3] w_in) => (bool c_out, float[N, 3] h_out,
        float[3, 3] w_out, float[N, 3] y) {
        c_out = Identity(c_in)
        m = MatMul(h_in, w_in)
        h_out = Tanh(m)
        w_out = Identity(w_in)
        y = Identity(h_out)
    }>
}
"""
REASON = (
    "the Loop may run no step and stacks outputs: ONNX Runtime shapes a stack of no step"
    " from the body's inferred shapes, which reading the outer values can change"
)


def _model(trips: str, cond: str = "cond") -> ir.Model:
    return ir.from_onnx_text(HEADER + STACKED.replace("TRIPS", trips).replace("COND", cond))


def _matmul(model: ir.Model) -> ir.Node:
    loop = next(n for n in model.graph if n.op_type == "Loop")
    return next(n for n in loop.attributes["body"].as_graph() if n.op_type == "MatMul")


def _feeds() -> list[dict]:
    rng = np.random.default_rng(5)
    return [
        {
            "x": rng.standard_normal((rows, 3)).astype(np.float32),
            "w": rng.standard_normal((3, 3)).astype(np.float32),
            "n": np.array(steps, np.int64),
            "go": np.array(True),
        }
        for rows, steps in ((2, 3), (0, 3), (1, 0), (3, 1))
    ]


def _outputs(model: ir.Model, feeds: dict) -> list[np.ndarray]:
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    used = {i.name for i in proto.graph.input}
    return runtime.session(proto, log_level=4).run(
        None, {k: v for k, v in feeds.items() if k in used}
    )


def test_a_loop_of_three_steps_reads_the_outer_value() -> None:
    before, after = _model("three"), _model("three")
    journal = Journal()
    invariant = LoopInvariantPass(journal)
    assert invariant(after).modified and not invariant.refusals
    assert _matmul(after).inputs[1] is after.graph.inputs[1]  # the outer w
    for feeds in _feeds():
        for want, got in zip(_outputs(before, feeds), _outputs(after, feeds), strict=True):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    assert journal.restore() == 1 and _matmul(after).inputs[1].name == "w_in"


@pytest.mark.parametrize(
    ("trips", "cond"),
    [("n", "cond"), ("zero", "cond"), ("three", "go")],
    ids=["trip count an input", "trip count 0", "first condition an input"],
)
def test_a_loop_that_may_run_no_step_is_left_with_the_reason(trips: str, cond: str) -> None:
    model = _model(trips, cond)
    invariant = LoopInvariantPass()
    assert not invariant(model).modified
    assert _matmul(model).inputs[1].name == "w_in"
    assert [reason for _, reason in invariant.refusals] == [REASON]


def test_a_loop_that_stacks_nothing_reads_the_outer_value_at_any_trip_count() -> None:
    """Without a scan output a Loop of no step gives its initial values, whatever the body."""
    text = STACKED.replace(", float[T, N, 3] ys", "").replace("h, w_last, ys", "h, w_last")
    text = text.replace(", float[N, 3] y)", ")").replace("        y = Identity(h_out)\n", "")
    model = ir.from_onnx_text(HEADER + text.replace("TRIPS", "n").replace("COND", "cond"))
    invariant = LoopInvariantPass()
    assert invariant(model).modified and not invariant.refusals
