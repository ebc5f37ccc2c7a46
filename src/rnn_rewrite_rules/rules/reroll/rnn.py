"""Re-roll unrolled ``nn.RNN`` recurrences into one ONNX ``RNN`` node per layer and direction.

Pattern (torch 2.13 + onnxscript 0.7.2, ``torch.onnx.export(dynamo=True)`` of ``nn.RNN``):
an input projection ``P = MatMul(X, W^T) [+ b_ih]`` over the whole sequence, read per
step as ``x_t = Squeeze(Slice(P', [t], [t+1], [0]), [0])`` (torch 2.13 with ``Dim.AUTO``
on the sequence axis: ``SequenceAt(SplitToSequence(P', axis=0, keepdims=0), t)``, the same
row; see ``_chain.read_step``) with ``P' = P`` (forward) or
``P' = Slice(P, [-1], [-inf], [0], [-1])`` (the reverse direction), and a chain of steps
``h_t = act(Add(MatMul(h_{t-1}, R^T) [+ b_hh], x_t))`` with ``act`` ``Tanh`` or ``Relu``,
stacked by ``Concat(h_1, ..., h_T, axis=0)`` (reverse: ``Concat(h_T, ..., h_1)``). With a
zero initial state and a static batch the exporter folds the first step's recurrent term
into a constant ``[1, batch, H]`` equal to ``b_hh`` (zeros without bias).

Condition, proven from the graph's structure and constants only (the rule is rooted at
the last step's activation and walks the chain back):

* every step has the same activation and the same constant weights ``R^T [H, H]`` and
  ``b_hh [H]`` (initializers that are not graph inputs, or ``Constant``), and reads the
  same source ``P'`` whose ``W^T [I, H]`` and ``b_ih [H]`` are constants and whose ``X``
  has rank 3; step ``t`` (``t = 0..T-1``) reads exactly index ``t`` of ``P'``;
* each ``h_t`` before the last is read only by the next step and by the one ``Concat``
  that stacks all steps in order; intermediate values of a step have no other reader;
* ``h_0`` is ``[1, batch, H]``: proven with the zero-state shape evaluation of
  ``initial_state`` (batch equal to ``X``'s), or, when its batch cannot be proven equal
  to ``X``'s (an ``h0`` graph input: ONNX does not enforce equal ``dim_param``), from its
  rank and leading ``Unsqueeze``, in which case both are ``Expand``-ed to the broadcast
  batch exactly as the original's ``Add`` broadcasts them; a folded first step needs a
  batch of 1 or ``X``'s static batch.

The chain has ``T`` steps whatever ``X``'s sequence axis says: the original reads the
first ``T`` rows of ``P`` (forward) or the last ``T`` (reverse) of any longer sequence
and fails on a shorter one, so ``X`` is sliced to those rows unless its sequence axis is
statically ``T``. Outputs are equal on every input the original accepts.

Replacement: ``RNN(X, W, R, B, "", h_0, hidden_size=H, activations=[act],
direction=forward|reverse)`` with ``W = (W^T)^T``, ``R = (R^T)^T`` and ``B = [b_ih, b_hh]``
as new initializers; ``h_T`` becomes ``Y_h`` and the ``Concat`` becomes
``Squeeze(Y, [1])``. The now unused chain is removed by the cleanup passes.

Caveat: the stacked ``Concat`` is redirected while ``rewrite`` runs (the onnxscript
matcher cannot express a chain of unknown length as a multi-output pattern); a
``MatchingTracer`` calls ``rewrite`` without applying it, so do not trace this family.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array, opset_version, same_bits
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules._graph import producer, slice_params
from rnn_rewrite_rules.rules._kernels import missing_kernel
from rnn_rewrite_rules.rules.cell import recurrent_node
from rnn_rewrite_rules.rules.reroll._chain import (
    ChainRule,
    KeptUnrolled,
    cost_refusal,
    read_step,
    redirect,
    same_constant,
    static_size,
    walk_back,
    weight_array,
)
from rnn_rewrite_rules.shape import Dim, ShapeProver

__all__ = ["ACTIVATIONS", "RerollRnn", "plan_chain"]

ACTIVATIONS = ("Tanh", "Relu")


@dataclasses.dataclass
class _Step:
    """One ``h_t = act(Add(recurrent, x_t))``."""

    act: ir.Node
    source: ir.Value
    index: int
    #: ``h_{t-1}``; None when the first step's recurrent term is a folded constant.
    h_prev: ir.Value | None
    weight: ir.Value | None
    bias: ir.Value | None
    folded: np.ndarray | None
    #: values of the step that must have exactly one reader (the next op of the step).
    internal: tuple[ir.Value, ...]


def _parse_step(act: ir.Node) -> _Step | Refusal:
    """The step whose activation is ``act``, or why it is not one."""
    add = producer(act.inputs[0], "Add")
    if add is None or len(add.inputs) != 2:
        return Refusal(f"{act.op_type}'s input is not an Add of a recurrent term and a step input")
    for recurrent, step_input in (add.inputs, tuple(reversed(add.inputs))):
        read = read_step(step_input)
        if read is None:
            continue
        source, index = read
        assert step_input is not None and act.inputs[0] is not None  # read_step read it
        internal: list[ir.Value] = [act.inputs[0], step_input]
        folded = const_array(recurrent)
        if folded is not None:
            return _Step(act, source, index, None, None, None, folded, tuple(internal))
        bias = None
        matmul = producer(recurrent, "MatMul")
        biased = producer(recurrent, "Add")
        if biased is not None:
            for a, b in (biased.inputs, tuple(reversed(biased.inputs))):
                if (
                    a is not None
                    and recurrent is not None
                    and producer(a, "MatMul") is not None
                    and weight_array(b) is not None
                ):
                    matmul, bias = a.producer(), b
                    internal.append(recurrent)
                    break
            else:
                return Refusal(
                    "the recurrent term is an Add but not MatMul(h, R^T) + constant bias"
                )
        if matmul is None or len(matmul.inputs) != 2:
            return Refusal("the recurrent term is not MatMul(h, R^T) [+ b_hh]")
        internal.append(matmul.outputs[0])
        h_prev, weight = matmul.inputs
        return _Step(act, source, index, h_prev, weight, bias, None, tuple(internal))
    if any(producer(v, "SequenceAt") is not None for v in add.inputs):
        return Refusal(
            "the step input is a SequenceAt that does not read one row P[t] "
            "(SplitToSequence(P, axis=0, keepdims=0) without split, at a constant t >= 0)"
        )
    return Refusal("neither Add operand reads one step (Squeeze(Slice(P, [t], [t+1], [0]), [0]))")


@dataclasses.dataclass
class _Source:
    """``P' = [flip](MatMul(X, W^T) [+ b_ih])``."""

    x: ir.Value
    weight: np.ndarray
    bias: np.ndarray | None
    reverse: bool


def _parse_source(value: ir.Value) -> _Source | Refusal:
    reverse = False
    flip = producer(value, "Slice")
    if flip is not None:
        params = slice_params(flip)
        if params is None or params[2] != 0 or params[3] != -1:
            return Refusal("the step source is a Slice that is not a reversal of axis 0")
        start, end = params[:2]
        if start != -1 or end > -(2**31):
            return Refusal("the step source reverses only part of the sequence")
        if flip.inputs[0] is None:
            return Refusal("the step source reverses no sequence")
        value, reverse = flip.inputs[0], True
    bias = None
    projection = value
    add = producer(value, "Add")
    if add is not None:
        a, b = add.inputs
        if producer(a, "MatMul") is None:
            a, b = b, a
        bias = weight_array(b)
        if bias is None or a is None:
            return Refusal("the input projection's bias is not a constant")
        projection = a
    matmul = producer(projection, "MatMul")
    if matmul is None:
        return Refusal("the step source is not an input projection MatMul(X, W^T) [+ b_ih]")
    x, w = matmul.inputs
    weight = weight_array(w)
    if weight is None:
        return Refusal("the input weight W^T is not a constant")
    if x is None:
        return Refusal("the input projection has no X")
    return _Source(x, weight, bias, reverse)


def _batch_matches(prover: ShapeProver, h0: ir.Value, x: ir.Value, hidden: int) -> bool | None:
    """True: ``h0`` is provably ``[1, batch of x, H]``; False: provably ``[1, b, H]`` with
    ``b`` not provably X's batch (an ``h0`` graph input: ONNX does not enforce equal
    ``dim_param`` names); None: neither."""
    shape = prover.dims(h0)
    one, h = Dim.const(1), Dim.const(hidden)
    if shape is None or len(shape) != 3 or shape[0] != one or shape[2] != h:
        return None
    return shape[1] == prover.dim(x, 1)


@dataclasses.dataclass
class _Plan:
    steps: list[_Step]
    source: _Source
    recurrent: np.ndarray
    recurrent_bias: np.ndarray | None
    h0: ir.Value | None
    guard_batch: bool
    slice_x: bool
    concat: ir.Node | None
    activation: str


def _uses_outside(value: ir.Value, allowed: set[tuple[int, int]]) -> bool:
    return value.is_graph_output() or any(
        (id(node), index) not in allowed for node, index in value.uses()
    )


def _walk(root: ir.Node) -> list[_Step] | Refusal:
    """The chain ending at ``root``, first step first; step ``t`` reads index ``t``."""
    last = _parse_step(root)
    if isinstance(last, Refusal):
        return last

    def parse(node: ir.Node, _source: ir.Value) -> _Step | Refusal:
        if node.op_type != root.op_type:
            return Refusal(f"{node.op_type} is not the chain's {root.op_type}")
        return _parse_step(node)

    steps = walk_back(last, parse)
    for t, step in enumerate(steps):
        if step.index != t:
            return Refusal(f"step {t} reads index {step.index} of the sequence, not {t}")
        if step.folded is not None and t != 0:
            return Refusal(f"step {t}'s recurrent term is a constant")
    return steps


@dataclasses.dataclass
class _Recurrence:
    """``R^T [H, H]`` and ``b_hh [H]`` every step applies."""

    weight: np.ndarray
    bias: np.ndarray | None


def _recurrence(steps: list[_Step]) -> _Recurrence | Refusal:
    """The one recurrent weight and bias of the steps; a lone folded step (seq 1 from a
    zero state) never applies ``R``: zeros, and ``b_hh`` is the folded row."""
    weight_step = next((s for s in steps if s.weight is not None), None)
    if weight_step is None:
        folded = steps[0].folded
        assert folded is not None
        if folded.ndim != 3 or folded.shape[0] != 1:
            return Refusal(f"the folded first step has shape {list(folded.shape)}")
        bias = folded[0, 0] if folded.shape[1] else None
        return _Recurrence(np.zeros((folded.shape[2],) * 2, folded.dtype), bias)
    weight = weight_array(weight_step.weight)
    if weight is None:
        return Refusal("the recurrent weight R^T is not a constant")
    for t, step in enumerate(steps):
        if step.weight is None:
            continue
        if not same_constant(step.weight, weight_step.weight):
            return Refusal(
                f"step {t} uses other recurrent weights than step {steps.index(weight_step)}"
            )
        if (step.bias is None) != (weight_step.bias is None) or (
            step.bias is not None and not same_constant(step.bias, weight_step.bias)
        ):
            return Refusal(f"step {t} uses another recurrent bias")
    bias = None if weight_step.bias is None else weight_array(weight_step.bias)
    return _Recurrence(weight, bias)


def _shape_refusal(recurrence: _Recurrence, source: _Source) -> Refusal | None:
    """Why ``R^T``, ``W^T``, ``b_ih`` and ``b_hh`` are not one RNN's weights, if they are not."""
    recurrent = recurrence.weight
    hidden = recurrent.shape[-1] if recurrent.ndim == 2 else -1
    if recurrent.ndim != 2 or recurrent.shape[0] != hidden:
        return Refusal(f"R^T has shape {list(recurrent.shape)}, not [H, H]")
    if source.weight.ndim != 2 or source.weight.shape[1] != hidden:
        return Refusal(f"W^T has shape {list(source.weight.shape)}, not [I, {hidden}]")
    if source.bias is not None and source.bias.shape != (hidden,):
        return Refusal(f"b_ih has shape {list(source.bias.shape)}, not [{hidden}]")
    if recurrence.bias is not None and recurrence.bias.shape != (hidden,):
        return Refusal(f"b_hh has shape {list(recurrence.bias.shape)}, not [{hidden}]")
    dtypes = {recurrent.dtype, source.weight.dtype}
    dtypes |= {b.dtype for b in (source.bias, recurrence.bias) if b is not None}
    if len(dtypes) != 1 or next(iter(dtypes)) not in (np.float32, np.float64, np.float16):
        return Refusal(f"weights have element types {sorted(map(str, dtypes))}")
    return None


def _stack(steps: list[_Step], reverse: bool) -> ir.Node | Refusal | None:
    """The ``Concat`` of every ``h_t`` in processing (or reverse) order on axis 0, if any;
    why not when a step's value has another reader."""
    outputs = [s.act.outputs[0] for s in steps]
    stacked = outputs[::-1] if reverse else outputs
    concat = None
    for node, _ in outputs[0].uses():
        if node.op_type == "Concat" and node.domain == "" and list(node.inputs) == stacked:
            concat = node
            break
    if concat is not None and concat.attributes.get_int("axis", 0) not in (0, -3):
        return Refusal("the Concat of the steps is not on axis 0")
    allowed_concat = set() if concat is None else {(id(concat), i) for i in range(len(stacked))}
    for t, step in enumerate(steps):
        for value in step.internal:
            if len(value.uses()) != 1 or value.is_graph_output():
                return Refusal(f"an intermediate value of step {t} has another reader")
        if t + 1 < len(steps):
            readers = {(id(n), i) for n, i in outputs[t].uses() if n.op_type == "MatMul"}
            if _uses_outside(outputs[t], allowed_concat | readers) or len(readers) != 1:
                return Refusal(f"h_{t + 1} (step {t}) has a reader outside the chain")
    return concat


def _guard_batch(
    first: _Step, recurrence: _Recurrence, x: ir.Value, prover: ShapeProver
) -> bool | Refusal:
    """Whether ``h_0``'s batch is not proven X's (both are then expanded to the batch they
    broadcast to), or why ``h_0`` (or the folded first step) does not fit. Zero states
    stay: the initial_state family shares or drops them (by target)."""
    hidden = recurrence.weight.shape[0]
    if first.folded is None:
        assert first.h_prev is not None
        proof = _batch_matches(prover, first.h_prev, x, hidden)
        if proof is None:
            return Refusal("cannot prove h_0 is [1, batch, H]")
        return not proof
    bias = recurrence.bias
    expected = np.zeros(hidden, recurrence.weight.dtype) if bias is None else bias
    folded = first.folded
    if folded.ndim != 3 or folded.shape[0] != 1 or folded.shape[2] != hidden:
        return Refusal(f"the folded first step has shape {list(folded.shape)}, not [1, batch, H]")
    if not same_bits(folded, np.broadcast_to(expected, folded.shape)):
        return Refusal("the folded first step is not b_hh (a non-zero initial state)")
    if folded.shape[1] != 1 and static_size(prover, x, 1) != folded.shape[1]:
        return Refusal("the folded first step fixes a batch X does not provably have")
    return False


def plan_chain(root: ir.Node, main_graph: ir.Graph | None = None) -> _Plan | Refusal:
    """Prove that ``root`` ends an unrolled RNN chain and plan its replacement.

    ``main_graph``: the model's main graph (whose inputs' declared shapes are facts);
    None when ``root`` is in it."""
    steps = _walk(root)
    if isinstance(steps, Refusal):
        return steps
    recurrence = _recurrence(steps)
    if isinstance(recurrence, Refusal):
        return recurrence
    source = _parse_source(steps[-1].source)
    if isinstance(source, Refusal):
        return source
    reason = _shape_refusal(recurrence, source)
    if reason is not None:
        return reason
    prover = ShapeProver(root.graph if main_graph is None else main_graph)
    if prover.rank(source.x) != 3:
        return Refusal("X is not provably of rank 3")
    concat = _stack(steps, source.reverse)
    if isinstance(concat, Refusal):
        return concat
    guard_batch = _guard_batch(steps[0], recurrence, source.x, prover)
    if isinstance(guard_batch, Refusal):
        return guard_batch
    return _Plan(
        steps,
        source,
        recurrence.weight,
        recurrence.bias,
        steps[0].h_prev,
        guard_batch,
        static_size(prover, source.x, 0) != len(steps),
        concat,
        root.op_type,
    )


class RerollRnn(ChainRule[_Plan]):
    """h_T = act(... act(MatMul(h_0, R^T) + b + x_0) ...) -> Y_h of RNN(X, W, R, B, h_0)."""

    def __init__(self, activation: str, target: str = "portable") -> None:
        super().__init__(name=f"RerollRnn[{activation}]")
        self.activation = activation
        self.target = target

    def pattern(self, op, pre):
        return getattr(op, self.activation)(pre)

    def plan_chain(self, root: ir.Node, main_graph: ir.Graph) -> _Plan | Refusal:
        return plan_chain(root, main_graph)

    def refuse(self, context, plan: _Plan) -> Refusal | None:
        opset = opset_version(context.model, context.graph_or_function)
        if plan.guard_batch and isinstance(opset, int) and opset < 8:
            return Refusal(f"opset {opset} has no Expand (to broadcast h_0's batch)")
        if _feeds_step(plan.steps[-1].act.outputs[0]):
            return Refusal("h_T feeds another step: not the last step")
        return None

    def decline(self, context, plan: _Plan) -> KeptUnrolled | None:
        missing = missing_kernel("", "RNN", plan.recurrent.dtype, (self.target,))
        if missing is not None:  # the unrolled steps run there (portable: rten has no RNN)
            return KeptUnrolled(f"re-roll kept unrolled: {missing}")
        source = plan.source
        hidden, seq = int(plan.recurrent.shape[0]), len(plan.steps)
        return cost_refusal(
            context, self.target, "RNN", source.x, hidden, seq, source.reverse, plan.h0
        )

    def rewrite(self, op, pre: ir.Value, **_):
        plan, emit = self.plan, self.emitter(op)
        source, steps = plan.source, plan.steps
        hidden = plan.recurrent.shape[0]
        prefix = f"reroll_{steps[-1].act.name or 'rnn'}"
        w = emit.constant(source.weight.T[np.newaxis], f"{prefix}_W")
        r = emit.constant(plan.recurrent.T[np.newaxis], f"{prefix}_R")
        biases = (source.bias, plan.recurrent_bias)
        b = None
        if any(v is not None for v in biases):
            dtype = plan.recurrent.dtype
            parts = [np.zeros(hidden, dtype) if v is None else v for v in biases]
            b = emit.constant(np.concatenate(parts)[np.newaxis], f"{prefix}_B")
        x = source.x
        if plan.slice_x:
            x = emit.first_steps(x, len(steps), source.reverse)
        h0 = plan.h0
        if plan.guard_batch:
            assert h0 is not None
            one = emit.ints([1])
            x_batch = emit.slice(op.Shape(x), [1], [2], [0])
            h0 = op.Expand(h0, op.Concat(one, x_batch, one, axis=0))
            h_batch = emit.slice(op.Shape(h0), [1], [2], [0])
            x = op.Expand(x, op.Concat(one, h_batch, one, axis=0))
        y, y_h = recurrent_node(
            op,
            "RNN",
            [x, w, r, b, None, h0],
            hidden_size=int(hidden),
            reverse=source.reverse,
            activations=[plan.activation],
        )
        if plan.concat is not None:
            redirect(plan.concat.outputs[0], emit.squeeze(y, 1))
        return y_h


def _feeds_step(h: ir.Value) -> bool:
    """True when ``h`` is the ``h_{t-1}`` of a step (its MatMul is within three ops of an act)."""
    frontier = [n for n, i in h.uses() if n.op_type == "MatMul" and i == 0]
    for _ in range(3):
        following = []
        for node in frontier:
            for user, _ in node.outputs[0].uses() if node.outputs else ():
                if user.op_type in ACTIVATIONS and user.domain == "":
                    step = _parse_step(user)
                    if not isinstance(step, Refusal) and step.h_prev is h:
                        return True
                following.append(user)
        frontier = following
    return False
