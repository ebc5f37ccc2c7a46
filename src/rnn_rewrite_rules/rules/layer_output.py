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
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRule, RewriteRuleClassBase

from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._graph import int64_constant, squeeze
from rnn_rewrite_rules.rules._rnn_node import keep_identity
from rnn_rewrite_rules.shape import Dim, ShapeProver, reshape

__all__ = ["FAMILY", "RnnOutputToSequence", "make_rules"]

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


def make_rules() -> list[RewriteRule]:
    return [RnnOutputToSequence.rule()]


FAMILY = RuleFamily(
    name="layer_output",
    description=(__doc__ or "").partition("\n")[0],
    make_rules=make_rules,
    install_by_default=True,
    fixes=("runtime-shape-chain",),
)
