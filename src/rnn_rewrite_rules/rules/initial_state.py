"""Drop initial states that are provably all zeros (the ONNX default) and their shape work.

Pattern: an ``LSTM``/``GRU``/``RNN``/``DynamicQuantizeLSTM`` node whose ``initial_h``
(input 5) or ``initial_c`` (input 6, LSTM) is zeros built at run time or stored, as
exporters write them:

* torchlib: ``Slice(Expand(0.0, Concat([L*D], Shape(x)[batch], [H])), [l*D], [(l+1)*D])``;
* TorchScript: ``ConstantOfShape(Concat([L*D], Unsqueeze(Gather(Shape(x), b)), [H]))``
  (``value`` 0 or absent), sliced per layer;
* tf2onnx / keras: ``Unsqueeze(ConstantOfShape([batch, H]), 0)``, concatenated over
  directions; ``Expand(0, shape)``; ``Mul(finite, 0)``; a zero initializer.

Condition, both proven from constants and the graph's structure only:

1. every element is zero: the value is a zero constant, ``ConstantOfShape`` with a zero
   (or no) ``value``, or ``Slice``/``Expand``/``Identity``/``Cast``/``Unsqueeze``/
   ``Squeeze``/``Reshape``/``Transpose``/``Tile`` of zeros, ``Concat`` of zeros, or
   ``Mul`` of zeros by a provably *finite* tensor (``x * 0`` is NaN for an infinite
   ``x``, so ``Mul(h0_input, 0)`` is not zeros);
2. the shape prover (``rnn_rewrite_rules.shape``) proves its shape is ``[D, batch, H]``
   (layout 1: ``[batch, D, H]``) with ``batch`` the same size as ``X``'s at every size
   (the same symbol, or the number a graph input declares). A zero constant
   ``[D, 1, H]`` fed to a model with a dynamic batch fails at run time for other
   batches; dropping it would hide that frozen axis, so it is left alone.

Replacement: the same RNN node with that input empty (ONNX defines a missing state as
zeros), which lets the ``Shape``/``Concat``/``ConstantOfShape``/``Slice`` chain die.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleSet

from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, copy_rnn_node, rnn_node_rules
from rnn_rewrite_rules.shape import Dim, ShapeProver
from rnn_rewrite_rules.shape.values import is_all_zeros, is_finite

__all__ = [
    "FAMILY",
    "DropZeroInitialState",
    "is_all_zeros",
    "is_finite",
    "rules",
    "state_reason",
]


def state_reason(node: ir.Node, state: ir.Value, prover: ShapeProver) -> str | None:
    """None when ``state`` provably has the shape ``node`` requires of its initial states:
    ``[D, batch of X, H]`` (layout 1: ``[batch of X, D, H]``), else why not."""
    facts = rnn_facts(node, prover)
    if isinstance(facts, str):
        return facts
    x = node.inputs[0]
    if x is None:
        return "the node has no X"
    batch_axis = 0 if facts.layout == 1 else 1
    batch = prover.dim(x, batch_axis)
    if batch is None:
        return "the rank of X is not proven"
    d, h = Dim.const(facts.num_directions), Dim.const(facts.hidden_size)
    expected = (batch, d, h) if facts.layout == 1 else (d, batch, h)
    shape = prover.dims(state)
    if shape is None:
        return "cannot prove the zero state's shape"
    if shape != expected:
        got = "[" + ", ".join(map(str, shape)) + "]"
        return f"the zero state's shape {got} is not provably [D, batch of X, H] (a frozen axis?)"
    return None


def _state_indices(op_type: str) -> tuple[int, ...]:
    return (5, 6) if op_type in ("LSTM", "DynamicQuantizeLSTM") else (5,)


class DropZeroInitialState(RnnNodeRule):
    """RNN(..., initial_h=zeros, initial_c=zeros) -> RNN(..., "", "")."""

    def check_node(self, context, node: ir.Node) -> MatchResult:
        check_result = MatchResult()
        inputs = node.inputs
        candidates = [
            i for i in _state_indices(self.op_type) if i < len(inputs) and inputs[i] is not None
        ]
        zeros = [i for i in candidates if is_all_zeros(inputs[i])]
        if not zeros:
            return check_result.fail("no initial state is a provable all-zero tensor")
        prover = ShapeProver()
        self._zero_states = []
        for i in zeros:
            reason = state_reason(node, inputs[i], prover)
            if reason is not None:
                return check_result.fail(reason, inputs[i])
            self._zero_states.append(i)
        return check_result

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        return copy_rnn_node(op, node, self.num_outputs, dict.fromkeys(self._zero_states))


rules = RewriteRuleSet(rnn_node_rules(DropZeroInitialState))

FAMILY = RuleFamily(
    name="initial_state",
    description=(__doc__ or "").partition("\n")[0],
    rule_set=rules,
    install_by_default=True,
    # tract 0.23.9 panics (``UndeterminedSymbol("batch")``) on an LSTM/GRU without
    # ``initial_h`` when the batch axis is symbolic, though ONNX defines the missing state as
    # zeros; ``portable=True`` leaves the exporter's zero states in place for such runtimes.
    portable=False,
    fixes=("unproven-zero-state",),
)
