"""A what-if for the tract section: our output with explicit zero initial states.

tract 0.23.9 panics on an ``LSTM`` / ``GRU`` / ``RNN`` node without ``initial_h`` when the
batch axis is symbolic. :func:`explicit_zero_states` feeds every such node one shared
``ConstantOfShape(Concat([D], Shape(input)[batch], [H]))`` instead (no ``Slice``, so also
not torchlib's per-layer slicing of a stacked zero tensor, which tract mis-handles for
multi-layer LSTMs). The benchmark checks whether tract runs that form; it is not a rule.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["explicit_zero_states"]

_STATE_INPUTS = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}


def explicit_zero_states(model: onnx.ModelProto, batch_axis: int) -> onnx.ModelProto | None:
    """``model`` with zero states made explicit, or None when no node lacks a state."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    source = graph.input[0].name
    zeros: dict[tuple[int, int], str] = {}
    prefix: list[onnx.NodeProto] = []
    changed = False

    def zeros_for(directions: int, hidden: int) -> str:
        key = (directions, hidden)
        if key not in zeros:
            name = f"explicit_zeros_{directions}x{hidden}"
            for part, value in (("d", directions), ("h", hidden)):
                graph.initializer.append(
                    numpy_helper.from_array(np.array([value], np.int64), f"{name}_{part}")
                )
            prefix.extend(
                [
                    helper.make_node(
                        "Shape", [source], [f"{name}_b"], start=batch_axis, end=batch_axis + 1
                    ),
                    helper.make_node(
                        "Concat", [f"{name}_d", f"{name}_b", f"{name}_h"], [f"{name}_s"], axis=0
                    ),
                    helper.make_node(
                        "ConstantOfShape",
                        [f"{name}_s"],
                        [name],
                        value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0]),
                    ),
                ]
            )
            zeros[key] = name
        return zeros[key]

    for node in graph.node:
        if node.op_type not in _STATE_INPUTS or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("layout", 0) != 0:
            continue
        directions = 2 if attrs.get("direction", b"forward") == b"bidirectional" else 1
        inputs = list(node.input)
        for index in _STATE_INPUTS[node.op_type]:
            inputs += [""] * (index + 1 - len(inputs))
            if not inputs[index]:
                inputs[index] = zeros_for(directions, attrs["hidden_size"])
                changed = True
        del node.input[:]
        node.input.extend(inputs)
    if not changed:
        return None
    nodes = [*prefix, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    return result
