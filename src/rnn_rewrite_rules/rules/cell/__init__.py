"""One home for the recurrent cell: its proof from a graph and its ONNX node.

- :func:`prove_cell` (:mod:`.prove`): the :class:`Cell` (kind, ``W``, ``R``, ``B`` in
  ONNX's layout and gate order, activations, ``linear_before_reset``) that one step's
  state inputs and outputs compute, or a refusal naming what does not fit. It assumes
  no Loop: Loop and Scan bodies, unrolled chains and single steps feed it values.
- :func:`~.polynomial.polynomial` (:mod:`.polynomial`): an elementwise state update read
  as a polynomial of the values it combines, so every spelling of one formula is one.
- :class:`Constants` (:mod:`rnn_rewrite_rules.shape.constant`): the value of a value
  computed from constants.
- :func:`recurrent_node` (:mod:`.emit`): the ``RNN``/``LSTM``/``GRU`` node itself.
"""

from rnn_rewrite_rules.rules.cell.emit import EMPTY_INPUT_REASON, recurrent_node
from rnn_rewrite_rules.rules.cell.prove import (
    DEFAULT_ACTIVATIONS,
    ONNX_GATES,
    Cell,
    gate_inputs,
    nodes_computing_every,
    prove_cell,
    step_nodes,
    through_identity,
    zero_state_row,
)
from rnn_rewrite_rules.shape.constant import Constants

__all__ = [
    "DEFAULT_ACTIVATIONS",
    "EMPTY_INPUT_REASON",
    "ONNX_GATES",
    "Cell",
    "Constants",
    "gate_inputs",
    "nodes_computing_every",
    "prove_cell",
    "recurrent_node",
    "step_nodes",
    "through_identity",
    "zero_state_row",
]
