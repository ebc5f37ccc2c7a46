"""Replace a Loop or Scan whose body is one RNN/LSTM/GRU cell step by one ONNX node.

Pattern: a ``Loop`` (tf2onnx's ``while_loop``, torch's) or a ``Scan`` whose body holds a
cell: gate pre-activations that are sums of ``MatMul(x_t, W)``, ``MatMul(h_(t-1), R)``,
``MatMul(Concat(x_t, h_(t-1)), W)`` (TF 1), ``Gemm`` and constant biases (through
``Split`` on axis 1 and per-step weight ``Cast``s),
and ``h_t = act(...)`` (RNN), ``c_t = f(f_t) c_(t-1) + f(i) g(g_t)``,
``h_t = f(o) h(c_t)`` (LSTM), ``h_t = z h + (1 - z) n`` or ``(h - n) z + n`` with
``n = g(x_n + r (h R_n + b))`` or ``g(x_n + (r h) R_n + b)`` (GRU); each activation
Sigmoid, Tanh or Relu.

Condition: the gates are told apart by their role in the cell (any gate order); every
weight is a constant; the carried values are exactly h (and c), counters (``+ 1`` per
step) and invariants; Loop: the trip count is a constant ``T``, ``X``'s length (with
states of ``X``'s proven batch) or a count of steps (``ReduceSum`` of a ``Cast`` of
booleans, as ``normalize.LoopConditionPass`` writes for a float condition: never
negative, and at most ``X``'s length wherever the Loop runs, its ``Gather(X, t)`` failing
beyond), the condition is evaluated true after each step but the
last, the step input is ``Gather(X, t)`` of a
rank-3 ``X`` outside the body with ``t`` the iteration number or a counter from 0;
Scan: one scan input on axis 0, forward or reverse; the initial states are provably
``[batch of X, H]`` (or ``[b, H]``: then X and the states are expanded to the batch they
broadcast to, as the body does); every read output is a final state, an invariant or the stacked
``h_t``; the cell computes in float32 (float16 only with :func:`widened_rules`).

Replacement: one ``RNN``/``LSTM``/``GRU`` node (``W``, ``R``, ``B`` folded into ONNX
gate order, ``direction="reverse"`` when ``X`` is a full-length ``ReverseSequence`` or
backwards ``Slice`` of another sequence), ``Squeeze``-d outputs; a reversal of the
stacked output back in time becomes ``Y`` itself. With ``X``'s length as the trip count,
the node sits in ``If(Size(X) == 0)`` (over a count ``n`` of steps: the node reads
``X[0:n]`` and the guard also tests ``n == 0``): ``X`` is empty where its length or
batch is 0, and at batch 0 ONNX Runtime aborts on an LSTM or GRU node where the Loop runs.
The other branch gives the Loop's outputs there (each read final state its initial value;
the stack from a Loop over ``X``'s length, or ``n``, whose body passes ``h`` through,
declared as the original declares it: at length 0 ONNX Runtime shapes that stack of no
step by the body's declaration and inference, ``(0,)``, ``(0, 0, 0)``, ``(0, 0, H)`` or
``(0, 1, H)``, so no one constant would do; at batch 0 it is ``[T, 0, H]``). A Loop that
carries ``X`` itself around (jax2onnx's scan) gets the exact guard, ``If(Size(X) == 0)``:
its zero-step branch is the Loop as written (at length 0 ONNX Runtime shapes that stack
by its own inference of the body, which its optimisation level changes: only the Loop
gives it; at batch 0 ONNX Runtime aborts on an LSTM or GRU node), where the
measured table says no slower (``exact_cost``); the kept Loop is refused as such
(``zero_step.EXACT_BRANCH_REASON``); two such guards
concatenated become one (``guards.MergeGuards``), where ``bidirectional`` merges the pair.
"""

from __future__ import annotations

from onnxscript.rewriter import RewriteRule

from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._forms import FormRule
from rnn_rewrite_rules.rules.loop_scan._common import EXACT_BRANCH, MAX_OUTPUTS
from rnn_rewrite_rules.rules.loop_scan.guards import MergeGuards
from rnn_rewrite_rules.rules.loop_scan.loop import LoopToRnn
from rnn_rewrite_rules.rules.loop_scan.scan import ScanToRnn

__all__ = [
    "EXACT_BRANCH",
    "FAMILY",
    "LoopToRnn",
    "MergeGuards",
    "ScanToRnn",
    "make_rules",
    "widened_rules",
]


def _rules(float32: bool, target: str) -> list[RewriteRule]:
    """One rule per form: a pattern per output count, most outputs first (FormRule)."""
    counts = range(MAX_OUTPUTS, 0, -1)
    suffix = "Widened" if float32 else ""
    return [
        FormRule(f"{cls.__name__}{suffix}", [cls.rule(n, float32, target) for n in counts])
        for cls in (LoopToRnn, ScanToRnn)
    ]


def make_rules(target: str = "portable") -> list[RewriteRule]:
    """The rules for ``target``: ``portable`` emits no ``RNN`` (rten has none), so a
    Loop or Scan holding an RNN cell stays one there."""
    return [*_rules(False, target), MergeGuards.rule()]


def widened_rules(target: str = "portable") -> list[RewriteRule]:
    """The explicit option for float16 cells: computed in float32 between Casts.

    Not a family: ``rewrite(model)`` applies every family, and these change outputs by
    float16's rounding. Apply them yourself:
    ``RewriteRuleSet(widened_rules()).apply_to_model(ir_model)``.
    """
    return _rules(True, target)


FAMILY = RuleFamily.measured("loop_scan", __doc__, make_rules, fixes=("loop-recurrence",))
