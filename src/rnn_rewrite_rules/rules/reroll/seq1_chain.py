"""A chain of one-step ``GRU`` / ``RNN`` / ``LSTM`` nodes -> one node over the steps.

A seq2seq encoder that calls ``nn.GRU`` once per input step (torch dynamo and TorchScript
alike) writes one node per step, each reading the state the previous one wrote.

Pattern: nodes ``G_1 .. G_n`` (``n >= 2``) of one op where ``G_{k+1}``'s initial state
is ``G_k``'s final one (``Y_h``, and ``Y_c`` for LSTM), read directly or through
``Slice(Y_h, [0], [e >= 1], [0])`` (dynamo's ``h[0:1]``). Each ``X_k`` is ``[1, batch, I]``.

Condition, from the graph alone (a node that reads more than one step, or whose state is
no one-step node's, is not this rule's: it is left alone without a reason):

* the same op, attributes and inputs other than ``X`` and the states (``W``, ``R``, ``B``,
  peepholes: the same value, or constants with the same bits); no ``sequence_lens``;
  direction ``forward``, layout 0 (``X`` time-major);
* each ``X_k`` has a sequence axis the shape prover fixes to 1;
* no ``X_k`` depends on an output of the chain (the merged node reads every step first):
  the walk back from the last step stops before a node some later ``X`` depends on;
* every reader of a step's ``Y`` or state other than the chain itself comes after the
  last step (where the replacement is put), or the steps' ``Y`` are stacked in order by
  one ``Concat`` (see Replacement), whose per-step ``Squeeze`` / ``Transpose`` then die;
  an LSTM's intermediate ``Y_c`` has no other reader (the merged node gives only the last);
* the measured cost table of the form (``costs/seq1_chain.json``) says the merged node is
  no slower on the target than the nodes it replaces.

Why equal: a forward RNN over ``X_1 ++ ... ++ X_n`` from ``h_0`` runs step ``k`` from the
state step ``k-1`` left, the state ``G_k`` starts from; so its ``Y[k-1]`` is ``G_k``'s
``Y`` (one step), its ``Y[k-1]`` without the time axis is ``G_k``'s ``Y_h``, and its last
state is ``G_n``'s. The link ``Slice`` is the identity: ``Y_h`` has ``num_directions = 1``
rows. Where some ``X_k`` is empty (its source is shorter than the steps read) the
original runs a node over 0 steps, which fails (ONNX Runtime aborts, ``onnx.reference``
raises); the merged node may then run. Where the batches differ, the original fails on
the state's shape.

Replacement: ``X = Slice(S, [s], [s+n], [a])`` when the ``X_k`` are consecutive one-row
slices of one ``S`` (through one ``Transpose`` that puts ``a`` first), else
``Concat(X_1, ..., X_n, axis=0)``; the node with ``G_1``'s initial state; ``G_k``'s ``Y``
is ``Slice(Y, [k-1], [k], [0])``, its ``Y_h`` that without axis 0, the last ``Y_h``
and ``Y_c`` the node's. A ``Concat`` of ``Y_k``, of ``Squeeze(Y_k, [1])`` (axis 0) or of
``Transpose(Squeeze(Y_k, [1]), perm)`` (axis ``perm.index(0)``; a ``Reshape`` of ``Y_k``
to ``[-1, 1, H]`` is that with perm ``[1, 0, 2]``, to ``[1, -1, H]`` that ``Squeeze``) over
``k`` in order, as a run of its inputs, is the same expression of ``Y`` there.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRule

from rnn_rewrite_rules._compat import emit_node
from rnn_rewrite_rules._ir import input_at, opset_version, same_bits
from rnn_rewrite_rules._refusal import Inapplicable, Refusal
from rnn_rewrite_rules._rnn_ops import mark_replaces_batch_0_run, replaces_batch_0_run
from rnn_rewrite_rules.rules._forms import FormRule
from rnn_rewrite_rules.rules._graph import const_ints, producer, read_axes, slice_params
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, keep_identity
from rnn_rewrite_rules.rules.reroll._chain import (
    KeptUnrolled,
    _Emitter,
    accept,
    cost_refusal,
    redirect,
    same_constant,
)
from rnn_rewrite_rules.shape import Dim, ShapeProver

__all__ = ["FORM", "MergeSeq1Chain", "make_rules", "plan_seq1_chain"]

#: The cost table's form (``costs/seq1_chain.json``).
FORM = "seq1_chain"
#: op -> (initial-state input index, final-state output index) of each state.
_STATES = {"GRU": ((5, 1),), "RNN": ((5, 1),), "LSTM": ((5, 1), (6, 2))}
_OUTPUTS = {"GRU": 2, "RNN": 2, "LSTM": 3}


def _link(value: ir.Value | None) -> ir.Value | None:
    """The state ``value`` passes on: itself, or ``Y_h`` through ``Slice(Y_h, [0], [e>=1],
    [0])`` (the identity on a one-row axis) read only by the next step."""
    sliced = producer(value, "Slice")
    if sliced is None:
        return value
    params = slice_params(sliced)
    if params is None or params[0] != 0 or params[1] < 1 or params[2] != 0 or params[3] != 1:
        return value
    assert value is not None
    return sliced.inputs[0] if len(value.uses()) == 1 and not value.is_graph_output() else value


def _state_link(node: ir.Node, state: int) -> tuple[ir.Node, ir.Value] | None:
    """(the earlier node, its final state) when ``node``'s initial state ``state`` is one."""
    source = _link(input_at(node, state))
    earlier = None if source is None else source.producer()
    if earlier is None or earlier.op_type != node.op_type or earlier.domain != node.domain:
        return None
    out = dict(_STATES[node.op_type])[state]
    if out >= len(earlier.outputs) or earlier.outputs[out] is not source:
        return None
    return earlier, source


def _previous(node: ir.Node) -> ir.Node | None:
    """The node whose final states are every initial state of ``node``, if one is."""
    found = set()
    earlier = None
    for state, _ in _STATES[node.op_type]:
        link = _state_link(node, state)
        if link is None:
            return None
        earlier = link[0]
        found.add(id(earlier))
    return earlier if len(found) == 1 else None


def _one_row(node: ir.Node, prover: ShapeProver) -> bool:
    """``node`` reads an ``X`` of one row: proven by the shape prover, or :func:`_row_read`."""
    x = node.inputs[0]
    return x is not None and (prover.dim(x, 0) == Dim.const(1) or _row_read(x) is not None)


def _node_refusal(node: ir.Node) -> Refusal | None:
    """Why the one-step ``node`` is not a step the merged node can run, if it is not."""
    attrs = node.attributes
    if attrs.get_string("direction", "forward") != "forward":
        return Refusal(f"{node.op_type} '{node.name}' is not forward")
    if attrs.get_int("layout", 0) != 0:
        return Refusal(f"{node.op_type} '{node.name}' has layout 1")
    if input_at(node, 4) is not None:
        return Refusal(f"{node.op_type} '{node.name}' has sequence_lens")
    return None


def _row_read(x: ir.Value) -> tuple[ir.Value, int, int, list[int] | None] | None:
    """``(S, t, a, perm)`` when ``x = [Transpose(perm)](Slice(S, [t], [t+1], [a]))`` with
    ``t >= 0`` and ``perm[0] = a`` (or no Transpose and ``a = 0``): at most one row on
    axis 0, and exactly one wherever a node reading it runs (over 0 steps it fails)."""
    transpose = producer(x, "Transpose")
    perm = None
    if transpose is not None:
        attr = transpose.attributes.get("perm")
        if attr is None or transpose.inputs[0] is None:
            return None
        perm, x = list(attr.as_ints()), transpose.inputs[0]
    sliced = producer(x, "Slice")
    params = None if sliced is None else slice_params(sliced)
    if sliced is None or params is None or sliced.inputs[0] is None:
        return None
    start, end, axis, step = params
    if step != 1 or start < 0 or end != start + 1 or axis < 0:
        return None
    if (perm is None and axis != 0) or (perm is not None and perm[0] != axis):
        return None
    return sliced.inputs[0], start, axis, perm


def _same_step(a: ir.Node, b: ir.Node) -> Refusal | None:
    """Why ``a`` and ``b`` are not the same cell (attributes, weights), if they are not."""
    if set(a.attributes) != set(b.attributes) or any(
        not same_bits(a.attributes[k].value, b.attributes[k].value) for k in a.attributes
    ):
        return Refusal(f"'{a.name}' and '{b.name}' have other attributes")
    states = {i for i, _ in _STATES[a.op_type]}
    for index in range(1, max(len(a.inputs), len(b.inputs))):
        if index in states:
            continue
        x, y = input_at(a, index), input_at(b, index)
        if (x is None) != (y is None) or not same_constant(x, y):
            return Refusal(f"'{a.name}' and '{b.name}' read other weights (input {index})")
    return None


class _Ancestors:
    """The nodes the values added so far depend on (one walk over the graph in all)."""

    def __init__(self) -> None:
        self.nodes: set[int] = set()

    def add(self, value: ir.Value | None) -> None:
        stack = [value]
        while stack:
            node = None if (v := stack.pop()) is None else v.producer()
            if node is None or id(node) in self.nodes:
                continue
            self.nodes.add(id(node))
            stack.extend(node.inputs)


@dataclasses.dataclass
class _Plan:
    steps: list[ir.Node]
    #: the Concat of the steps' Y (through their Squeeze/Transpose), the first of its
    #: inputs they are, and its form
    stack: ir.Node | None
    stack_first: int
    stack_perm: list[int] | None
    squeezed: bool


def _walk(root: ir.Node, prover: ShapeProver) -> list[ir.Node] | Refusal:
    """The chain ending at ``root``, first step first. A node that reads no one-row ``X``,
    or whose state is not an earlier one-step node's, is not the rule's business
    (``Inapplicable``: every other GRU of every model)."""
    if not _one_row(root, prover):
        return Inapplicable("X is not one step")
    steps, ancestors = [root], _Ancestors()
    ancestors.add(root.inputs[0])
    while True:
        earlier = _previous(steps[-1])
        if earlier is None or not _one_row(earlier, prover):
            break
        reason = _node_refusal(earlier) or _node_refusal(root) or _same_step(earlier, root)
        if reason is None and id(earlier) in ancestors.nodes:
            reason = Refusal(f"a later step's X depends on an output of '{earlier.name}'")
        if reason is not None:
            if len(steps) == 1:
                return reason
            break
        steps.append(earlier)
        ancestors.add(earlier.inputs[0])
    if len(steps) == 1:
        return _changed_state(root, prover) or Inapplicable(
            "the initial state is not a one-step node's final state"
        )
    steps.reverse()
    return steps


def _changed_state(node: ir.Node, prover: ShapeProver) -> Refusal | None:
    """Why ``node`` does not continue the one-step node of its weights whose state its
    initial state computes from (an op between the two), if it reads such a state."""
    for state, _ in _STATES[node.op_type]:
        initial = input_at(node, state)
        between = None if initial is None else initial.producer()
        if between is None:
            continue
        for value in between.inputs:
            earlier = None if value is None else value.producer()
            if (
                earlier is not None
                and earlier.op_type == node.op_type
                and value in earlier.outputs[1:]
                and _one_row(earlier, prover)
                and _same_step(earlier, node) is None
            ):
                return Refusal(
                    f"the initial state of '{node.name}' is {between.op_type} of "
                    f"'{earlier.name}''s final state, not that state: the state changes "
                    "between the steps"
                )
    return None


def _stack(steps: list[ir.Node]) -> tuple[ir.Node, int, list[int] | None, bool] | None:
    """The Concat reading every step's ``Y`` in order as a run of its inputs, from input
    ``first`` on (directly on axis 0, or ``Squeeze(Y, [1])`` on axis 0, or a ``Transpose``
    of those on ``perm.index(0)``): (Concat, first, perm, squeezed)."""
    ends: list[ir.Value] = []
    forms = set()
    for step in steps:
        end = _step_end(step.outputs[0], step.attributes.get_int("hidden_size", 0))
        if end is None:
            return None
        ends.append(end[0])
        forms.add(end[1:])
    concat = _only_reader(ends[0])
    if concat is None:
        return None
    inputs = list(concat.inputs)
    if len(forms) != 1 or concat.op_type != "Concat" or concat.domain != "":
        return None
    first = inputs.index(ends[0])
    if inputs[first : first + len(ends)] != ends:
        return None
    squeezed, perm_t = forms.pop()
    perm = list(perm_t) or None
    axis = 0 if perm is None else perm.index(0) if 0 in perm else -1
    if concat.attributes.get_int("axis", 0) % (4 - squeezed) != axis:
        return None
    return concat, first, perm, squeezed


def _reshaped(node: ir.Node, hidden: int) -> tuple[int, ...] | None:
    """The ``perm`` of ``Transpose(Squeeze(Y, [1]), perm)`` that ``node``, a ``Reshape`` of a
    one-step ``Y [1, 1, b, H]`` to a constant ``[-1, 1, H]`` (``[b, 1, H]``: perm ``(1, 0,
    2)``) or ``[1, -1, H]`` (``Squeeze(Y, [1])``: no perm), is; None for other nodes."""
    if node.op_type != "Reshape" or node.domain != "":
        return None
    target = const_ints(input_at(node, 1))
    if target == [-1, 1, hidden]:
        return (1, 0, 2)
    return () if target == [1, -1, hidden] else None


def _only_reader(value: ir.Value) -> ir.Node | None:
    """The one node reading ``value``, when it has one reader and is no graph output."""
    readers = list(value.uses())
    if len(readers) != 1 or value.is_graph_output():
        return None
    return readers[0].node


def _step_end(y: ir.Value, hidden: int) -> tuple[ir.Value, bool, tuple[int, ...]] | None:
    """(v, squeezed, perm): ``v`` is ``y``, ``Squeeze(y, [1])`` or a ``Transpose`` of that
    (or a ``Reshape`` that is one of those, :func:`_reshaped`), each read once, ``v`` read
    once (by a Concat, checked by the caller)."""
    value, perm, squeezed = y, tuple[int, ...](), False
    reader = _only_reader(y)
    reshaped = None if reader is None else _reshaped(reader, hidden)
    if reader is not None and reshaped is not None:
        value, squeezed, perm = reader.outputs[0], True, reshaped
    elif reader is not None and reader.op_type == "Squeeze":
        if read_axes(reader) not in ([1], [-3]) or reader.domain != "":
            return None
        value, squeezed = reader.outputs[0], True
        transpose = _only_reader(value)
        if transpose is not None and transpose.op_type == "Transpose":
            attr = transpose.attributes.get("perm")
            if attr is None:
                return None
            value, perm = transpose.outputs[0], tuple(attr.as_ints())
    return (value, squeezed, perm) if _only_reader(value) is not None else None


def _readers_refusal(graph, plan: _Plan, root: ir.Node) -> Refusal | None:
    """Why a reader of a step's output would read the merged node before it exists."""
    chain = {id(n) for n in plan.steps}
    order = {id(n): i for i, n in enumerate(graph)}
    last = order[id(root)]
    for k, step in enumerate(plan.steps[:-1]):
        for index, value in enumerate(step.outputs):
            if index == 0 and plan.stack is not None:
                continue
            for user, _ in value.uses():
                if id(user) in chain or _link_to(user, chain):
                    continue
                if index == 2:
                    return Refusal(f"Y_c of step {k} ('{step.name}') has a reader")
                if user.graph is not graph or order.get(id(user), -1) < last:
                    return Refusal(f"a reader of step {k}'s output comes before the last step")
    return None


def _link_to(user: ir.Node, chain: set[int]) -> bool:
    """``user`` is a link Slice read only by a node of the chain."""
    if user.op_type != "Slice" or len(user.outputs) != 1:
        return False
    reader = _only_reader(user.outputs[0])
    return reader is not None and id(reader) in chain


def plan_seq1_chain(root: ir.Node, main_graph: ir.Graph | None = None) -> _Plan | Refusal:
    """Prove that ``root`` ends a chain of one-step nodes and plan the merged node."""
    if root.op_type not in _STATES or root.domain != "":
        return Inapplicable(f"{root.op_type} is not a GRU, RNN or LSTM")
    prover = ShapeProver(root.graph if main_graph is None else main_graph)
    steps = _walk(root, prover)
    if isinstance(steps, Refusal):
        return steps
    stacked = _stack(steps)
    stack, first, perm, squeezed = (None, 0, None, False) if stacked is None else stacked
    return _Plan(steps, stack, first, perm, squeezed)


def _feeds_next(node: ir.Node, prover: ShapeProver) -> bool:
    """``node``'s final state starts a later node the chain would take."""
    for value in node.outputs[1:2]:
        for user, _ in value.uses():
            following = [user] if user.op_type == node.op_type else []
            if user.op_type == "Slice":
                following = [u for u, _ in user.outputs[0].uses() if u.op_type == node.op_type]
            for later in following:
                walked = _walk(later, prover)
                if isinstance(walked, list) and node in walked:
                    return True
    return False


def _consecutive(xs: list[ir.Value]) -> tuple[ir.Value, int, int, list[int] | None] | None:
    """(S, s, axis, perm) when ``X_k`` is row ``s + k`` of one ``S`` (:func:`_row_read`)."""
    found = [_row_read(x) for x in xs]
    first = found[0]
    if first is None:
        return None
    source, start, axis, perm = first
    for k, item in enumerate(found):
        if item is None or item[0] is not source or item[1:] != (start + k, axis, perm):
            return None
    return first


class MergeSeq1Chain(RnnNodeRule):
    """``G_n(...G_1(X_1, h_0)...)``, one step each -> one node over ``X_1 .. X_n``."""

    plan: _Plan
    graph: ir.Graph | ir.Function
    opset: int

    def __init__(self, domain: str, op_type: str, num_outputs: int, target: str) -> None:
        super().__init__(domain, op_type, num_outputs)
        self.target = target

    def check_node(self, context: MatchContext, node: ir.Node) -> MatchResult:
        result = MatchResult()
        plan = plan_seq1_chain(node, context.model.graph)
        if isinstance(plan, Refusal):
            return result.fail(plan, node)
        if _feeds_next(node, ShapeProver(context.model.graph)):
            return result.fail(Inapplicable("Y_h starts the next step: not the last step"), node)
        reason = _readers_refusal(context.graph_or_function, plan, node)
        if reason is not None:
            return result.fail(reason, node)
        opset = opset_version(context.model, context.graph_or_function)
        if isinstance(opset, Refusal):
            return result.fail(opset, node)
        return accept(self, context, node, plan, opset, self._kept(context, plan))

    def _kept(self, context: MatchContext, plan: _Plan) -> KeptUnrolled | None:
        """Why the chain stays as written on the target (the form's measured cost table)."""
        first = plan.steps[0]
        x = first.inputs[0]
        assert x is not None  # _one_row proved it
        return cost_refusal(
            context,
            self.target,
            first.op_type,
            x,
            first.attributes.get_int("hidden_size", 0),
            len(plan.steps),
            False,
            input_at(first, 5),
            form=FORM,
            label="a chain of one-step nodes merged: ",
        )

    def rewrite(self, op, out0, **_):
        plan, steps = self.plan, self.plan.steps
        emit = _Emitter(op, self.graph, self.opset)
        first, last = steps[0], steps[-1]
        outputs = emit_node(
            op,
            first.op_type,
            _trimmed([_merged_x(op, emit, steps), *first.inputs[1:]]),
            first.attributes,
            domain=first.domain,
            num_outputs=_OUTPUTS[first.op_type],
        )
        keep_identity(outputs[0].producer(), last)
        if any(replaces_batch_0_run(step) for step in steps):
            mark_replaces_batch_0_run(outputs[0])
        y = outputs[0]
        if plan.stack is not None:
            stack = emit.squeeze(y, 1) if plan.squeezed else y
            if plan.stack_perm is not None:
                stack = op.Transpose(stack, perm=plan.stack_perm)
            self._restack(plan.stack, stack)
        chain = {id(s) for s in steps}
        for k, step in enumerate(steps[:-1]):
            y_k, h_k = step.outputs[0], step.outputs[1] if len(step.outputs) > 1 else None
            read_y = plan.stack is None and _read_outside(y_k, chain)
            read_h = h_k is not None and _read_outside(h_k, chain)
            if not (read_y or read_h):
                continue
            row = emit.slice(y, [k], [k + 1], [0])
            if read_y:
                redirect(y_k, row)
            if read_h:
                assert h_k is not None
                redirect(h_k, emit.squeeze(row, 0))
        y_last = emit.slice(y, [len(steps) - 1], [len(steps)], [0])
        return [y_last, *outputs[1 : self.num_outputs]]

    def _restack(self, concat: ir.Node, stack: ir.Value) -> None:
        """``stack`` (the steps' outputs concatenated on the Concat's axis) in place of the
        run of ``concat``'s inputs they are: ``concat`` is redirected to it when they are all
        its inputs, else it reads ``stack`` for the run (in place: its other inputs may come
        after the last step, where the replacement is put; ``concat`` comes after both)."""
        inputs, first, n = list(concat.inputs), self.plan.stack_first, len(self.plan.steps)
        if len(inputs) == n:
            redirect(concat.outputs[0], stack)
            return
        kept = [*inputs[:first], stack, *inputs[first + n :]]
        for index, value in enumerate(kept):
            concat.replace_input_with(index, value)
        concat.resize_inputs(len(kept))


def _read_outside(value: ir.Value, chain: set[int]) -> bool:
    """``value`` has a reader other than the chain and its link Slices."""
    return value.is_graph_output() or any(
        id(user) not in chain and not _link_to(user, chain) for user, _ in value.uses()
    )


def _merged_x(op, emit: _Emitter, steps: list[ir.Node]) -> ir.Value:
    """One ``Slice`` of consecutive rows read step by step, else the steps' Concat."""
    xs = [s.inputs[0] for s in steps]
    consecutive = _consecutive(xs)  # type: ignore[arg-type]  # proven present
    if consecutive is None:
        return op.Concat(*xs, axis=0)
    source, start, axis, perm = consecutive
    x = emit.slice(source, [start], [start + len(steps)], [axis])
    return x if perm is None else op.Transpose(x, perm=perm)


def _trimmed(inputs: list) -> list:
    while inputs and inputs[-1] is None:
        inputs.pop()
    return inputs


def make_rules(target: str = "portable") -> list[RewriteRule]:
    """One rule per op (``MergeSeq1Chain[OP]``), each output count a variant."""
    return [
        FormRule(
            f"MergeSeq1Chain[{op_type}]",
            [MergeSeq1Chain.rule("", op_type, n, target) for n in range(count, 1, -1)],
        )
        for op_type, count in _OUTPUTS.items()
    ]
