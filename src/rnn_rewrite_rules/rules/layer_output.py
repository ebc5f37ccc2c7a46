"""Turn an RNN's Y into [seq, batch, D*H] with Squeeze or a constant Reshape, not a runtime shape.

Pattern: ``Reshape(Transpose(Y, perm=[0, 2, 1, 3]), target)`` where ``Y`` is output 0
of an ``LSTM``/``GRU``/``RNN`` (layout 0, so ``Y: [seq, D, batch, H]``). torchlib computes
``target`` at run time with ``Shape -> 4x Slice -> Mul -> Reshape(-1) -> Concat``; other
tools leave ``Shape(start, end)``, ``Gather`` on ``Shape(Y)`` (ORT's offline optimizer)
or a constant with ``0`` / ``-1``.

Condition: the shape prover (``rnn_rewrite_rules.shape``) proves that ``Reshape`` by
``target`` gives exactly ``[seq, batch, D*H]`` at every size, zero included, with ``D``
from the direction attribute and ``H`` from ``hidden_size`` (or R's proven size),
honouring ``0`` (copy), ``-1`` and ``allowzero``. A target that fixes
the sequence or batch axis to a number (an export specialised to one size) is not
equivalent for other sizes and is left alone.

Replacement: ``Squeeze(Y, axes=[1])`` when ``D == 1``; otherwise
``Reshape(Transpose(Y), [0, 0, D*H])`` whose zeros copy seq and batch, so every
dynamic axis stays dynamic.

A second rule, ``ConcatDirections``, takes tf2onnx's per-direction reads of a
bidirectional node's output.

Pattern: ``Concat(Squeeze(Slice(v, ...)), Squeeze(Slice(v, ...)))`` where ``v`` is
``Y`` (``[seq, 2, batch, H]``) or a final state ``Y_h``/``Y_c`` (``[2, batch, H]``) of
an ``LSTM``/``GRU``/``RNN``/``DynamicQuantizeLSTM`` with ``direction="bidirectional"``.

Condition: the node's facts are static (``layout`` 0, ``D == 2``, ``H`` proven); each
Slice has constant bounds on the direction axis only (axis 1 of ``Y``, 0 of a state),
step 1, and selects exactly one direction once the bounds are clamped to ``D == 2``;
each Squeeze removes exactly that axis; the first input is direction 0, the second
direction 1; the Concat is on the last axis.

Replacement: ``Reshape(Transpose(Y, [0, 2, 1, 3]), [0, 0, 2H])`` (``[seq, batch, 2H]``)
or ``Reshape(Transpose(Y_h, [1, 0, 2]), [0, 2H])`` (``[batch, 2H]``): element
``[.., b, d*H + h]`` is direction ``d``'s ``[.., b, h]`` in both; the zeros copy the
dynamic axes and ``2H`` is a constant, so every size, 0 included, gives the Concat's.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRule, RewriteRuleClassBase

from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._graph import (
    int64_constant,
    producer,
    read_axes,
    slice_bounds,
    squeeze,
)
from rnn_rewrite_rules.rules._rnn_node import keep_identity
from rnn_rewrite_rules.rules._split_reads import SplitReads
from rnn_rewrite_rules.shape import Dim, ShapeProver, reshape

__all__ = [
    "FAMILY",
    "ConcatDirections",
    "RnnOutputToSequence",
    "SplitDirections",
    "make_rules",
]

_AXIS_NAMES = ("sequence", "batch", "direction*hidden")


def _target_reason(
    target: tuple[Dim | None, ...], input_dims: tuple[Dim, ...], allowzero: int
) -> Refusal | None:
    """None when ``Reshape`` of ``input_dims`` by ``target`` is ``[seq, batch, D*H]``."""
    expected = (input_dims[0], input_dims[1], input_dims[2] * input_dims[3])
    out = reshape(input_dims, target, allowzero)
    if isinstance(out, Refusal):
        return Refusal(f"reshape target: {out}")
    for axis, (got, want, element) in enumerate(zip(out, expected, target, strict=True)):
        if got == want:
            continue
        if element is None:
            return Refusal(
                f"target's {_AXIS_NAMES[axis]} element is not a provable shape computation"
            )
        if element.value == -1:
            return Refusal("cannot prove what the -1 in the target infers")
        what = f"the constant {element.value}" if element.is_const else "another dimension"
        return Refusal(f"target's {_AXIS_NAMES[axis]} element is {what}, not the input's")
    return None


class RnnOutputToSequence(RewriteRuleClassBase):
    """Reshape(Transpose(Y, [0,2,1,3]), [seq, batch, D*H]) -> Squeeze(Y, [1]) / constant target."""

    def __init__(self) -> None:
        super().__init__(remove_nodes=False)  # the Transpose may still feed a Shape elsewhere

    def pattern(self, op, y, target):
        transposed = op.Transpose(y, perm=[0, 2, 1, 3], _outputs=["transposed"])
        return op.Reshape(transposed, target, _allow_other_attributes=True)

    # onnxscript passes (context, **bindings); its base class declares (op, *args, **kwargs)
    def check(
        self, context, y: ir.Value, transposed: ir.Value, target: ir.Value, **_
    ) -> MatchResult:
        check_result = MatchResult()
        prover = ShapeProver(context.model.graph)
        facts = rnn_facts(y.producer(), prover)
        if isinstance(facts, Refusal):
            return check_result.fail(facts, y)
        if y is not facts.node.outputs[0]:
            return check_result.fail("transposed value is not the RNN's Y output", y)
        if facts.layout != 0:
            return check_result.fail("layout=1 RNN: Y is [batch, seq, D, H]", facts.node)
        elements = prover.vector(target)
        if elements is None:
            return check_result.fail("reshape target is not a provable shape computation", target)
        if len(elements) != 3:
            return check_result.fail(f"reshape target has {len(elements)} elements, not 3", target)
        input_dims = prover.dims(transposed)
        assert input_dims is not None  # Transpose of a proven RNN output
        allowzero = context.root.attributes.get_int("allowzero", 0)
        reason = _target_reason(elements, input_dims, allowzero)
        if reason is not None:
            return check_result.fail(reason, target)
        if facts.num_directions == 2 and self._is_minimal(target, 2 * facts.hidden_size):
            return check_result.fail("target is already the constant [0, 0, D*H]", target)
        self._num_directions = facts.num_directions
        self._width = facts.num_directions * facts.hidden_size
        opset = opset_version(context.model, context.graph_or_function)
        if isinstance(opset, Refusal):
            return check_result.fail(opset, context.root)
        self._opset = opset
        self._graph = context.graph_or_function
        self._main_graph = context.graph_or_function is context.model.graph
        self._root = context.root
        return check_result

    @staticmethod
    def _is_minimal(target: ir.Value, width: int) -> bool:
        tensor = ir.convenience.get_const_tensor(target)
        return tensor is not None and tensor.numpy().tolist() == [0, 0, width]

    def rewrite(self, op, y: ir.Value, transposed: ir.Value, **_):
        if self._num_directions == 1:
            result = squeeze(op, y, [1], self._opset, lambda v: self._constant(op, v))
        else:
            result = op.Reshape(transposed, self._constant(op, [0, 0, self._width]))
        keep_identity(result.producer(), self._root)
        return result

    def _constant(self, op, values: list[int]) -> ir.Value:
        return int64_constant(op, self._graph, values, as_node=not self._main_graph)


def _clamp(bound: int, size: int) -> int:
    """A Slice bound on an axis of ``size`` elements, as ONNX clamps it (step 1)."""
    if bound < 0:
        bound += size
    return min(max(bound, 0), size)


class _Read:
    """One Concat input proven to be ``Squeeze(Slice(v, d:d+1, axis), axis)``."""

    def __init__(self, source: ir.Value, direction: int, squeeze: ir.Node) -> None:
        self.source, self.direction, self.squeeze = source, direction, squeeze


def _direction_read(value: ir.Value, prover: ShapeProver) -> _Read | Refusal:
    """Prove that ``value`` is one direction of a bidirectional RNN output, squeezed."""
    squeeze_node = producer(value, "Squeeze")
    if squeeze_node is None:
        return Refusal("a concatenated value is not a Squeeze")
    slice_node = producer(squeeze_node.inputs[0], "Slice")
    if slice_node is None:
        return Refusal("the Squeeze does not read a Slice")
    source = slice_node.inputs[0]
    node = None if source is None else source.producer()
    facts = rnn_facts(node, prover)
    if isinstance(facts, Refusal):
        return Refusal(f"the Slice does not read an RNN output: {facts}")
    if facts.layout != 0:
        return Refusal("layout=1 RNN: the direction axis is not where a layout 0 node has it")
    if facts.num_directions != 2:
        return Refusal("the sliced RNN is not bidirectional")
    rank, axis = (4, 1) if source is facts.node.outputs[0] else (3, 0)
    bounds = slice_bounds(slice_node, prover.ints)
    if isinstance(bounds, Refusal):
        return bounds
    start, end, slice_axis, step = bounds
    if slice_axis not in (axis, axis - rank):
        return Refusal("the Slice is not on the direction axis")
    if step != 1:
        return Refusal(f"the Slice has step {step}, not 1")
    start, end = _clamp(start, 2), _clamp(end, 2)
    if end - start != 1:
        return Refusal(f"the Slice selects {max(end - start, 0)} directions, not one")
    if squeeze_node.attributes.get("axes") is None and len(squeeze_node.inputs) < 2:
        return Refusal("the Squeeze has no axes: it removes every axis of size 1")
    axes = read_axes(squeeze_node, prover.ints)
    if axes is None:
        return Refusal("the Squeeze's axes are not constant")
    if len(axes) != 1 or axes[0] not in (axis, axis - rank):
        return Refusal("the Squeeze does not remove exactly the direction axis")
    return _Read(source, start, squeeze_node)  # type: ignore[arg-type]


class ConcatDirections(RewriteRuleClassBase):
    """Concat(Squeeze(Slice(Y, d:d+1)) for d = 0, 1) -> Reshape(Transpose(Y), [0, 0, 2H]).

    Pattern: ``Concat(Squeeze(Slice(y0, ...)), Squeeze(Slice(y1, ...)))`` (bounds and axes
    as inputs or attributes, any opset). Condition (:func:`_direction_read`): ``y0`` and
    ``y1`` are one output of a layout 0 bidirectional node, the Slices read directions 0
    then 1 and the Squeezes remove the direction axis; the Concat is on the last axis.
    """

    def __init__(self) -> None:
        super().__init__(remove_nodes=False)  # a Slice may have other readers

    def pattern(self, op, y0, y1):
        def half(y):
            read = op.Slice(y, _allow_other_inputs=True, _allow_other_attributes=True)
            return op.Squeeze(read, _allow_other_inputs=True, _allow_other_attributes=True)

        return op.Concat(half(y0), half(y1), _allow_other_attributes=True)

    # onnxscript passes (context, **bindings); its base class declares (op, *args, **kwargs)
    def check(self, context, **_) -> MatchResult:
        check_result = MatchResult()
        prover = ShapeProver(context.model.graph)
        a, b = context.root.inputs
        reads = []
        for value in (a, b):
            read = _direction_read(value, prover)
            if isinstance(read, Refusal):
                return check_result.fail(read, value)
            reads.append(read)
        first, second = reads
        if first.source is not second.source:
            return check_result.fail("the two halves slice different values", b)
        if [first.direction, second.direction] != [0, 1]:
            directions = f"{first.direction}, {second.direction}"
            reason = f"the Concat reads directions {directions}, not 0 then 1"
            return check_result.fail(reason, context.root)
        is_y = first.source is first.source.producer().outputs[0]  # type: ignore[union-attr]
        rank = 3 if is_y else 2  # after the Squeeze
        axis = context.root.attributes.get_int("axis", 0)
        if axis not in (rank - 1, -1):
            return check_result.fail("the Concat is not on the last (feature) axis", context.root)
        facts = rnn_facts(first.source.producer(), prover)
        assert not isinstance(facts, Refusal)
        self._source = first.source
        self._is_y = is_y
        self._width = 2 * facts.hidden_size
        self._graph = context.graph_or_function
        self._main_graph = context.graph_or_function is context.model.graph
        self._root = context.root
        return check_result

    def rewrite(self, op, **_):
        source = self._source
        as_node = not self._main_graph
        if self._is_y:
            transposed = op.Transpose(source, perm=[0, 2, 1, 3])
            target = int64_constant(op, self._graph, [0, 0, self._width], as_node=as_node)
        else:
            transposed = op.Transpose(source, perm=[1, 0, 2])
            target = int64_constant(op, self._graph, [0, self._width], as_node=as_node)
        result = op.Reshape(transposed, target)
        keep_identity(result.producer(), self._root)
        return result


class SplitDirections(SplitReads):
    """Slice(v, [0], [1]), Slice(v, [1], [2]) on the direction axis of a bidirectional
    RNN output ``v`` -> one Split(v) (see ``rules._split_reads``).

    Scope: ``v`` is an output of a ``layout`` 0 RNN node with ``D == 2`` and the Slices
    cut its direction axis (1 of ``Y``, 0 of a state); no Slice is squeezed into a
    ``Concat`` (those are :class:`ConcatDirections`'s: one Transpose and Reshape). What
    remains are keras' ``sum``/``mul``/``ave`` merges, ``Add``/``Mul`` of the two
    squeezed directions: their one exact node would be ``ReduceSum``/``ReduceProd``, but
    ``ReduceSum`` turns ``-0 + -0`` into ``+0`` and ``ReduceProd`` measured up to 5x
    slower than ``Mul`` at ``[128, 2, 16, 128]`` in ONNX Runtime 1.32."""

    def scope(
        self, v: ir.Value, slices: list[ir.Node], axis: int, prover: ShapeProver
    ) -> Refusal | None:
        facts = rnn_facts(v.producer(), prover)
        if isinstance(facts, Refusal):
            return Refusal(f"the sliced value is not an RNN output: {facts}")
        if facts.layout != 0 or facts.num_directions != 2:
            return Refusal("the sliced value is not the output of a layout 0 bidirectional node")
        direction_axis = 1 if v is facts.node.outputs[0] else 0
        if axis != direction_axis:
            return Refusal("the Slices do not cut the direction axis")
        for node in slices:
            for use in node.outputs[0].uses():
                squeezed = use.node.outputs[0] if use.node.op_type == "Squeeze" else None
                if squeezed is not None and any(
                    u.node.op_type == "Concat" for u in squeezed.uses()
                ):
                    return Refusal("a direction is concatenated: ConcatDirections' form")
        return None


def make_rules() -> list[RewriteRule]:
    return [RnnOutputToSequence.rule(), ConcatDirections.rule(), SplitDirections.rule()]


FAMILY = RuleFamily(
    name="layer_output",
    description=(__doc__ or "").partition("\n")[0],
    make_rules=make_rules,
    install_by_default=True,
    fixes=("runtime-shape-chain",),
)
