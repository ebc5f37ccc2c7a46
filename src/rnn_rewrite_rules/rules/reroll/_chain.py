"""What the two reroll rules share: reading a step's input and constant weights, walking
a chain of steps back from its last one, the check's tail and the rewrite's emission.

A rule (:class:`ChainRule`) plans the chain ending at the matched node; the plan is kept
for ``rewrite`` on the rule, which is built per rewrite call (``rules.select_rules``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRuleClassBase

from rnn_rewrite_rules import costs
from rnn_rewrite_rules._ir import const_array, opset_version, same_bits
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules._graph import (
    array_constant,
    cached_ints,
    producer,
    read_axes,
    slice_,
    slice_params,
    squeeze,
    unsqueeze,
)
from rnn_rewrite_rules.shape import ShapeProver
from rnn_rewrite_rules.shape.semantics import INT64_MAX
from rnn_rewrite_rules.shape.values import is_all_zeros

__all__ = [
    "ChainRule",
    "KeptUnrolled",
    "accept",
    "cost_refusal",
    "read_step",
    "redirect",
    "same_constant",
    "static_size",
    "walk_back",
    "weight_array",
]

#: ONNX's shape inference of Slice-10 (onnx 1.23) gives ``Slice(X, [0], [1])`` of a
#: dimension ``seq`` the size ``seq``; ONNX Runtime plans buffers by those shapes and puts a
#: re-rolled node's values of length ``seq`` in a one-step buffer ("Shape mismatch attempting
#: to re-use buffer"), where the unrolled original happened to run.
_SLICE_10 = Refusal(
    "opset 10: ONNX's Slice-10 shape inference sizes the steps' Slices wrongly, and ONNX "
    "Runtime reuses buffers by it"
)
_MAX_DEPTH = 24


def static_size(prover: ShapeProver, value: ir.Value, axis: int) -> int | None:
    """The size of ``axis`` of ``value`` when the shape prover fixes it to a number."""
    dim = prover.dim(value, axis)
    return None if dim is None else dim.value


def read_step(value: ir.Value | None) -> tuple[ir.Value, int] | None:
    """``(P, t)`` when ``value`` is ``P[t]`` read on axis 0 with a constant ``t >= 0``:
    ``Squeeze(Slice(P, [t], [t+1], [0]), [0])``, ``SequenceAt(S, t)`` of
    ``S = SplitToSequence(P, axis=0, keepdims=0)`` (torch 2.13's ``unbind``), or
    ``Squeeze(Split(P, axis=0)[k], [0])`` (tf2onnx's ``tf.unstack``, see
    :func:`_split_row`)."""
    at = _sequence_at(value)
    if at is not None:
        return at
    squeezed = producer(value, "Squeeze")
    if squeezed is None or read_axes(squeezed) != [0]:
        return None
    split = _split_row(squeezed.inputs[0])
    if split is not None:
        return split
    sliced = producer(squeezed.inputs[0], "Slice")
    params = None if sliced is None else slice_params(sliced)
    if params is None:
        return None
    start, end, axis, step = params
    if axis != 0 or step != 1 or start < 0 or end != start + 1 or sliced.inputs[0] is None:  # type: ignore[union-attr]
        return None
    return sliced.inputs[0], start  # type: ignore[union-attr]


def _split_row(value: ir.Value | None) -> tuple[ir.Value, int] | None:
    """``(P, t)`` when ``value`` is output ``k`` of ``Split(P, axis=0)`` read by a
    ``Squeeze`` of axis 0 (the caller's), which runs only on a part of one row.

    With constant sizes ``s``, part ``k`` is rows ``[t, t + s[k])`` for ``t = sum(s[:k])``
    (the Split fails unless the sizes cover ``P``'s axis): with ``s[k] = 1``, ``P[t]``.
    Without sizes before opset 18, ``n`` outputs are ``n`` equal parts (the Split fails
    unless ``n`` divides ``N``): one row each only where ``N = n``, so part ``k`` is
    ``P[k]``. With ``num_outputs`` (opset 18) every part but the last has ``ceil(N / n)``
    rows, one only where ``N <= n``, so part ``k < n - 1`` is ``P[k]``; the last part
    ends at row ``N`` whatever ``N`` is (``[2, 2, 1]`` at ``N = 5``), so it is ``P[n - 1]``
    only beside a Squeeze of axis 0 of another part in the same graph (tf2onnx's
    ``unstack`` of every step at opset 18): that one runs only where ``N <= n``, and the
    last part has one row there only where ``N = n``. Negative axes are left alone (the
    rank is not read here)."""
    split = producer(value, "Split")
    if split is None or split.attributes.get_int("axis", 0) != 0 or value is None:
        return None
    data, k = split.inputs[0], value.index()
    if data is None or k is None:
        return None
    if len(split.inputs) > 1 and split.inputs[1] is not None:
        array = const_array(split.inputs[1])
        sizes = None if array is None else [int(v) for v in array.reshape(-1)]
    elif split.attributes.get("split") is not None:
        sizes = list(split.attributes["split"].as_ints())
    elif split.attributes.get("num_outputs") is not None and k == len(split.outputs) - 1:
        return (data, k) if _another_row_squeezed(split, value) else None
    else:
        return data, k
    if sizes is None or len(sizes) != len(split.outputs) or sizes[k] != 1:
        return None
    if any(size < 0 for size in sizes):
        return None
    return data, sum(sizes[:k])


def _another_row_squeezed(split: ir.Node, last: ir.Value) -> bool:
    """Another output of ``split`` is read by a ``Squeeze`` of axis 0 in ``split``'s own
    graph whose output is read (so it runs wherever ``last`` is read)."""
    graph = split.graph
    for output in split.outputs:
        if output is last:
            continue
        for user, _ in output.uses():
            if (user.domain, user.op_type) != ("", "Squeeze") or user.graph is not graph:
                continue
            if read_axes(user) != [0]:
                continue
            if user.outputs[0].uses() or user.outputs[0].is_graph_output():
                return True
    return False


def _sequence_at(value: ir.Value | None) -> tuple[ir.Value, int] | None:
    """``(P, t)`` when ``value`` is ``SequenceAt(SplitToSequence(P, axis=0, keepdims=0), t)``.

    Without ``split``, ``SplitToSequence`` cuts ``P`` into ``P.shape[0]`` chunks of one row
    and ``keepdims=0`` drops the axis, so position ``t >= 0`` is ``P[t]``; past the end both
    this and the ``Squeeze(Slice)`` spelling fail. A negative ``t`` counts from the end (a
    position that depends on the length): not a step read. Axis ``-rank`` is left alone
    (the rank is not read here)."""
    at = producer(value, "SequenceAt")
    if at is None or len(at.inputs) != 2:
        return None
    split = producer(at.inputs[0], "SplitToSequence")
    if split is None or len(split.inputs) != 1 or split.inputs[0] is None:
        return None
    attrs = split.attributes
    if attrs.get_int("axis", 0) != 0 or attrs.get_int("keepdims", 1) != 0:
        return None
    position = const_array(at.inputs[1])
    if position is None or position.shape != () or position.dtype.kind != "i":
        return None
    t = int(position)
    return None if t < 0 else (split.inputs[0], t)


def weight_array(value: ir.Value | None) -> np.ndarray | None:
    """A constant, through ``Identity`` (TorchScript shares an initializer that way) and a
    2-D ``Transpose`` (torch leaves ``W^T`` unfolded above onnxscript's folding limit)."""
    for _ in range(_MAX_DEPTH):
        identity = producer(value, "Identity")
        if identity is None:
            break
        value = identity.inputs[0]
    array = const_array(value)
    if array is not None or value is None:
        return array
    node = producer(value, "Transpose")
    if node is None:
        return None
    inner = weight_array(node.inputs[0])
    perm = node.attributes.get("perm")
    if inner is None or inner.ndim != 2 or (perm is not None and list(perm.as_ints()) != [1, 0]):
        return None
    return inner.T


def same_constant(a: ir.Value | None, b: ir.Value | None) -> bool:
    if a is b:
        return True
    if a is None or b is None:
        return False
    x, y = weight_array(a), weight_array(b)
    return x is not None and y is not None and same_bits(x, y)


class Step(Protocol):
    """What the walk reads of a step: the state it reads and the sequence it indexes."""

    @property
    def h_prev(self) -> ir.Value | None: ...

    @property
    def source(self) -> ir.Value: ...


S = TypeVar("S", bound=Step)


def walk_back(last: S, parse: Callable[[ir.Node, ir.Value], S | Refusal]) -> list[S]:
    """The chain ending at ``last``, first step first: each earlier step is what
    ``parse(node, source)`` reads at the default-domain producer of the next one's
    ``h_prev``, with the same ``source``. A graph has no cycles, so the walk ends."""
    steps = [last]
    while steps[-1].h_prev is not None:
        node = steps[-1].h_prev.producer()
        if node is None or node.domain != "":
            break
        previous = parse(node, last.source)
        if isinstance(previous, Refusal) or previous.source is not last.source:
            break
        steps.append(previous)
    steps.reverse()
    return steps


def redirect(old: ir.Value, new: ir.Value) -> None:
    """Point every reader of ``old`` (graph outputs too) at ``new``, which takes its name."""
    new.type = old.type if old.type is not None else new.type
    new.shape = old.shape if old.shape is not None else new.shape
    name = old.name
    old.name = None if name is None else f"{name}__unrolled"
    new.name = name
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)


class KeptUnrolled(Refusal):
    """A proven chain left unrolled for the target: recorded (``costs.Context.declined``) so a
    report can say that a recurrence was found, and why it stays."""

    __slots__ = ()


def cost_refusal(
    context,
    target: str,
    op_type: str,
    x: ir.Value,
    hidden: int,
    seq: int,
    reverse: bool,
    h0: ir.Value | None,
    batch_axis: int = 1,
    *,
    form: str | None = None,
    label: str = "",
) -> KeptUnrolled | None:
    """None when re-rolling into ``op_type`` is no slower on ``target`` by the measured
    cost table (:mod:`rnn_rewrite_rules.costs`), else why the chain stays unrolled.

    The batch is ``X``'s ``batch_axis`` when the shape prover fixes it (else every measured
    batch must agree); the form is ``form`` when given (one with a table of its own,
    ``costs.FORM_TABLES``; ``label`` names it in the reason), else the initial state's form,
    what the targets leave of ``h0``: none where it is absent or zeros that are dropped
    (target ``onnxruntime``, or a static batch), else an explicit state."""
    batch = static_size(ShapeProver(context.model.graph), x, batch_axis)
    if form is None:
        dropped = h0 is None or (
            is_all_zeros(h0) and (target == "onnxruntime" or batch is not None)
        )
        form = "none" if dropped else "zeros"
    direction = "reverse" if reverse else "forward"
    decision = costs.of(context.model).no_slower(
        target, op_type, hidden, seq, batch, direction, form
    )
    if decision.fires:
        return None
    return KeptUnrolled(f"re-roll kept unrolled: {label}{decision.reason}")


P = TypeVar("P")


class _Accepting(Protocol):
    """A chain rule: it keeps what its check proved for its rewrite."""

    plan: Any
    graph: ir.Graph | ir.Function
    opset: int

    @property
    def name(self) -> str | None: ...


def accept(
    rule: _Accepting,
    context: MatchContext,
    root: ir.Node,
    plan: object,
    opset: int,
    kept: KeptUnrolled | None,
) -> MatchResult:
    """A chain rule's check, last: a chain ``kept`` unrolled on the target is recorded
    (``costs.Context.declined``) and refused at ``root``; else ``rule`` keeps the plan, the
    graph and the opset for its rewrite."""
    if kept is not None:
        costs.of(context.model).decline(str(rule.name), root.name or root.op_type, kept)
        return MatchResult().fail(kept, root)
    rule.plan, rule.graph, rule.opset = plan, context.graph_or_function, opset
    return MatchResult()


class ChainRule(RewriteRuleClassBase, Generic[P]):
    """A rule rooted at the last step of a chain: ``plan`` proves the chain, ``refuse``
    adds the rule's own conditions on the plan, the check's tail (the opset the
    replacement is emitted in) is shared, and ``decline`` says last whether the target
    keeps the chain unrolled (recorded); ``rewrite`` reads :attr:`plan`.
    """

    plan: P
    graph: ir.Graph | ir.Function
    opset: int

    def plan_chain(self, root: ir.Node, main_graph: ir.Graph) -> P | Refusal:
        """The plan of the chain ending at ``root`` (``main_graph``: the model's, whose
        inputs' declared shapes are facts), or why there is none."""
        raise NotImplementedError

    def refuse(self, context, plan: P) -> Refusal | None:
        """Why the rule does not apply to a proven chain (None: it does)."""
        return None

    def decline(self, context, plan: P) -> KeptUnrolled | None:
        """Why a chain the rule could replace stays unrolled on its target (cost, or what a
        runtime lacks), checked last; None: it is replaced."""
        return None

    def check(self, op, *args, **kwargs) -> MatchResult:
        context = op  # onnxscript passes the match context in its base class's ``op``
        check_result = MatchResult()
        root = context.root
        plan = self.plan_chain(root, context.model.graph)
        if isinstance(plan, Refusal):
            return check_result.fail(plan, root)
        reason = self.refuse(context, plan)
        if reason is not None:
            return check_result.fail(reason, root)
        opset = opset_version(context.model, context.graph_or_function)
        if isinstance(opset, Refusal):
            return check_result.fail(opset, root)
        if opset == 10 and any(n.op_type == "Slice" for n in context.graph_or_function):
            return check_result.fail(_SLICE_10, root)
        return accept(self, context, root, plan, opset, self.decline(context, plan))

    def emitter(self, op) -> _Emitter:
        """The rewrite's emission helpers (one int64 cache per rewrite)."""
        return _Emitter(op, self.graph, self.opset)


class _Emitter:
    """Constants, Slice and Squeeze/Unsqueeze of one rewrite, in the graph's opset form."""

    def __init__(self, op, graph: ir.Graph | ir.Function, opset: int) -> None:
        self.op, self.graph, self.opset = op, graph, opset
        self._cache: dict[tuple[int, ...], ir.Value] = {}

    def ints(self, values: list[int]) -> ir.Value:
        return cached_ints(self.op, self.graph, self._cache, values)

    def constant(self, array: np.ndarray, name: str) -> ir.Value:
        return array_constant(self.op, self.graph, array, name)

    def squeeze(self, value: ir.Value, axis: int) -> ir.Value:
        return squeeze(self.op, value, [axis], self.opset, self.ints)

    def unsqueeze(self, value: ir.Value | None, axis: int) -> ir.Value | None:
        return None if value is None else unsqueeze(self.op, value, [axis], self.opset, self.ints)

    def slice(
        self, value: ir.Value, starts: list[int], ends: list[int], axes: list[int]
    ) -> ir.Value:
        return slice_(self.op, value, starts, ends, axes, self.opset, self.ints)

    def zeros(self, x: ir.Value, axis: int, hidden: int, dtype: np.dtype) -> ir.Value:
        """``[batch, hidden]`` zeros of ``dtype``, ``batch`` the size of ``x``'s ``axis``
        (``ConstantOfShape``: opset >= 9)."""
        batch = self.slice(self.op.Shape(x), [axis], [axis + 1], [0])
        shape = self.op.Concat(batch, self.ints([hidden]), axis=0)
        return self.op.ConstantOfShape(shape, value=ir.tensor(np.zeros(1, dtype)))

    def first_steps(self, x: ir.Value, count: int, reverse: bool, axis: int = 0) -> ir.Value:
        """The first ``count`` entries of ``x`` on ``axis`` (the last ``count`` when
        ``reverse``)."""
        starts, ends = ([-count], [INT64_MAX]) if reverse else ([0], [count])
        return self.slice(x, starts, ends, [axis])
