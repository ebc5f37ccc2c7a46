"""Builders: hand-built bidirectional stacks (and a lone reversed half) of a streaming model,
each direction's state a graph input and its new state a graph output (the per-call state in
and out); and the checks their tests share (:func:`rewrite_checked`, :func:`assert_same`).

``x [T, F]`` is made ``[T, 1, F]`` by ``Unsqueeze(x, [1])``; each layer's forward half
reads it, the backward half a negative-step ``Slice`` of it (time reversed), whose ``Y`` is
reversed back; each half's initial states are 1-D inputs ``[H]`` made ``[1, 1, H]`` by
``Unsqueeze(h, [0, 1])``; ``Y_h`` (``Y_c``) goes out per direction.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import rnn_rewrite_rules

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
NEAR_MISSES = ("cycle", "one_peephole", "y_read")


def hand_built_stack(
    op_type: str = "LSTM",
    *,
    layers: int = 3,
    y_form: str = "squeeze",
    state_out: str = "squeezed",
    peepholes: bool = True,
    near_miss: str | None = None,
    features: int = 4,
    hidden: int = 3,
) -> onnx.ModelProto:
    """The stack.

    ``y_form``: ``squeeze`` (``Squeeze(Y, [1])`` per half, the backward one reversed back,
    ``Concat(axis=2)``: ``[T, 1, 2H]``, ``y = Squeeze(.., [1])`` at the end) or
    ``batch_free`` (``Squeeze(Y, [1, 2])``, ``Concat(axis=-1)``: ``[T, 2H]``, unsqueezed
    again for the next layer). ``state_out``: ``squeezed`` (``Squeeze(Y_h, [0, 1])``,
    ``[H]``), ``raw`` (``Y_h`` itself, ``[1, 1, H]``) or ``none`` (unread).
    ``peepholes``: LSTM halves have ``P``.

    Near misses (layer 0): ``cycle`` (the backward half's initial ``h`` is the forward
    half's ``Y_h``: merged, the node would read its own output), ``one_peephole`` (only the
    forward half has ``P``), ``y_read`` (the forward half's squeezed ``Y`` is also a graph
    output).
    """
    if near_miss not in (None, *NEAR_MISSES):
        raise ValueError(near_miss)
    rng = np.random.default_rng(0)
    gates = GATES[op_type]
    names = ("h", "c") if op_type == "LSTM" else ("h",)
    nodes: list[onnx.NodeProto] = []
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), n)
        for n, v in (
            ("ax1", [1]),
            ("ax12", [1, 2]),
            ("ax01", [0, 1]),
            ("rev_start", [-1]),
            ("rev_end", [np.iinfo(np.int64).min]),
            ("ax0", [0]),
            ("rev_step", [-1]),
        )
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", features])]
    outputs: list[onnx.ValueInfoProto] = []

    def node(op: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=f"n_{out}", **attrs))
        return out

    def rev(src: str, dst: str) -> str:
        return node("Slice", [src, "rev_start", "rev_end", "ax0", "rev_step"], dst)

    def weight(name: str, shape: list[int]) -> str:
        array = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        inits.append(numpy_helper.from_array(array, name))
        return name

    layer_in, size = node("Unsqueeze", ["x", "ax1"], "x3"), features
    for layer in range(layers):
        halves, first = [], {}
        for d in ("f", "b"):
            p = f"l{layer}_{d}"
            ws = [
                weight(f"{p}_W", [1, gates * hidden, size]),
                weight(f"{p}_R", [1, gates * hidden, hidden]),
                weight(f"{p}_B", [1, 2 * gates * hidden]),
            ]
            states = []
            for s in names:
                inputs.append(
                    helper.make_tensor_value_info(f"{p}_{s}", TensorProto.FLOAT, [hidden])
                )
                states.append(node("Unsqueeze", [f"{p}_{s}", "ax01"], f"{p}_{s}3"))
            if near_miss == "cycle" and layer == 0 and d == "b":
                states[0] = first["Yh"]
            has_p = peepholes and op_type == "LSTM"
            if near_miss == "one_peephole" and layer == 0 and d == "b":
                has_p = False
            extra = [weight(f"{p}_P", [1, 3 * hidden])] if has_p else []
            x = layer_in if d == "f" else rev(layer_in, f"{p}_xrev")
            outs = [f"{p}_Y", f"{p}_Yh", f"{p}_Yc"][: 1 + len(names)]
            nodes.append(
                helper.make_node(
                    op_type,
                    [x, *ws, "", *states, *extra],
                    outs,
                    name=f"{p}_{op_type.lower()}",
                    hidden_size=hidden,
                )
            )
            first = {"Yh": f"{p}_Yh"}
            for s, y in zip(names, outs[1:], strict=True):
                if state_out == "squeezed":
                    out = node("Squeeze", [y, "ax01"], f"{p}_{s}_out")
                    outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [hidden]))
                elif state_out == "raw":
                    outputs.append(
                        helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 1, hidden])
                    )
            axes = "ax12" if y_form == "batch_free" else "ax1"
            y = node("Squeeze", [f"{p}_Y", axes], f"{p}_y")
            if near_miss == "y_read" and layer == 0 and d == "f":
                rank = 2 if y_form == "batch_free" else 3
                shape = ["T", hidden] if rank == 2 else ["T", 1, hidden]
                outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, shape))
            halves.append(y if d == "f" else rev(y, f"{p}_yback"))
        axis = -1 if y_form == "batch_free" else 2
        layer_out = node("Concat", halves, f"l{layer}_out", axis=axis)
        if y_form == "batch_free":
            layer_in = node("Unsqueeze", [layer_out, "ax1"], f"l{layer}_out3")
        else:
            layer_in = layer_out
        size = 2 * hidden
    node("Squeeze", [layer_in, "ax1"], "y")
    outputs.insert(0, helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 2 * hidden]))
    graph = helper.make_graph(nodes, "hand_built_stack", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def feeds(model: onnx.ModelProto, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs: ``x [steps, F]`` and every state."""
    rng = np.random.default_rng(seed)
    result = {}
    for value in model.graph.input:
        dims = [
            d.dim_value if d.dim_param == "" else steps for d in value.type.tensor_type.shape.dim
        ]
        result[value.name] = rng.standard_normal(dims).astype(np.float32)
    return result


LONE_NEAR_MISSES = ("short_slice", "sequence_lens", "concatenated")


def lone_reversed_half(
    op_type: str = "LSTM",
    *,
    state_out: str = "squeezed",
    peepholes: bool = True,
    near_miss: str | None = None,
    features: int = 4,
    hidden: int = 3,
) -> onnx.ModelProto:
    """One reverse-direction layer built by hand: a forward ``op_type`` node reading the
    negative-step ``Slice`` of ``Unsqueeze(x, [1])`` (``[T, 1, F]``), its ``Squeeze(Y, [1])``
    reversed back to ``y [T, 1, H]``; the states 1-D inputs ``[H]`` (``Unsqueeze(.., [0,
    1])``), the new ones graph outputs (``state_out`` as for :func:`hand_built_stack`).

    Near misses: ``short_slice`` (the input Slice starts at -2: the last step is dropped),
    ``sequence_lens`` (the node has ``sequence_lens``: the Slice reverses the padding too),
    ``concatenated`` (``y`` is concatenated with the input, as a pair's reversed half is).
    """
    if near_miss not in (None, *LONE_NEAR_MISSES):
        raise ValueError(near_miss)
    rng = np.random.default_rng(1)
    gates = GATES[op_type]
    names = ("h", "c") if op_type == "LSTM" else ("h",)
    start = -2 if near_miss == "short_slice" else -1
    ints = {
        "ax1": [1],
        "ax01": [0, 1],
        "start": [start],
        "rev_start": [-1],
        "rev_end": [np.iinfo(np.int64).min],
        "ax0": [0],
        "rev_step": [-1],
    }
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in ints.items()]
    for name, shape in (
        ("W", [1, gates * hidden, features]),
        ("R", [1, gates * hidden, hidden]),
        ("B", [1, 2 * gates * hidden]),
        ("P", [1, 3 * hidden]),
    ):
        array = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        inits.append(numpy_helper.from_array(array, name))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", features])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 1, hidden])]
    nodes = [
        helper.make_node("Unsqueeze", ["x", "ax1"], ["x3"], name="n_x3"),
        helper.make_node(
            "Slice", ["x3", "start", "rev_end", "ax0", "rev_step"], ["xrev"], name="n_xrev"
        ),
    ]
    lens = ""
    if near_miss == "sequence_lens":
        nodes.append(helper.make_node("Shape", ["x"], ["lens"], name="n_lens", start=0, end=1))
        nodes.append(helper.make_node("Cast", ["lens"], ["lens32"], name="n_lens32", to=6))
        lens = "lens32"
    states = []
    for s in names:
        inputs.append(helper.make_tensor_value_info(f"{s}0", TensorProto.FLOAT, [hidden]))
        nodes.append(helper.make_node("Unsqueeze", [f"{s}0", "ax01"], [f"{s}03"], name=f"n_{s}03"))
        states.append(f"{s}03")
    extra = ["P"] if peepholes and op_type == "LSTM" else []
    outs = ["Y", "Y_h", "Y_c"][: 1 + len(names)]
    ins = ["xrev", "W", "R", "B", lens, *states, *extra]
    nodes.append(
        helper.make_node(op_type, ins, outs, name=f"b_{op_type.lower()}", hidden_size=hidden)
    )
    for s, y in zip(names, outs[1:], strict=True):
        if state_out == "squeezed":
            nodes.append(helper.make_node("Squeeze", [y, "ax01"], [f"{s}1"], name=f"n_{s}1"))
            outputs.append(helper.make_tensor_value_info(f"{s}1", TensorProto.FLOAT, [hidden]))
        elif state_out == "raw":
            outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 1, hidden]))
    nodes.append(helper.make_node("Squeeze", ["Y", "ax1"], ["ysq"], name="n_ysq"))
    back = "yback" if near_miss == "concatenated" else "y"
    nodes.append(
        helper.make_node(
            "Slice", ["ysq", "rev_start", "rev_end", "ax0", "rev_step"], [back], name="n_back"
        )
    )
    if near_miss == "concatenated":
        nodes.append(helper.make_node("Concat", [back, "x3"], ["y"], name="n_y", axis=2))
        outputs[0] = helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["T", 1, hidden + features]
        )
    graph = helper.make_graph(nodes, "lone_reversed_half", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


#: The lengths :func:`assert_same` runs at (and 0).
STEPS = (1, 3, 7)


def rewrite_checked(model: onnx.ModelProto, target: str | None = None) -> onnx.ModelProto:
    """``rewrite(model, target=target)``, checked, and equal to rewriting it again."""
    after = rnn_rewrite_rules.rewrite(model, target=target)
    onnx.checker.check_model(after, full_check=True)
    again = rnn_rewrite_rules.rewrite(after, target=target)
    assert again.graph == after.graph, "rewriting twice differs from once"
    return after


def run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString()).run(None, inputs)


def assert_same(before: onnx.ModelProto, after: onnx.ModelProto, op_type: str) -> None:
    """Equal outputs in ONNX Runtime at each of :data:`STEPS`; at length 0 (not a GRU:
    ONNX Runtime aborts on it) ``y``'s shape only, ``[0, ...]`` (ONNX Runtime leaves
    ``Y_h``/``Y_c`` uninitialised there, the original's too)."""
    for seed, steps in enumerate(STEPS):
        inputs = feeds(before, steps, seed)
        for a, b in zip(run(before, inputs), run(after, inputs), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    if op_type != "GRU":
        inputs = feeds(before, 0)
        shape = run(before, inputs)[0].shape
        assert run(after, inputs)[0].shape == shape and shape[0] == 0
