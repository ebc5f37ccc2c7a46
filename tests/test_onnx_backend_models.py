"""onnx's own LSTM/GRU/RNN backend node tests: each rewritten model reproduces the stored outputs.

The data (``tests/data/onnx_backend``, Apache-2.0, see its README) comes from the onnx 1.16.2
wheel. Each model is checked as stored (weights are graph inputs) and with every input but
``X`` turned into an initializer, so that the constant-reading rules have something to prove.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from tests.exporter_support import has_layout1, rnn_nodes, run

DATA = Path(__file__).parent / "data" / "onnx_backend"
CASES = sorted(p.name for p in DATA.glob("test_*") if (p / "model.onnx").exists())


def _load(case: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    folder = DATA / case
    model = onnx.load(folder / "model.onnx")
    data = folder / "test_data_set_0"

    def tensors(prefix: str) -> list[np.ndarray]:
        count = len(list(data.glob(f"{prefix}_*.pb")))
        return [
            numpy_helper.to_array(onnx.load_tensor(data / f"{prefix}_{i}.pb")) for i in range(count)
        ]

    inputs = tensors("input")
    feeds = {value.name: array for value, array in zip(model.graph.input, inputs, strict=True)}
    return model, feeds, tensors("output")


def _with_initializers(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Every graph input but X becomes an initializer of its stored value."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    keep = [i for i in result.graph.input if i.name == "X"]
    result.graph.initializer.extend(
        numpy_helper.from_array(a, name) for name, a in feeds.items() if name != "X"
    )
    del result.graph.input[:]
    result.graph.input.extend(keep)
    onnx.checker.check_model(result, full_check=True)
    return result


def _assert_close(expected: list[np.ndarray], actual: list[np.ndarray]) -> None:
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual, strict=True):
        assert e.shape == a.shape
        np.testing.assert_allclose(a, e, rtol=1e-3, atol=1e-6)  # onnx's backend tolerances


def test_the_data_is_there() -> None:
    assert len(CASES) == 12, CASES
    assert {n.op_type for c in CASES for n in rnn_nodes(_load(c)[0])} == {"LSTM", "GRU", "RNN"}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("weights", ["graph_inputs", "initializers"])
def test_rewritten_model_reproduces_stored_outputs(case: str, weights: str) -> None:
    model, feeds, expected = _load(case)
    if weights == "initializers":
        model = _with_initializers(model, feeds)
        feeds = {"X": feeds["X"]}
    batchwise = has_layout1(model)
    if not batchwise:  # the original runs in ORT and matches the stored outputs too
        _assert_close(expected, runtime.run(model, feeds))
    after = rnn_rewrite_rules.rewrite(model)
    onnx.checker.check_model(after, full_check=True)
    assert not has_layout1(after)  # every family, as the CLI applies them
    _assert_close(expected, runtime.run(after, feeds))
    _assert_close(expected, run(after, feeds, "reference"))
    (node,) = rnn_nodes(after)
    if [o.name for o in model.graph.output] == ["Y_h"]:
        assert node.output[0] == ""  # Y was never read
    if case == "test_lstm_with_peepholes" and weights == "initializers":
        # its stored initial_h / initial_c are zeros of the declared static batch: one
        # ConstantOfShape of a constant shape (portable), nothing (onnxruntime)
        assert node.input[5] == node.input[6]
        assert node.input[5] not in {t.name for t in model.graph.initializer}
        minimal = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
        (node,) = rnn_nodes(minimal)
        assert not any(node.input[5:7])
        _assert_close(expected, run(minimal, feeds, "reference"))
