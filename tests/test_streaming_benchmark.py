"""The streaming benchmark and its chained loop run end to end (no timing is asserted)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from benchmarks import streaming

from rnn_rewrite_rules._streaming import Stream, frame_feeds, state_pairs
from tests.exporter_files import DATA

DYNAMO = DATA / "torch_dynamo"


@pytest.mark.parametrize(
    ("name", "pairs"),
    [
        ("lstmcell_step", [("h", "h_out"), ("c", "c_out")]),
        ("streaming_enhancer_cache", [("cache_in", "cache_out")]),
        ("vad_decoder_plain_lstm_step", [("h", "h_out"), ("c", "c_out")]),
        ("lstm_2layer", []),
    ],
)
def test_state_pairs_by_name(name: str, pairs) -> None:
    assert state_pairs(onnx.load(DYNAMO / f"{name}.onnx")) == pairs


def test_the_loop_feeds_each_state_to_the_next_call() -> None:
    """Three chained calls equal three calls made by hand."""
    model = onnx.load(DYNAMO / "grucell_step.onnx")
    session = ort.InferenceSession(model.SerializeToString())
    feeds = frame_feeds(model, {})
    names = [o.name for o in model.graph.output]
    stream = Stream(names, feeds, state_pairs(model))
    chained = stream.run_frames(lambda f: session.run(None, f), 3)
    by_hand = dict(feeds)
    for _ in range(3):
        by_hand["h"] = session.run(None, by_hand)[names.index("h_out")]
    np.testing.assert_array_equal(chained["h_out"], by_hand["h"])


def test_benchmark_script_runs(capsys) -> None:
    paths = [str(DYNAMO / "lstmcell_step.onnx"), str(DYNAMO / "streaming_enhancer_cache.onnx")]
    argv = [*paths, "--rounds", "1", "--frames", "3", "--runtimes", "onnxruntime"]
    assert streaming.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "cache_in->cache_out" in lines[2], lines


def test_benchmark_script_refuses_a_model_without_state() -> None:
    with pytest.raises(SystemExit, match="no state input/output pairs"):
        streaming.main([str(DYNAMO / "lstm_2layer.onnx"), "--frames", "1", "--rounds", "1"])
