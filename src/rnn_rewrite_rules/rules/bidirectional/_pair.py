"""Two one-direction RNN nodes that are one bidirectional layer: the proof and the merged node.

Shared by the ``bidirectional`` family's rules (``hand_built``, ``states``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._compat import emit_node
from rnn_rewrite_rules._ir import const_array, input_at
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules._rnn_ops import (
    mark_replaces_batch_0_run,
    mark_rule_made,
    replaces_batch_0_run,
    rnn_op,
)
from rnn_rewrite_rules.rules._graph import fresh_name, same_attribute
from rnn_rewrite_rules.rules._rnn_node import keep_identity
from rnn_rewrite_rules.shape import ShapeProver

__all__ = [
    "Half",
    "direction",
    "emit_merged",
    "node_reason",
    "only_reader",
    "pair_reason",
]

_MERGED_ATTRIBUTES = ("activations", "activation_alpha", "activation_beta")
#: The activations that take an ``activation_alpha`` / ``activation_beta`` value (ONNX's
#: RNN ops; ONNX Runtime matches names case-insensitively). A runtime hands the values,
#: in order, to these only: any other activation takes none.
_TAKES = {
    "activation_alpha": frozenset(
        {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
    ),
    "activation_beta": frozenset({"affine", "scaledtanh", "hardsigmoid"}),
}


@dataclasses.dataclass
class Half:
    """One direction: its node, whether its input and Y are time-reversed by a Slice,
    whether its Y is squeezed to ``[seq, batch, H]`` before the Concat, whether that
    Squeeze also removes a batch of 1 (``[seq, H]``, a batch-free layer), and the ``Cast``
    on the way (a float16 cell computed in float32 casts its Y back)."""

    node: ir.Node
    reversed: bool
    squeezed: bool
    batch_free: bool = False
    cast: ir.Node | None = None


def only_reader(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


def direction(node: ir.Node) -> str:
    attr = node.attributes.get("direction")
    return "forward" if attr is None else attr.as_string()


def node_reason(
    node: ir.Node, wanted: str = "forward", sliced: bool = True, *, states_read: bool = False
) -> Refusal | None:
    """Why ``node`` cannot be one direction of a merged node (None: it can).

    ``states_read``: the caller proves what reads ``Y_h``/``Y_c`` itself.
    """
    if direction(node) != wanted:
        return Refusal(f"the RNN is not a {wanted} one")
    if node.attributes.get_int("layout", 0) != 0:
        return Refusal("layout=1 RNN")
    if sliced and input_at(node, 4) is not None:
        return Refusal("sequence_lens is present: the Slice reverses the padding too")
    if not states_read:
        for output in node.outputs[1:]:
            if output.uses() or output.is_graph_output():
                return Refusal("Y_h or Y_c is read")
    return None


def _parameter_reason(node: ir.Node, name: str, half: str) -> Refusal | None:
    """Why ``node``'s ``activation_alpha`` or ``activation_beta`` (``name``) cannot be
    concatenated with the other half's: a half must give exactly one value per activation
    that takes one. With fewer, an activation of its own takes its default, and in the
    merged list the other half's first value instead; with more, the extra values land on
    the other half's activations."""
    attr = node.attributes.get(name)
    if attr is None:
        return None
    given = len(attr.as_floats())
    names = node.attributes.get("activations")
    activations = [] if names is None else list(names.as_strings())
    taking = sum(a.lower() in _TAKES[name] for a in activations)
    if given == taking:
        return None
    plural = "" if taking == 1 else "s"
    return Refusal(
        f"the {half} half gives {given} {name} for {taking} activation{plural} taking one"
    )


def zero_bias(forward: ir.Node, backward: ir.Node) -> np.ndarray | Refusal:
    """Zeros for a half without ``B``: ``[1, 2 * gates * H]`` of the element type of a
    constant ``W`` or ``R`` (the op requires one type), or why there are none."""
    for node in (forward, backward):
        for index in (1, 2):
            array = const_array(input_at(node, index))
            if array is not None and array.ndim == 3 and node.domain == "":
                return np.zeros((1, 2 * array.shape[1]), array.dtype)
    return Refusal("a half has no B, and no W or R is a constant to make its zeros of")


def _attributes(node: ir.Node) -> dict[str, ir.Attr]:
    return {k: v for k, v in node.attributes.items() if k != "direction"}


def pair_reason(
    forward_half: Half, backward_half: Half, prover: ShapeProver, *, states_read: bool = False
) -> Refusal | None:
    """Why the two halves are not one bidirectional layer (None: they are)."""
    forward, backward = forward_half.node, backward_half.node
    sliced = backward_half.reversed
    reason = node_reason(forward, "forward", sliced=False, states_read=states_read)
    reason = reason or node_reason(
        backward, "forward" if sliced else "reverse", sliced=sliced, states_read=states_read
    )
    if reason is not None:
        return reason
    if (forward.domain, forward.op_type) != (backward.domain, backward.op_type):
        return Refusal("the two halves are different ops")
    if input_at(forward, 4) is not input_at(backward, 4):
        return Refusal("the halves have different sequence_lens")
    facts = [rnn_facts(n, prover) for n in (forward, backward)]
    for fact in facts:
        if isinstance(fact, Refusal):
            return fact
    if facts[0].hidden_size != facts[1].hidden_size:  # type: ignore[union-attr]
        return Refusal("the two halves have different hidden sizes")
    a, b = _attributes(forward), _attributes(backward)
    if set(a) != set(b):
        return Refusal("the two halves have different attributes")
    for name in a:
        if name not in _MERGED_ATTRIBUTES and not same_attribute(a[name], b[name]):
            return Refusal(f"the two halves differ in {name}")
    spec = rnn_op(forward)
    assert spec is not None  # rnn_facts proved both halves RNN ops
    peephole = () if spec.peephole is None else (spec.peephole,)
    for index in (*spec.state_inputs, *peephole):
        if (input_at(forward, index) is None) != (input_at(backward, index) is None):
            return Refusal("only one half has an initial state or peepholes")
    backward_name = "backward" if sliced else "reverse"
    for name in ("activation_alpha", "activation_beta"):
        reason = _parameter_reason(forward, name, "forward")
        reason = reason or _parameter_reason(backward, name, backward_name)
        if reason is not None:
            return reason
    if (input_at(forward, 3) is None) != (input_at(backward, 3) is None):
        zeros = zero_bias(forward, backward)
        if isinstance(zeros, Refusal):
            return zeros
    return None


def _stack(
    op, main_graph: ir.Graph | None, values: list[ir.Value | None], hint: str
) -> ir.Value | None:
    """``Concat(values, axis=0)``: one new constant when all are constants, an initializer
    of ``main_graph`` named after ``hint`` (a name no value uses), or a ``Constant``
    without one (a subgraph's new name could shadow one outside it; a function holds no
    initializers)."""
    if all(v is None for v in values):
        return None
    arrays = [const_array(v) for v in values]
    if all(a is not None for a in arrays):
        stacked = np.concatenate(arrays, axis=0)
        tensor = ir.tensor(stacked)
        if main_graph is None:
            return op.Constant(value=tensor)
        return op.initializer(tensor, fresh_name(main_graph, f"{hint}_bidirectional"))
    return op.Concat(*values, axis=0)


def _merged_attributes(forward: ir.Node, backward: ir.Node, wanted: str) -> dict:
    attrs: dict = {}
    for name, attr in _attributes(forward).items():
        if name in _MERGED_ATTRIBUTES and backward is not forward:
            other = backward.attributes[name]
            attrs[name] = list(attr.value) + list(other.value)
        else:
            attrs[name] = attr
    attrs["direction"] = wanted
    return attrs


def emit_merged(
    op,
    main_graph: ir.Graph | None,
    forward: ir.Node,
    backward: ir.Node | None,
    x: ir.Value,
    num_outputs: int = 1,
) -> list[ir.Value]:
    """The merged node (``backward`` None: ``forward`` as a reverse node); its outputs.

    ``main_graph``: the model's graph when the nodes are in it (stacked weights become
    its initializers), else None (``Constant`` nodes)."""
    if backward is None:
        inputs = [x, *forward.inputs[1:]]
        attrs = _merged_attributes(forward, forward, "reverse")
    else:
        inputs = [x]
        for index in range(1, max(len(forward.inputs), len(backward.inputs))):
            pair = [input_at(forward, index), input_at(backward, index)]
            if index == 4:  # sequence_lens: the same value (checked), shared
                inputs.append(pair[0])
                continue
            if index == 3 and (pair[0] is None) != (pair[1] is None):
                pair = [_bias_or_zeros(op, forward, backward, i) for i in (0, 1)]
            present = [v for v in pair if v is not None]
            hint = (present[0].name or "input") if present else ""
            inputs.append(_stack(op, main_graph, pair, hint))
        attrs = _merged_attributes(forward, backward, "bidirectional")
    while inputs and inputs[-1] is None:
        inputs.pop()
    outputs = emit_node(
        op, forward.op_type, inputs, attrs, domain=forward.domain, num_outputs=num_outputs
    )
    keep_identity(outputs[0].producer(), forward)
    if backward is None:  # the reverse node is the rule's, not the model's forward one
        mark_rule_made(outputs[0])
    elif replaces_batch_0_run(backward):  # the forward half's mark: keep_identity
        mark_replaces_batch_0_run(outputs[0])
    return outputs


def _bias_or_zeros(op, forward: ir.Node, backward: ir.Node, which: int) -> ir.Value:
    """The half's ``B``, or typed zeros (never ``B_other * 0``: NaN where it is inf)."""
    bias = input_at((forward, backward)[which], 3)
    if bias is not None:
        return bias
    zeros = zero_bias(forward, backward)
    assert not isinstance(zeros, Refusal)  # pair_reason proved them
    return op.Constant(value=ir.tensor(zeros))
