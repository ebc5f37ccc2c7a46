"""The proof that an ONNX ``Scan`` (opset 9+) runs a recurrent cell over its scan input."""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules.cell import through_identity
from rnn_rewrite_rules.rules.loop_scan._common import (
    Recurrence,
    RecurrenceRule,
    prove_carried,
    states_fit,
    used,
)
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["ScanToRnn", "plan_scan"]


def _ints(node: ir.Node, name: str, count: int, default: int) -> list[int]:
    attr = node.attributes.get(name)
    return [default] * count if attr is None else list(attr.as_ints())


def plan_scan(node: ir.Node, model: ir.Model) -> Recurrence | Refusal:
    """Prove ``node`` (a ``Scan``) is one recurrent layer, or say why not."""
    opset = opset_version(model, model.graph)
    assert isinstance(opset, int)
    if opset < 9:
        return Refusal(f"opset {opset}'s Scan has a batch axis and sequence_lens (opset 9+ only)")
    body_attr = node.attributes.get("body")
    if body_attr is None:
        return Refusal("the Scan has no body")
    body = body_attr.as_graph()
    scan_inputs = node.attributes.get_int("num_scan_inputs", 0)
    if scan_inputs != 1:
        return Refusal(f"the Scan has {scan_inputs} scan inputs, not 1")
    count = len(node.inputs) - 1
    scans = len(body.outputs) - count
    if len(body.inputs) != count + 1 or scans < 0:
        return Refusal("the body's inputs and outputs do not match the Scan's")
    if _ints(node, "scan_input_axes", 1, 0) != [0] or any(
        _ints(node, "scan_output_axes", scans, 0)
    ):
        return Refusal("the Scan does not scan axis 0")
    in_directions = _ints(node, "scan_input_directions", 1, 0)
    out_directions = _ints(node, "scan_output_directions", scans, 0)
    if len(in_directions) != 1 or len(out_directions) != scans:
        return Refusal("the Scan's directions do not match its inputs and outputs")
    (in_direction,) = in_directions
    carried_in, x_t = body.inputs[:count], body.inputs[count]
    carried_out, stacked = body.outputs[:count], body.outputs[count:]
    carried_init = list(node.inputs[:count])

    carried = prove_carried(carried_in, carried_out, carried_init, opset)
    if isinstance(carried, Refusal):
        return carried
    cell, state_of = carried.cell, carried.state_of
    if cell.x is not x_t:
        return Refusal("the cell's step input is not the scan input")
    h_t = through_identity(carried_out[carried.h_index])

    x = node.inputs[count]
    prover = ShapeProver(model.graph)
    if x is None or prover.rank(x) != 3:
        return Refusal("the scan input is not provably of rank 3")
    outputs: list[str | ir.Value | None] = []
    for j, value in enumerate(node.outputs):
        if not used(value):
            outputs.append(None)
        elif j < count and carried_in[j] in carried.counters:
            return Refusal(f"the final value of counter {j} is read")
        elif j < count:
            outputs.append(state_of.get(j) or carried.inits[j])
        elif through_identity(stacked[j - count]) is h_t:
            outputs.append("y" if out_directions[j - count] == in_direction else "y_reversed")
        else:
            return Refusal(f"scan output {j - count} is not h_t (a side output is read)")
    h0, c0 = carried.initial_states
    fits = states_fit(prover, h0, c0, x, cell)
    if isinstance(fits, Refusal):
        return fits
    plan = Recurrence(node, cell, x, bool(in_direction), h0, c0, outputs)
    plan.broadcast = not fits
    return plan


class ScanToRnn(RecurrenceRule):
    """Scan running an RNN/LSTM/GRU cell over its scan input -> one RNN/LSTM/GRU node."""

    op_type = "Scan"

    def plan(self, node: ir.Node, model: ir.Model) -> Recurrence | Refusal:
        return plan_scan(node, model)
