"""``--benchmark`` on a model with state inputs and outputs: its stream's frames per second."""

from __future__ import annotations

import onnx

import rnn_rewrite_rules
from rnn_rewrite_rules import costs
from rnn_rewrite_rules._report import benchmark_lines
from rnn_rewrite_rules.benchmark import benchmark
from rnn_rewrite_rules.testing.one_step import StepConfig, build_step, step_feeds


def _timed(model: onnx.ModelProto, frames: int = 5):
    after = rnn_rewrite_rules.rewrite(model, context=costs.Context(ignore=True))
    feeds = [("batch 1", step_feeds(model, 1))]
    return benchmark(
        model.SerializeToString(),
        after.SerializeToString(),
        feeds,
        repeats=1,
        rounds=1,
        session_repeats=1,
        openvino=False,
        budget=0,
        max_repeats=1,
        stream_frames=frames,
    )


def test_a_model_with_states_is_also_timed_as_a_stream() -> None:
    result = _timed(build_step(StepConfig(op_type="LSTM", batch=1)))
    (stream,) = result.streaming
    assert stream.runtime == "onnxruntime" and stream.frames == 5
    assert stream.states == "h -> h_out, c -> c_out"
    assert stream.original_fps > 0 and stream.result_fps > 0 and stream.low <= stream.high
    lines = "\n".join(benchmark_lines(result))
    assert "onnxruntime streaming (h -> h_out, c -> c_out; 5 calls chained)" in lines
    assert "shown, not judged" in lines


def test_a_model_without_states_has_no_stream() -> None:
    model = build_step(StepConfig(op_type="GRU", batch=1))
    for value in model.graph.output:  # h_out is no longer h's next state
        value.name = "y"
    for node in model.graph.node:
        node.output[:] = ["y" if o == "h_out" else o for o in node.output]
    assert _timed(model).streaming == []


def test_no_stream_when_asked_for_none() -> None:
    assert _timed(build_step(StepConfig(op_type="GRU", batch=1)), frames=0).streaming == []
