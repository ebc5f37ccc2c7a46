"""Turn an RNN's Y into [seq, batch, D*H] with Squeeze or a constant Reshape, not a runtime shape.

Pattern: ``Reshape(Transpose(Y, perm=[0, 2, 1, 3]), target)`` where ``Y`` is output 0
of an ``LSTM``/``GRU``/``RNN`` (layout 0, so ``Y: [seq, D, batch, H]``). torchlib computes
``target`` at run time with ``Shape -> 4x Slice -> Mul -> Reshape(-1) -> Concat``; other
tools leave ``Shape(start, end)``, ``Gather`` on ``Shape(Y)`` (ORT's offline optimizer)
or a constant with ``0`` / ``-1``.

Condition: ``target`` evaluates symbolically (see ``_shape_algebra``) to exactly
``[seq, batch, D*H]`` with ``D`` from the direction attribute and ``H`` from
``hidden_size`` (or R's static shape), honouring ``allowzero``. A target that fixes
the sequence or batch axis to a number (an export specialised to one size) is not
equivalent for other sizes and is left alone.

Replacement: ``Squeeze(Y, axes=[1])`` when ``D == 1``; otherwise
``Reshape(Transpose(Y), [0, 0, D*H])`` whose zeros copy seq and batch, so every
dynamic axis stays dynamic.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet

from rnn_rewrite_rules._rnn import opset_version, rnn_facts
from rnn_rewrite_rules._shape_algebra import Term, canonical_dim, evaluate
from rnn_rewrite_rules.rules._constants import int64_constant
from rnn_rewrite_rules.rules._family import RuleFamily

__all__ = ["FAMILY", "RnnOutputToSequence", "rules"]


_AXIS_NAMES = ("sequence", "batch", "direction*hidden")


def _resolve_target(
    terms: tuple[Term, ...], input_dims: list[Term], expected: list[Term], allowzero: int
) -> str | None:
    """Compare a target with ``expected`` under Reshape's 0 (copy) and -1 (infer) rules.

    Returns None when they provably agree, else the reason they may not.
    """
    resolved: list[Term | None] = []
    for i, term in enumerate(terms):
        if term.is_constant and term.coef == 0 and not allowzero:
            term = input_dims[i]
        resolved.append(None if term.is_constant and term.coef == -1 else term)
    for axis, (got, want) in enumerate(zip(resolved, expected, strict=True)):
        if got is not None and got != want:
            what = f"the constant {got.coef}" if got.is_constant else "another dimension"
            return f"target's {_AXIS_NAMES[axis]} element is {what}, not the input's"
    unknown = [i for i, t in enumerate(resolved) if t is None]
    if len(unknown) > 1:
        return "target has more than one -1"
    if unknown:
        known, total = Term(1), Term(1)
        for t in resolved:
            known = known if t is None else known * t
        for t in input_dims:
            total = total * t
        if total.divide(known) != expected[unknown[0]]:
            return "cannot prove what the -1 in the target infers"
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
        facts = rnn_facts(y.producer())
        if isinstance(facts, str):
            return check_result.fail(facts, y)
        if y is not facts.node.outputs[0]:
            return check_result.fail("transposed value is not the RNN's Y output", y)
        if facts.layout != 0:
            return check_result.fail("layout=1 RNN: Y is [batch, seq, D, H]", facts.node)
        terms = evaluate(target)
        if terms is None:
            return check_result.fail("reshape target is not a provable shape computation", target)
        if len(terms) != 3:
            return check_result.fail(f"reshape target has {len(terms)} elements, not 3", target)
        input_dims = [canonical_dim(transposed, axis) for axis in range(4)]
        expected = [input_dims[0], input_dims[1], input_dims[2] * input_dims[3]]
        allowzero = context.root.attributes.get_int("allowzero", 0)
        reason = _resolve_target(terms, input_dims, expected, allowzero)
        if reason is not None:
            return check_result.fail(reason, target)
        if facts.num_directions == 2 and self._is_minimal(target, 2 * facts.hidden_size):
            return check_result.fail("target is already the constant [0, 0, D*H]", target)
        self._num_directions = facts.num_directions
        self._width = facts.num_directions * facts.hidden_size
        self._opset = opset_version(context.model, context.graph_or_function)
        self._graph = context.graph_or_function
        return check_result

    @staticmethod
    def _is_minimal(target: ir.Value, width: int) -> bool:
        tensor = ir.convenience.get_const_tensor(target)
        return tensor is not None and tensor.numpy().tolist() == [0, 0, width]

    def rewrite(self, op, y: ir.Value, transposed: ir.Value, **_):
        if self._num_directions == 1:
            if self._opset >= 13:
                return op.Squeeze(y, int64_constant(op, self._graph, [1]))
            return op.Squeeze(y, axes=[1])
        return op.Reshape(transposed, int64_constant(op, self._graph, [0, 0, self._width]))


rnn_output_to_sequence_rule = RnnOutputToSequence.rule()


rules = RewriteRuleSet([rnn_output_to_sequence_rule])

FAMILY = RuleFamily(
    name="layer_output",
    description=(__doc__ or "").partition("\n")[0],
    rule_set=rules,
    install_by_default=True,
    portable=True,
    fixes=("runtime-shape-chain",),
)
