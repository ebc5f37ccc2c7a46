"""rules._initializers: which stored value already holds a tensor a rewrite makes, and
that reuse never merges tensors the model keeps apart (what onnx-ir's deduplication does)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules.rules._initializers import digest, holds, stored_values, tag


def _stored(array: np.ndarray, *, graph_input: bool = False) -> ir.Value:
    graph = ir.Graph([], [], nodes=[])
    value = ir.Value(name="w", const_value=ir.tensor(array, name="w"))
    graph.register_initializer(value)
    if graph_input:
        graph.inputs.append(value)
    return value


_ARRAY = np.array([0.0, 1.5], np.float32)


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        (np.array([-0.0, 1.5], np.float32), "-0.0 is not 0.0: other bits"),
        (_ARRAY.astype(np.float64), "another dtype"),
        (_ARRAY.reshape(1, 2), "another shape"),
        (np.array([0.0, 1.25], np.float32), "other values"),
    ],
)
def test_a_tensor_with_other_bits_dtype_or_shape_is_not_held(stored, reason) -> None:
    assert not holds(_stored(stored), _ARRAY, digest(_ARRAY), raw=True), reason


def test_equal_bits_are_held_only_when_compared_or_tagged() -> None:
    value = _stored(_ARRAY.copy())
    assert holds(value, _ARRAY, digest(_ARRAY), raw=True)
    assert not holds(value, _ARRAY, digest(_ARRAY), raw=False)  # not a tensor a rewrite made
    tag(value, digest(_ARRAY))
    assert holds(value, _ARRAY, digest(_ARRAY), raw=False)


def test_an_overridable_initializer_is_never_held() -> None:
    value = _stored(_ARRAY.copy(), graph_input=True)
    tag(value, digest(_ARRAY))
    assert not holds(value, _ARRAY, digest(_ARRAY), raw=True)


def test_stored_values_are_initializers_and_tagged_constants_only() -> None:
    model = ir.serde.deserialize_model(
        onnx.parser.parse_model("""
            <ir_version: 8, opset_import: ["" : 18]>
            g (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
                a = Constant <value = float[2] {3.0, 4.0}> ()
                b = Constant <value = float[2] {5.0, 6.0}> ()
                s = Add (a, b)
                t = Add (s, w)
                y = Add (t, x)
            }
        """)
    )
    graph = model.graph
    b = graph.node(1).outputs[0]
    tag(b, digest(np.array([5.0, 6.0], np.float32)))
    assert [v.name for v in stored_values(graph)] == ["w", "b"]


def test_a_rewrite_keeps_the_models_own_equal_initializers_apart() -> None:
    """onnx-ir's ``DeduplicateHashedInitializersPass`` would merge ``a`` and ``b``; the
    rewrite and the passes it runs after the rules leave them as they are."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[2] x) => (float[2] y, float[2] z)
            <float[2] a = {1.0, 2.0}, float[2] b = {1.0, 2.0}> {
            y = Add (x, a)
            z = Mul (x, b)
        }
    """)
    result = rnn_rewrite_rules.rewrite(model)
    assert sorted(t.name for t in result.graph.initializer) == ["a", "b"]
    assert [list(n.input) for n in result.graph.node] == [["x", "a"], ["x", "b"]]
