"""Hand-built pairs: a forward RNN and one on the time-reversed input (or a reverse one),
concatenated, or a lone reversed half.

Pattern (converters without a ``direction`` attribute, hand-written graphs): a forward
``LSTM``/``GRU``/``RNN`` on ``x`` and another on ``Slice(x, starts=[-1],
ends=[INT64_MIN], axes=[0], steps=[-1])`` (time reversed), whose ``Y`` is reversed back
by the same Slice, both concatenated:

* ``Concat(Yf, rev(Yb), axis=1)``: ``[seq, 2, batch, H]``, the bidirectional ``Y``;
* ``Concat(Squeeze(Yf, 1), rev(Squeeze(Yb, 1)), axis=-1)``: ``[seq, batch, 2H]``
  (the reversal may sit before or after the Squeeze);
* batch-free layers (``x [seq, I]`` made ``[seq, 1, I]`` by ``Unsqueeze(x, [1])``):
  ``Concat(Squeeze(Yf, [1, 2]), rev(Squeeze(Yb, [1, 2])), axis=-1)``, ``[seq, 2H]``,
  the reversed half reading ``Unsqueeze(rev(x), [1])`` or ``rev(Unsqueeze(x, [1]))``
  (an Unsqueeze of its own or the forward half's);
* ``rev(Yb)`` (or ``rev(Squeeze(Yb, 1))``) alone: one reverse-direction layer;
* ``Yb`` of a ``direction="reverse"`` node on ``x`` in place of ``rev(Yb)`` (a converter's
  pair, or the reverse rule's result on a hand-built half), ``sequence_lens`` shared;
* a ``Cast`` anywhere on each half's path (a float16 cell computed in float32 casts its
  ``Y`` back), the same on both halves.

Condition: both nodes are the same op with the same attributes (``layout`` 0) and hidden
size; the reversed node reads exactly the Slice of the forward node's ``x`` (a reverse
node reads ``x`` itself), where one computation written twice (``rules._graph.same_value``:
the same deterministic op on the same values, equal constants) is the same value and
``Unsqueeze(rev(v), [1])`` is ``rev(Unsqueeze(v, [1]))``; a
``[1, 2]`` Squeeze needs a batch proven to be 1; each Slice is a full reversal of axis 0
(start ``-1``, end at or below ``-2**62``, step ``-1``: every length an axis can have);
no ``sequence_lens`` on a Slice-reversed half (a ``reverse`` node reverses each sequence
within its length, the Slice the padded tensor), the same ``sequence_lens`` value on a
forward/reverse pair; both or neither have initial states and peepholes; every
intermediate value between a ``Y`` and the Concat has no other reader; a half's
``Y_h``/``Y_c`` may be read by anything (a streaming model's per-direction state output)
when no input of either half is computed from a half's output (the merged node would read
its own output); activations, when given, are given
for both, and ``activation_alpha``/``activation_beta``, when given, hold exactly one
value per activation of that half that takes one (runtimes hand the values in order to
those activations only). A lone reversed half becomes a reverse node on target
``onnxruntime`` only: tract 0.23.9 runs ``direction="reverse"`` as ``"forward"``
(``rules._kernels.WRONG_DIRECTIONS``), and runs the hand-built half right at a static
length, so target ``portable`` keeps the half (a pair's ``bidirectional`` node tract runs
right).

Replacement: one node with ``direction="bidirectional"`` (forward first) and ``W``,
``R``, ``B``, ``P`` stacked on axis 0 (constants stacked once, computed ones by a
``Concat``; a missing ``B`` is zeros of the type of a constant ``W`` or ``R``, which
must exist), states concatenated, then
``Reshape(Transpose(Y, [0, 2, 1, 3]), [0, 0, 2H])`` for the ``[seq, batch, 2H]`` form,
``Reshape(Y, [0, 2H])`` for the batch-free ``[seq, 2H]`` (a batch of 1 needs no
Transpose), the halves' ``Cast`` applied once to the merged ``Y`` (it is elementwise: it
commutes with the Slices, Squeezes, Concat, Transpose and Reshape); or the one node with
``direction="reverse"`` reading ``x``, whose ``Y_h`` (``Y_c``) takes the reads of the
lone half's (the same ``[1, batch, H]``: the half's final state is the state after
``x[0]``, having run from ``x[T-1]``, what a reverse node runs and returns; a node cannot
read its own output, and the reverse node reads what the half read, its ``x`` through
the Slice: no cycle). A lone half whose states are read and whose reversed ``Y`` is
concatenated is left to the pair's merge (which splits the states per direction). A read
``Y_h`` (``Y_c``) of a pair becomes the
halves of ``Split(Y_h, axis=0)``, forward first (``[2, batch, H]`` is the forward and the
reverse direction's final state; the backward half ran over the reversed sequence, which
is what ``direction="reverse"`` runs: its final state is the reverse direction's); the
readers are moved after the merged node (:mod:`._state_reads`).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules._rnn_ops import rnn_op
from rnn_rewrite_rules.rules._graph import (
    int64_constant,
    read_axes,
    same_attributes,
    same_value,
    squeeze,
)
from rnn_rewrite_rules.rules._kernels import wrong_direction
from rnn_rewrite_rules.rules.bidirectional._pair import (
    Half,
    direction,
    emit_merged,
    node_reason,
    only_reader,
    pair_reason,
)
from rnn_rewrite_rules.rules.bidirectional._state_reads import (
    StateReads,
    cycle_reason,
    read_states,
)
from rnn_rewrite_rules.shape import ONE, ShapeProver

__all__ = ["MergeHandBuiltBidirectional", "MergeHandBuiltReverse", "is_reversal"]

#: An end at or below this reverses an axis of any length a tensor can have.
_FULL_END = -(2**62)


def is_reversal(node: ir.Node | None, prover: ShapeProver) -> Refusal | None:
    """None when ``node`` is a Slice reversing axis 0 entirely, else why not."""
    if node is None or node.domain != "" or node.op_type != "Slice":
        return Refusal("not a Slice")
    if len(node.inputs) < 5 or node.inputs[4] is None:
        return Refusal("the Slice has no steps (step 1)")
    starts, ends, steps = (prover.ints(node.inputs[i]) for i in (1, 2, 4))
    axes = prover.ints(node.inputs[3]) if node.inputs[3] is not None else [0]
    if None in (starts, ends, steps, axes) or len(starts) != 1:  # type: ignore[arg-type]
        return Refusal("the Slice's bounds are not constant or not one axis")
    rank = prover.rank(node.inputs[0])
    axis = axes[0] + (rank or 0) if axes[0] < 0 else axes[0]  # type: ignore[index]
    if axis != 0 or steps != [-1]:
        return Refusal("the Slice does not step backwards over axis 0")
    if starts[0] != -1 and starts[0] < 2**62:  # type: ignore[index]
        return Refusal(f"the Slice starts at {starts[0]}, not at the last element")  # type: ignore[index]
    if ends[0] > _FULL_END:  # type: ignore[index]
        return Refusal(f"the Slice ends at {ends[0]}: not a full reversal")  # type: ignore[index]
    return None


def _half(value: ir.Value, prover: ShapeProver) -> Half | Refusal:
    """Follow ``value`` back through one reversal, one ``Squeeze`` of axis 1 (or of
    axes 1 and 2 with a batch proven to be 1) and one ``Cast`` to a Y."""
    reversed_, squeezed, batch_free, cast = False, False, False, None
    while True:
        node = value.producer()
        if node is None:
            return Refusal("the concatenated value is not computed from an RNN's Y")
        if node.domain == "" and node.op_type == "Cast" and cast is None:
            cast = node
        elif node.domain == "" and node.op_type == "Slice" and not reversed_:
            reason = is_reversal(node, prover)
            if reason is not None:
                return reason
            reversed_ = True
        elif node.domain == "" and node.op_type == "Squeeze" and not squeezed:
            axes = read_axes(node, prover.ints)
            removed = None if axes is None else sorted(a % 4 for a in axes)
            if removed not in ([1], [1, 2]) or len(set(axes)) != len(axes):  # type: ignore[arg-type]
                return Refusal("the Squeeze does not remove the direction axis")
            squeezed, batch_free = True, removed == [1, 2]
        else:
            if isinstance(rnn_facts(node, prover), str) or node.domain != "":
                return Refusal(f"{node.op_type} between the RNN and the Concat")
            if value is not node.outputs[0]:
                return Refusal("the value is not the RNN's Y")
            if batch_free and prover.dim(node.inputs[0], 1) != ONE:
                return Refusal(
                    "the Squeeze removes axes 1 and 2, and the batch is not proven to be 1"
                )
            return Half(node, reversed_, squeezed, batch_free, cast)
        source = node.inputs[0]
        if source is None or not only_reader(source):
            return Refusal("an intermediate value has another reader")
        value = source


def _same_cast(a: ir.Node | None, b: ir.Node | None) -> bool:
    """Neither half is cast, or both by Casts of equal attributes."""
    if a is None or b is None:
        return a is b
    return same_attributes(a, b)


def _cast_like(op, value: ir.Value, cast: ir.Node | None) -> ir.Value:
    """``value`` cast as ``cast`` does (a Cast is elementwise: it commutes with the
    Concat, Slices, Squeezes, Transposes and Reshapes of the pair)."""
    if cast is None:
        return value
    return op.Cast(value, **{k: v.value for k, v in cast.attributes.items()})


def _reversed_input_reason(
    x: ir.Value | None, reversed_x: ir.Value | None, prover: ShapeProver
) -> Refusal | None:
    """None when ``reversed_x`` is ``x`` reversed in time: ``rev(x)``, or
    ``Unsqueeze(rev(v), [1])`` where ``x`` is ``Unsqueeze(v, [1])`` (reversing axis 0
    and inserting axis 1 commute), else why not."""
    node = None if reversed_x is None else reversed_x.producer()
    if node is not None and node.domain == "" and node.op_type == "Unsqueeze":
        axes = read_axes(node, prover.ints)
        x_node = None if x is None else x.producer()
        if (
            axes in ([1], [-2])
            and x_node is not None
            and x_node.domain == ""
            and x_node.op_type == "Unsqueeze"
            and read_axes(x_node, prover.ints) in ([1], [-2])
        ):
            slice_node = None if node.inputs[0] is None else node.inputs[0].producer()
            if slice_node is not None and same_value(slice_node.inputs[0], x_node.inputs[0]):
                return is_reversal(slice_node, prover)
    if node is None or not node.inputs or not same_value(node.inputs[0], x):
        return Refusal("the second RNN does not read the reversed input of the first")
    return is_reversal(node, prover)


def _sliced_rnn(value: ir.Value) -> ir.Node | None:
    """The RNN node whose output ``value`` reads through at most a Squeeze and a Slice
    that does not reverse (a converter's read of one direction), else None."""
    node = value.producer()
    if node is not None and node.domain == "" and node.op_type == "Squeeze":
        squeezed = node.inputs[0]
        node = None if squeezed is None else squeezed.producer()
    if node is None or node.domain != "" or node.op_type != "Slice" or node.inputs[0] is None:
        return None
    if len(node.inputs) >= 5 and node.inputs[4] is not None:
        return None  # a step: perhaps a reversal of a hand-built half
    source = node.inputs[0].producer()
    return source if source is not None and rnn_op(source) is not None else None


class MergeHandBuiltBidirectional(RewriteRuleClassBase):
    """Concat(RNN(x), rev(RNN(rev(x)))) -> RNN(x, direction="bidirectional")."""

    _plan: tuple[Half, Half, ir.Value, int, list[bool], int]
    _graph: ir.Graph | ir.Function
    _main_graph: bool

    def __init__(self) -> None:
        super().__init__()
        self._states = StateReads()

    def pattern(self, op, a, b):
        return op.Concat(a, b, _allow_other_attributes=True)

    def check(self, context, a: ir.Value, b: ir.Value, **_) -> MatchResult:
        check_result = MatchResult()
        prover = ShapeProver(context.model.graph)
        sliced = _sliced_rnn(a)
        if sliced is not None and sliced is _sliced_rnn(b):
            reason = (
                "both halves are Slices of one RNN node's output (a converter's per-direction"
                " read, not a hand-built pair)"
            )
            return check_result.fail(reason, context.root)
        halves = []
        for value in (a, b):
            if not only_reader(value):
                return check_result.fail("a concatenated value has another reader", value)
            half = _half(value, prover)
            if isinstance(half, Refusal):
                return check_result.fail(half, value)
            halves.append(half)
        forward, backward = halves
        backward_node_reverse = direction(backward.node) == "reverse"
        if forward.reversed or backward.reversed == backward_node_reverse:
            return check_result.fail("not a forward half followed by a reversed half", b)
        if forward.squeezed != backward.squeezed:
            return check_result.fail("only one half is squeezed", b)
        if forward.batch_free != backward.batch_free:
            return check_result.fail("only one half's Squeeze removes the batch", b)
        if not _same_cast(forward.cast, backward.cast):
            return check_result.fail("the halves are not cast alike", b)
        axis = context.root.attributes.get_int("axis", 0)
        feature_axes = (1, -1) if forward.batch_free else (2, -1)  # [seq, H] or [seq, b, H]
        if forward.squeezed and axis not in feature_axes:
            reason = "the halves are not concatenated on the feature axis"
            return check_result.fail(reason, context.root)
        if not forward.squeezed and axis not in (1, -3):
            reason = "the halves are not concatenated on the direction axis"
            return check_result.fail(reason, context.root)
        refusal = pair_reason(forward, backward, prover, states_read=True)
        if refusal is not None:
            return check_result.fail(refusal, backward.node)
        reads = read_states((forward.node, backward.node))
        if any(reads):
            refusal = cycle_reason((forward.node, backward.node))
            if refusal is not None:
                return check_result.fail(refusal, backward.node)
        opset = opset_version(context.model, context.graph_or_function)
        if isinstance(opset, Refusal):
            return check_result.fail(opset, context.root)
        x = forward.node.inputs[0]
        if x is None:
            return check_result.fail("the forward RNN has no input", forward.node)
        if backward_node_reverse:  # a reverse node (or a merged reversed half) on x itself
            if not same_value(backward.node.inputs[0], x):
                reason = "the reverse RNN does not read the forward RNN's input"
                return check_result.fail(reason, backward.node)
        else:
            refused = _reversed_input_reason(x, backward.node.inputs[0], prover)
            if refused is not None:
                return check_result.fail(refused, backward.node)
        facts = rnn_facts(forward.node, prover)
        assert not isinstance(facts, Refusal)
        self._plan = (forward, backward, x, 2 * facts.hidden_size, reads, opset)
        self._graph = context.graph_or_function
        self._main_graph = context.graph_or_function is context.model.graph
        return check_result

    def setup(self) -> None:
        self._states.enter()

    def cleanup(self) -> None:
        self._states.leave()

    def rewrite(self, op, a: ir.Value, **_):
        forward, backward, x, width, reads, opset = self._plan
        main = self._graph if isinstance(self._graph, ir.Graph) and self._main_graph else None
        count = 1 + max((k for k, read in enumerate(reads, start=1) if read), default=0)
        outputs = emit_merged(op, main, forward.node, backward.node, x, count)
        nodes = (forward.node, backward.node)
        for k, read in enumerate(reads, start=1):
            if read:
                self._states.emit(op, opset, outputs[k], nodes, k)
        y = outputs[0]
        y = _cast_like(op, y, forward.cast)
        if not forward.squeezed:
            return y
        as_node = not self._main_graph
        if forward.batch_free:  # [seq, 2, 1, H]: with a batch of 1, already [seq, 2H] in order
            return op.Reshape(y, int64_constant(op, self._graph, [0, width], as_node=as_node))
        target = int64_constant(op, self._graph, [0, 0, width], as_node=as_node)
        return op.Reshape(op.Transpose(y, perm=[0, 2, 1, 3]), target)


def _concatenated(value: ir.Value) -> bool:
    """``value``, or what a chain of single-reader Squeezes and Casts makes of it, is read
    by a Concat (perhaps the other half of a hand-built pair)."""
    while True:
        readers = [node for node, _ in value.uses()]
        if any(n.domain == "" and n.op_type == "Concat" for n in readers):
            return True
        if len(readers) != 1 or readers[0].domain != "":
            return False
        if readers[0].op_type not in ("Squeeze", "Cast") or not readers[0].outputs:
            return False
        value = readers[0].outputs[0]


class MergeHandBuiltReverse(RewriteRuleClassBase):
    """rev(RNN(rev(x))) -> RNN(x, direction="reverse"), its read states the node's."""

    _plan: tuple[Half, ir.Value, list[bool]]
    _graph: ir.Graph | ir.Function
    _main_graph: bool
    _opset: int

    def __init__(self, target: str = "portable") -> None:
        super().__init__()
        self._states = StateReads()
        self.target = target

    def setup(self) -> None:
        self._states.enter()

    def cleanup(self) -> None:
        self._states.leave()

    def pattern(self, op, y, starts, ends, axes, steps):
        return op.Slice(y, starts, ends, axes, steps)

    def check(self, context, y: ir.Value, **_) -> MatchResult:
        check_result = MatchResult()
        prover = ShapeProver(context.model.graph)
        root = context.root
        out = root.outputs[0]
        half = _half(out, prover)  # reversed: its walk starts at the root, a reversal
        if isinstance(half, Refusal):
            return check_result.fail(half, out)
        reason = node_reason(half.node, states_read=True)
        if reason is not None:
            return check_result.fail(reason, half.node)
        wrong = wrong_direction("reverse", (self.target,))
        if wrong is not None:
            return check_result.fail(wrong, half.node)
        reads = read_states((half.node,))
        if any(reads) and _concatenated(out):
            paired = (
                "Y_h or Y_c is read and the reversed Y is concatenated: a pair's merge "
                "(MergeHandBuiltBidirectional) splits the states per direction"
            )
            return check_result.fail(paired, half.node)
        reversed_x = half.node.inputs[0]
        slice_node = None if reversed_x is None else reversed_x.producer()
        if slice_node is None or (reason := is_reversal(slice_node, prover)) is not None:
            return check_result.fail(reason or "the RNN does not read a reversed input", half.node)
        source = slice_node.inputs[0]
        if source is None:
            return check_result.fail("the reversal has no input", slice_node)
        self._plan = (half, source, reads)
        self._graph = context.graph_or_function
        self._main_graph = context.graph_or_function is context.model.graph
        opset = opset_version(context.model, context.graph_or_function)
        if isinstance(opset, Refusal):
            return check_result.fail(opset, context.root)
        self._opset = opset
        return check_result

    def rewrite(self, op, y: ir.Value, **_):
        half, x, reads = self._plan
        count = 1 + max((k for k, read in enumerate(reads, start=1) if read), default=0)
        outputs = emit_merged(op, None, half.node, None, x, count)
        for k, read in enumerate(reads, start=1):
            if read:
                self._states.keep(half.node.outputs[k], outputs[k])
        result = _cast_like(op, outputs[0], half.cast)
        if half.squeezed:
            as_node = not self._main_graph
            ints = lambda v: int64_constant(op, self._graph, v, as_node=as_node)  # noqa: E731
            result = squeeze(op, result, [1, 2] if half.batch_free else [1], self._opset, ints)
        return result
