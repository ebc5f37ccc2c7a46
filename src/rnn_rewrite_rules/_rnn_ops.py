"""The recurrent ops this package rewrites: one :class:`RnnOp` per op, read by every module
that needs an RNN input or output position, its gates or its attributes.

A new recurrent op is one entry of :data:`RNN_OPS` (and, for the prover, nothing more:
``shape.ops`` registers the RNN transfer function for every entry).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import onnx_ir as ir

__all__ = [
    "DIRECTIONS",
    "REPLACES_BATCH_0_RUN",
    "RNN_OPS",
    "RULE_MADE",
    "RnnOp",
    "describe_node",
    "is_rnn",
    "is_rule_made",
    "mark_replaces_batch_0_run",
    "mark_rule_made",
    "replaces_batch_0_run",
    "rnn_op",
    "rnn_op_of_type",
]

#: direction attribute -> number of directions.
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


@dataclasses.dataclass(frozen=True)
class RnnOp:
    """The signature of one recurrent op.

    Attributes:
        domain, op_type: what a node of this op carries.
        gates: gates per direction, stacked along the hidden axis of W, R (and twice in B).
        inputs: input names by position (``X, W, R, B, sequence_lens, initial_h, ...``).
        outputs: output names by position (``Y, Y_h`` and, with a cell state, ``Y_c``).
        attributes: every attribute -> its default (None: no default, absent means unset).
    """

    domain: str
    op_type: str
    gates: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: Mapping[str, object]

    @property
    def cell_state(self) -> bool:
        """Whether the op carries a cell state (``initial_c`` in, ``Y_c`` out)."""
        return "Y_c" in self.outputs

    @property
    def state_inputs(self) -> tuple[int, ...]:
        """Positions of the initial states (``initial_h``, and ``initial_c`` with a cell)."""
        return tuple(i for i, n in enumerate(self.inputs) if n in ("initial_h", "initial_c"))

    @property
    def state_outputs(self) -> tuple[int, ...]:
        """Positions of the final states (``Y_h``, and ``Y_c`` with a cell)."""
        return tuple(i for i, n in enumerate(self.outputs) if n in ("Y_h", "Y_c"))

    @property
    def weight_inputs(self) -> Mapping[int, str]:
        """Position -> name of the parameters ``W``, ``R``, ``B`` (and ``P`` where it exists)."""
        return {i: n for i, n in enumerate(self.inputs) if n in ("W", "R", "B", "P")}

    @property
    def peephole(self) -> int | None:
        return self.inputs.index("P") if "P" in self.inputs else None


_COMMON = {"activation_alpha": None, "activation_beta": None, "clip": None}
_STANDARD = ("X", "W", "R", "B", "sequence_lens", "initial_h")
_LSTM_INPUTS = (*_STANDARD, "initial_c", "P")


def _op(domain: str, op_type: str, gates: int, inputs, outputs, **attributes) -> RnnOp:
    defaults = {**_COMMON, "direction": "forward", "hidden_size": None, **attributes}
    return RnnOp(domain, op_type, gates, inputs, outputs, MappingProxyType(defaults))


#: (domain, op_type) -> its :class:`RnnOp`, in the order rules are built for them.
RNN_OPS: Mapping[tuple[str, str], RnnOp] = MappingProxyType(
    {
        (op.domain, op.op_type): op
        for op in (
            _op(
                "", "LSTM", 4, _LSTM_INPUTS, ("Y", "Y_h", "Y_c"),
                activations=("Sigmoid", "Tanh", "Tanh"), input_forget=0, layout=0,
            ),
            _op(
                "", "GRU", 3, _STANDARD, ("Y", "Y_h"),
                activations=("Sigmoid", "Tanh"), layout=0, linear_before_reset=0,
            ),
            _op("", "RNN", 1, _STANDARD, ("Y", "Y_h"), activations=("Tanh", "Tanh"), layout=0),
            _op(
                "com.microsoft", "DynamicQuantizeLSTM", 4,
                (*_LSTM_INPUTS, "W_scale", "W_zero_point", "R_scale", "R_zero_point"),
                ("Y", "Y_h", "Y_c"),
                activations=("Sigmoid", "Tanh", "Tanh"), input_forget=0,
            ),
        )
    }
)  # fmt: skip


def rnn_op(node: ir.Node) -> RnnOp | None:
    """The spec of ``node``'s op, or None when it is not a recurrent op."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    return RNN_OPS.get((domain, node.op_type))


def rnn_op_of_type(op_type: str) -> RnnOp | None:
    """The spec of the recurrent op named ``op_type`` (op types are unique across domains)."""
    return next((op for op in RNN_OPS.values() if op.op_type == op_type), None)


def is_rnn(node: ir.Node) -> bool:
    return rnn_op(node) is not None


#: The ``node.meta`` key (in memory, never serialized) on each recurrent node a rule built
#: (``rules.cell.recurrent_node``, a merged reversed half), not on a model's own node a rule
#: re-emits; ``rules._rnn_node.keep_identity`` carries it to a node re-emitted in its place.
#: ``passes.ForwardReverseNodesPass`` converts only marked nodes.
RULE_MADE = "rnn_rewrite_rules.rule_made"


def mark_rule_made(y: ir.Value) -> None:
    """Mark the node producing ``y`` (an output a rule's builder returned) as rule-made."""
    _mark(y, RULE_MADE)


def _mark(y: ir.Value, key: str) -> None:
    node = y.producer()
    if node is not None:
        node.meta[key] = True


def is_rule_made(node: ir.Node) -> bool:
    return bool(node.meta.get(RULE_MADE, False))


#: The ``node.meta`` key (in memory, never serialized) on each LSTM/GRU node a rule built
#: in place of ops that run at batch 0 (unrolled steps, a Loop with no zero-step
#: guard, a streaming step), where ONNX Runtime aborts the process on the node;
#: ``rules._rnn_node.keep_identity`` carries it to a node re-emitted in its place, a merge
#: to the merged node. ``passes.BatchZeroGuardPass`` guards the marked nodes.
REPLACES_BATCH_0_RUN = "rnn_rewrite_rules.replaces_batch_0_run"


def mark_replaces_batch_0_run(y: ir.Value) -> None:
    """Mark the node producing ``y`` as replacing ops that run at batch 0."""
    _mark(y, REPLACES_BATCH_0_RUN)


def replaces_batch_0_run(node: ir.Node) -> bool:
    return bool(node.meta.get(REPLACES_BATCH_0_RUN, False))


def describe_node(node: ir.Node) -> str:
    """``LSTM 'name'``, or ``LSTM (-> 'first output')`` for an unnamed node."""
    if node.name:
        return f"{node.op_type} {node.name!r}"
    outputs = [v.name for v in node.outputs if v is not None and v.name]
    return f"{node.op_type} (-> {outputs[0]!r})" if outputs else node.op_type
