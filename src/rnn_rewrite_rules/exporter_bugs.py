"""Known exporter bugs that leave a recognizable form in the graph.

A model an exporter got wrong computes something other than the source model. No rule can
repair it, and no rule may rewrite it into a form where the bug can no longer be seen:
``--check`` reports it (``diagnostics``), and ``weight_folding`` leaves such a node alone.

* ``onnxscript-gru``: onnxscript 0.5.7 to 0.7.0 export ``torch.nn.GRU`` with ONNX's
  default ``linear_before_reset=0`` (onnxscript #2852, fixed in 0.7.1), where PyTorch's GRU
  is ``linear_before_reset=1``: outputs differ from PyTorch's by up to 14%. torchlib's
  signature is its weight preparation: each direction's W is
  ``Unsqueeze(Concat(Slice(w, H:2H), Slice(w, 0:H), Slice(w, 2H:3H)), [0])``, PyTorch's
  gate order (r, z, n) reordered to ONNX's (z, r, n).
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._rnn_ops import rnn_op

__all__ = ["onnxscript_gru_bug"]

#: Ops that torchlib puts between a direction's reordered W and the GRU.
_WRAPPERS = frozenset({"Unsqueeze", "Concat", "Identity"})
_MAX_HOPS = 4


def onnxscript_gru_bug(node: ir.Node) -> str | None:
    """What is wrong with ``node`` when it is a GRU as the buggy onnxscript releases export
    ``nn.GRU`` (``linear_before_reset=0`` and torchlib's gate reordering of W), else None."""
    spec = rnn_op(node)
    if spec is None or (spec.domain, spec.op_type) != ("", "GRU"):
        return None
    if node.attributes.get_int("linear_before_reset", 0) != 0:
        return None
    w = spec.inputs.index("W")
    weights = node.inputs[w] if len(node.inputs) > w else None
    if weights is None or not _torchlib_reordered(weights):
        return None
    return (
        "linear_before_reset=0 with torchlib's weight reordering: exported by onnxscript "
        "0.5.7 to 0.7.0, which write nn.GRU wrongly (onnxscript #2852; outputs differ from "
        "PyTorch's); re-export with onnxscript >= 0.7.1"
    )


def _torchlib_reordered(value: ir.Value) -> bool:
    """Whether ``value`` is (a direction stack of) torchlib's GRU gate reordering."""
    frontier: list[ir.Value | None] = [value]
    for _ in range(_MAX_HOPS):
        producers = [p for v in frontier if v is not None and (p := v.producer()) is not None]
        producers = [p for p in producers if p.domain in ("", "ai.onnx")]
        if any(_is_gate_reorder(p) for p in producers):
            return True
        frontier = [v for p in producers if p.op_type in _WRAPPERS for v in p.inputs]
        if not frontier:
            return False
    return False


def _is_gate_reorder(node: ir.Node) -> bool:
    """``Concat(Slice(w, H:2H), Slice(w, 0:H), Slice(w, 2H:3H), axis=0)``."""
    if node.op_type != "Concat" or node.attributes.get_int("axis", 0) != 0:
        return False
    if len(node.inputs) != 3:
        return False
    slices = [p for v in node.inputs if v is not None and (p := v.producer()) is not None]
    if len(slices) != 3 or any(s.op_type != "Slice" or len(s.inputs) < 3 for s in slices):
        return False
    if len({s.inputs[0] for s in slices}) != 1:
        return False
    if any(len(s.inputs) > 3 and _scalar(s.inputs[3]) not in (0, None) for s in slices):
        return False  # axes given, and not axis 0
    bounds = [(_scalar(s.inputs[1]), _scalar(s.inputs[2])) for s in slices]
    known = [(start, end) for start, end in bounds if start is not None and end is not None]
    if len(known) != 3:
        return False
    (z, z_end), (r, r_end), (n, n_end) = known
    hidden = r_end
    return (
        r == 0
        and hidden > 0
        and (z, z_end, n, n_end) == (hidden, 2 * hidden, 2 * hidden, 3 * hidden)
    )


def _scalar(value: ir.Value | None) -> int | None:
    """The one integer a constant holds (a 0-D or 1-element tensor), else None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    array = tensor.numpy().reshape(-1)
    return int(array[0]) if array.size == 1 else None
