"""A step that is one ``RNN``/``LSTM``/``GRU`` node over a sequence of one step
(TorchScript writes a scripted ``nn.LSTMCell`` call so, between ``Unsqueeze`` and
``Squeeze``).

Pattern: ``h_t = Squeeze(Y_h, [0])`` (and ``c_t = Squeeze(Y_c, [0])``) of one node
``N(Unsqueeze(x_t, [0]), W, R, B, , Unsqueeze(h_(t-1), [0])[, Unsqueeze(c_(t-1), [0])])``.
Condition: ``W``, ``R`` (and ``B``, if given) are constants of one direction; the node has
no ``sequence_lens``, no peepholes, no ``clip``, no activation parameters,
``direction="forward"``, ``layout=0`` and ``input_forget=0``; its activations, if named,
are of those a cell reads (Sigmoid, Tanh, Relu).
Replacement (what :func:`~.prove.prove_cell` returns): the node's own cell, ``W[0]``,
``R[0]``, ``B[0]``.
Equality: ONNX defines the node over a sequence as its cell applied step by step from
``initial_h`` (and ``initial_c``); over one step it is that cell once, from
``h_(t-1)``, and ``Y_h[0]`` is its ``h_t``. The node fails unless ``h_(t-1)`` is
``[batch, H]``: where the body runs, the states have ``H`` columns.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn_ops import describe_node, rnn_op
from rnn_rewrite_rules.rules._graph import input_at, producer, read_axes
from rnn_rewrite_rules.shape.constant import Constants

__all__ = ["NodeStep", "node_step"]

#: Activations a cell reads (ONNX's RNN ops take them by name).
_ACTS = frozenset(("Sigmoid", "Tanh", "Relu"))
_DEFAULTS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}


@dataclasses.dataclass
class NodeStep:
    """The cell of one step node: ``roles[k]`` is the state ``states[k]`` is
    (``"h"`` or ``"c"``); arrays in ONNX's layout, one direction."""

    op_type: str
    x: ir.Value
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray
    biased: bool
    activations: tuple[str, ...]
    linear_before_reset: int
    roles: tuple[str, ...]


def _squeezed(value: ir.Value) -> tuple[ir.Node, int] | None:
    """``(node, k)`` when ``value`` is ``Squeeze(output k of node, [0])``, ``node`` an
    ONNX RNN/LSTM/GRU."""
    squeeze = producer(value, "Squeeze")
    if squeeze is None or squeeze.inputs[0] is None or read_axes(squeeze) != [0]:
        return None
    node = squeeze.inputs[0].producer()
    if node is None or node.domain != "" or rnn_op(node) is None:
        return None
    return node, squeeze.inputs[0].index() or 0


def _unsqueezed(value: ir.Value | None) -> ir.Value | None:
    node = producer(value, "Unsqueeze")
    return node.inputs[0] if node is not None and read_axes(node) == [0] else None


def _attributes_reason(node: ir.Node) -> Refusal | None:
    a, label = node.attributes, describe_node(node)
    if a.get_string("direction", "forward") != "forward" or a.get_int("layout", 0) != 0:
        return Refusal(f"{label} is not forward over [seq, batch, I] (direction or layout)")
    if "clip" in a or "activation_alpha" in a or "activation_beta" in a:
        return Refusal(f"{label} clips or parameterises its activations")
    if a.get_int("input_forget", 0) != 0:
        return Refusal(f"{label} couples the input and forget gates (input_forget)")
    acts = a.get("activations")
    if acts is not None and not set(acts.as_strings()) <= _ACTS:
        return Refusal(f"{label}'s activations are not Sigmoid/Tanh/Relu")
    return None


def node_step(
    states: list[tuple[ir.Value, ir.Value]], constants: Constants
) -> NodeStep | Refusal | None:
    """The cell when the states' outputs (``states``: ``(h_(t-1), h_t)`` pairs, outputs
    past any ``Identity``) are one step node's (see the module docstring), why not, or
    None when they are not a node's outputs at all."""
    found = [_squeezed(out) for _, out in states]
    if any(f is None for f in found) or len({id(f[0]) for f in found if f}) != 1:
        return None
    node = found[0][0]  # type: ignore[index]
    op = rnn_op(node)
    assert op is not None
    label = describe_node(node)
    outputs = {k: op.outputs[k] for _, k in found}  # type: ignore[misc]
    wanted = ["Y_h", "Y_c"] if op.cell_state else ["Y_h"]
    if sorted(outputs.values()) != sorted(wanted) or len(outputs) != len(states):
        return Refusal(f"the states are not {label}'s final states ({', '.join(wanted)})")
    roles = tuple("h" if op.outputs[k] == "Y_h" else "c" for _, k in found)  # type: ignore[misc]
    reason = _attributes_reason(node)
    if reason is not None:
        return reason
    for (prev, _), role in zip(states, roles, strict=True):
        index = op.inputs.index("initial_h" if role == "h" else "initial_c")
        if _unsqueezed(input_at(node, index)) is not prev:
            return Refusal(f"{label}'s initial {role} is not the carried {role}_(t-1)")
    lengths = input_at(node, op.inputs.index("sequence_lens"))
    peepholes = None if op.peephole is None else input_at(node, op.peephole)
    if lengths is not None or peepholes is not None:
        return Refusal(f"{label} reads sequence_lens or peepholes (P)")
    x = _unsqueezed(input_at(node, 0))
    if x is None:
        return Refusal(f"{label}'s X is not Unsqueeze(x_t, [0]): not one step")
    return _weights(node, op.gates, x, roles, constants)


def _weights(
    node: ir.Node, gates: int, x: ir.Value, roles: tuple[str, ...], constants: Constants
) -> NodeStep | Refusal:
    """The node's cell from its constant ``W``, ``R`` (and ``B``)."""
    label, op_type = describe_node(node), node.op_type
    w, r = constants(input_at(node, 1)), constants(input_at(node, 2))
    bias = input_at(node, 3)
    b = None if bias is None else constants(bias)
    if w is None or r is None or (bias is not None and b is None):
        return Refusal(f"{label}'s W, R or B is not a constant")
    if w.ndim != 3 or r.ndim != 3 or w.shape[:2] != r.shape[:2] or w.shape[0] != 1:
        return Refusal(f"{label}'s W and R are not of one direction")
    if r.shape[1] != gates * r.shape[2]:
        return Refusal(f"{label}'s R is not [1, {gates} * H, H]")
    b = np.zeros((1, 2 * r.shape[1]), r.dtype) if b is None else b
    if b.shape != (1, 2 * r.shape[1]) or w.dtype != r.dtype or b.dtype != r.dtype:
        return Refusal(f"{label}'s B is not [1, {2 * r.shape[1]}] of W's type")
    acts = node.attributes.get("activations")
    activations = tuple(acts.as_strings()) if acts is not None else _DEFAULTS[op_type]
    before_reset = node.attributes.get_int("linear_before_reset", 0)
    biased = bias is not None
    return NodeStep(op_type, x, w[0], r[0], b[0], biased, activations, before_reset, roles)
