"""One streaming step written as plain ops -> one ``LSTM`` / ``GRU`` / ``RNN`` node.

A streaming model (voice activity detection, wake words, speech enhancement) runs one frame
per call and passes its recurrent state in and out: ``nn.LSTMCell`` / ``nn.GRUCell`` called
once, or the cell written by hand (``Gemm -> Split -> Sigmoid x3, Tanh x2``).

Pattern: ``h_t`` computed by one step of a cell (the root: ``Mul(o, h(c_t))`` for an LSTM,
the ``Add`` of the update for a GRU, the activation for an RNN) from a step input ``x_t``
and states ``h_(t-1)`` (and ``c_(t-1)``) read from the main graph's inputs, directly or
through view ops (``Split``, ``Gather``, ``Slice``, ``Squeeze``, ``Reshape``, ``Identity``
with constant operands: a ``cache_in`` split per layer).

Condition: :func:`~rnn_rewrite_rules.rules.cell.prove_cell` (the one cell prover) proves
the step from the graph alone: weights, gate order, activations and
``linear_before_reset`` are read from what the ops do. ``x_t`` and the states are
provably of rank 2, the states ``[batch, H]`` (``h``'s width implied where ``MatMul(h, R)``
reads it), the batches proven equal or broadcast as the ops broadcast them
(``rules._broadcast``). A batch is proven ``x_t``'s by the shape prover or by a node of the
step that every replaced value (``h_t``, ``c_t``) is computed from and that runs only when
the two are equal (``shape.consumers``: ``Concat(x_t, h_(t-1))`` on the feature axis, as the
VAD decoders write the gates); ``h_t`` does not feed another step as its state (an unrolled
chain is ``reroll``'s); every value inside the step but ``h_t`` and ``c_t`` is read only
inside it; a reader of ``c_t`` outside the step comes after the root; the replacement is
no larger than the step (the broadcast of batches not proven equal adds 8 nodes, 12 with
``c``, 6 when only ``c``'s is unproven (7 before opset 15); the batch-0 guard of an LSTM
or GRU whose batch is not a number >= 1 adds 4, 5 with ``c_t`` read: an LSTM step of
12-15 nodes reading ``x_t`` and ``h_(t-1)`` separately stays, as does a 14-node GRU step
of a symbolic batch per input). The node's element
type has a kernel on every runtime of the target (``portable``: no ``RNN``, rten has
none), and the measured one-step table of its form (``costs/one_step.json``: a static
batch; ``one_step_guarded.json``: behind the guard; ``one_step_broadcast.json``: the
broadcast and the guard) says the node is no slower per call there. A cell the prover
refuses (peepholes, a clip, an activation with parameters: what one node cannot say) is
left alone, with the prover's reason.

Replacement: ``Y_h[, Y_c] = OP(Unsqueeze(x_t, 0), W, R, B, , Unsqueeze(h_(t-1), 0)[,
Unsqueeze(c_(t-1), 0)])`` (activations written where not the op's default) with
``h_t = Squeeze(Y_h, 0)`` and ``c_t = Squeeze(Y_c, 0)``; an LSTM/GRU node whose batch is
not a number >= 1 is marked for ``passes.BatchZeroGuardPass``, which puts it in
``If(Size(X) == 0)`` after the rules.

Equality: one step of the node computes the step's formula with the same weights, in the
same element type; a batch of 0 gives empty outputs both ways (ONNX Runtime 1.32 aborts
the process on an LSTM/GRU node at batch 0, where the step's ops run: the guard's batch-0
branch gives the states' empty ``[1, 0, H]`` initial values there instead). A batch
proven by a node of the step holds on every run that computes a value the rewrite
replaces: the step is in the main graph (not an ``If`` branch or a loop
body), and a runtime that prunes the node prunes those values too. Where the batches
differ the original fails, and the rewrite may do anything (ONNX Runtime's ``Concat`` runs
with one input empty, its output's other columns uninitialised: not a defined output).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules import costs
from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Inapplicable, Refusal
from rnn_rewrite_rules._rnn_ops import mark_replaces_batch_0_run
from rnn_rewrite_rules.rules._broadcast import (
    broadcast_batches,
    broadcast_cell_state,
    broadcast_opset_reason,
    broadcast_state_nodes,
)
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._forms import FormRule
from rnn_rewrite_rules.rules._graph import producer
from rnn_rewrite_rules.rules._kernels import missing_kernel, other_activations
from rnn_rewrite_rules.rules.cell import (
    EMPTY_INPUT_REASON,
    Cell,
    Constants,
    nodes_computing_every,
    prove_cell,
    recurrent_node,
    step_nodes,
    through_identity,
)
from rnn_rewrite_rules.rules.reroll._chain import ChainRule, KeptUnrolled, redirect
from rnn_rewrite_rules.shape import Dim, ShapeProver
from rnn_rewrite_rules.shape.consumers import SizeEquality, required_equal

__all__ = ["FAMILY", "FORM", "FORM_BROADCAST", "FORM_GUARDED", "OneStepCell", "make_rules"]

#: The cost-table forms of this rewrite (``costs.FORM_TABLES``): the node alone (the
#: batches of ``x_t`` and the states proven equal), and with the ``Expand``s that
#: broadcast them (not proven equal: ONNX does not tie equal ``dim_param`` names).
FORM = "one_step"
FORM_BROADCAST = "one_step_broadcast"
#: The node alone behind its batch-0 guard: batches proven equal, not a number >= 1.
FORM_GUARDED = "one_step_guarded"
#: Why a node of a symbolic batch is guarded (``passes.BatchZeroGuardPass``).
_GUARD_REASON = "the batch may be 0, where ONNX Runtime aborts on an LSTM or GRU node"
#: Ops that only view a state input (with constant other operands).
_VIEWS = frozenset({"Split", "Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Identity"})
_ACTIVATIONS = ("Tanh", "Sigmoid", "Relu")
#: How far above the root a state input is looked for (the ops of one step).
_DEPTH = 12
#: At most this many values above the root are looked at (a step reads a few dozen).
_MAX_VALUES = 256
#: How far below ``h_t`` a step reading it as its state is looked for.
_DOWNSTREAM = 8
#: Whose batch is not proven ``x_t``'s: None (all proven), ``"c"`` (``c_(t-1)``'s only:
#: ``h_(t-1)``'s is) or ``"all"`` (``h_(t-1)``'s).
Broadcast = Literal["c", "all"] | None


class _Plan:
    """A proven step: the cell, its states and the values the rewrite reads."""

    def __init__(
        self,
        cell: Cell,
        h_prev: ir.Value,
        c_prev: ir.Value | None,
        h: ir.Value,
        c: ir.Value | None,
        nodes: set[ir.Node],
        broadcast: Broadcast,
        batch: int | None,
    ) -> None:
        self.cell, self.h_prev, self.c_prev, self.h, self.c = cell, h_prev, c_prev, h, c
        self.nodes, self.broadcast, self.batch = nodes, broadcast, batch

    @property
    def guarded(self) -> bool:
        """Whether the node goes behind the batch-0 guard (``passes.BatchZeroGuardPass``):
        an LSTM/GRU whose batch is not a number >= 1."""
        return self.cell.op_type != "RNN" and (self.batch is None or self.batch < 1)

    @property
    def c_read(self) -> bool:
        """Whether ``c_t`` is read outside the step (the node's ``Y_c`` replaces it)."""
        c = self.c
        return c is not None and (
            c.is_graph_output() or any(u not in self.nodes for u, _ in c.uses())
        )


def _state_source(value: ir.Value, graph: ir.Graph, constants: Constants) -> bool:
    """``value`` is a main-graph input or a view of one (other operands constant)."""
    for _ in range(_DEPTH):
        if value in graph.inputs:
            return True
        node = value.producer()
        if node is None or node.domain != "" or node.op_type not in _VIEWS:
            return False
        if any(v is not None and constants(v) is None for v in node.inputs[1:]):
            return False
        if node.inputs[0] is None:
            return False
        value = node.inputs[0]
    return False


def _candidates(root: ir.Node, graph: ir.Graph, constants: Constants) -> list[ir.Value]:
    """State sources read within :data:`_DEPTH` nodes above ``root``, nearest first."""
    found: list[ir.Value] = []
    seen: set[ir.Value] = set()
    frontier = [root]
    for _ in range(_DEPTH):
        if len(seen) > _MAX_VALUES:
            break
        following: list[ir.Node] = []
        for node in frontier:
            for value in node.inputs:
                if value is None or value in seen:
                    continue
                seen.add(value)
                if constants(value) is not None:
                    continue
                if _state_source(value, graph, constants):
                    found.append(value)
                source = value.producer()
                if source is not None and value not in graph.inputs:
                    following.append(source)
        frontier = following
    return found


def _cell_state(h: ir.Value) -> Iterator[ir.Value]:
    """Candidates for ``c_t`` of ``h_t = Mul(o, act(c_t))``: ``c_t`` an Add of two Muls."""
    node = producer(h, "Mul")
    for operand in () if node is None else node.inputs:
        activation = producer(operand, *_ACTIVATIONS)
        if activation is None or activation.inputs[0] is None:
            continue
        c = through_identity(activation.inputs[0])
        add = producer(c, "Add")
        if add is not None and all(producer(v, "Mul") for v in add.inputs):
            yield c


def _looks_like(op_type: str, root: ir.Node) -> bool:
    """The root has the shape of the op's ``h_t`` (a refusal past this is reported)."""
    if op_type == "LSTM":
        return any(True for _ in _cell_state(root.outputs[0]))
    if op_type == "GRU":
        for operand in root.inputs:
            mul = producer(operand, "Mul")
            if mul is not None and any(producer(v, "Sub") for v in mul.inputs):
                return True
    return False


def _clipped_state(root: ir.Node) -> Refusal | None:
    """Why an LSTM step whose cell state is clipped (``h = o * tanh(Clip(c))``) is not one
    node: ONNX's ``clip`` bounds the gates' pre-activations, not the cell state."""
    for operand in root.inputs if root.op_type == "Mul" else ():
        activation = producer(operand, *_ACTIVATIONS)
        clip = None if activation is None else producer(activation.inputs[0], "Clip")
        if clip is not None:
            return Refusal(
                f"{clip.name} clips the cell state: the node's clip bounds the gates' "
                "pre-activations, not c_t"
            )
    return None


def _plausible(op_type: str, root: ir.Node) -> bool:
    """The root has the local shape of the op's ``h_t`` (checked before any walk)."""
    if op_type == "RNN":
        return producer(root.inputs[0], "Add", "Gemm", "MatMul") is not None
    if op_type == "LSTM":
        node = root
        return any(producer(v, *_ACTIVATIONS) for v in node.inputs)
    return _looks_like(op_type, root)


_Proof = tuple[Cell, ir.Value, ir.Value | None, ir.Value | None]


def _proofs(
    op_type: str, h: ir.Value, sources: list[ir.Value], constants: Constants
) -> Iterator[_Proof | Refusal]:
    """Each reading of ``h`` as one step of ``op_type`` over states among ``sources``:
    (cell, h_(t-1), c_(t-1), c_t), or the prover's reason for a reading that fails."""
    for h_prev in sources:
        if op_type != "LSTM":
            found = prove_cell([(h_prev, h)], constants)
            if isinstance(found, Refusal) or found[0].op_type == op_type:
                yield found if isinstance(found, Refusal) else (found[0], h_prev, None, None)
            continue
        for c in _cell_state(h):
            for c_prev in sources:
                if c_prev is not h_prev:
                    pair = prove_cell([(h_prev, h), (c_prev, c)], constants)
                    if isinstance(pair, Refusal):
                        yield pair
                    elif pair[1] == (0, 1):
                        yield pair[0], h_prev, c_prev, c


def _feeds_a_step(op_type: str, value: ir.Value, constants: Constants) -> bool:
    """A step of ``op_type`` within :data:`_DOWNSTREAM` nodes below ``value`` reads it as
    its state (an unrolled chain's first step)."""
    frontier = [user for user, _ in value.uses()]
    seen: set[ir.Node] = set()
    for _ in range(_DOWNSTREAM):
        following: list[ir.Node] = []
        for node in frontier:
            if node in seen:
                continue
            seen.add(node)
            out = node.outputs[0] if node.outputs else None
            if out is not None and node.op_type in ("Mul", "Add", *_ACTIVATIONS):
                sources = [value] + [
                    c_prev
                    for c in _cell_state(out)
                    for mul in (producer(v, "Mul") for v in c.producer().inputs)  # type: ignore[union-attr]
                    for c_prev in (() if mul is None else mul.inputs)
                    if c_prev is not None and c_prev is not value
                ]
                for found in _proofs(op_type, out, sources, constants):
                    if not isinstance(found, Refusal) and found[1] is value:
                        return True
            following += [user for v in node.outputs for user, _ in v.uses()]
        frontier = following
    return False


def _named(c: ir.Value) -> ir.Value:
    """``c_t`` as the step reads it: through the ``Identity`` nodes that are its only
    reader (paddle2onnx's ``fetch_name_1 = Identity(c_t)``, a graph output that
    normalisation keeps, is the value the step's ``Tanh`` reads)."""
    for _ in range(_DEPTH):
        uses = list(c.uses())
        if c.is_graph_output() or len(uses) != 1:
            break
        user = uses[0][0]
        if user.op_type != "Identity" or user.domain != "" or len(user.outputs) != 1:
            break
        c = user.outputs[0]
    return c


def _larger_cell(root: ir.Node, graph: ir.Graph, constants: Constants) -> str | None:
    """The op (``LSTM``/``GRU``) of a proven step, within :data:`_DOWNSTREAM` nodes below
    ``root``, whose nodes include ``root`` (an LSTM's gate ``tanh(x W + h R + b)`` reads
    like an RNN step), else None."""
    frontier = [user for v in root.outputs for user, _ in v.uses()]
    seen: set[ir.Node] = set()
    for _ in range(_DOWNSTREAM):
        following: list[ir.Node] = []
        for node in frontier:
            if node in seen or node.graph is not graph:
                continue
            seen.add(node)
            for op_type in ("LSTM", "GRU"):
                if not _plausible(op_type, node) or not node.outputs:
                    continue
                sources = _candidates(node, graph, constants)
                for found in _proofs(op_type, node.outputs[0], sources, constants):
                    if isinstance(found, Refusal):
                        continue
                    cell, h_prev, c_prev, c = found
                    ends = [node.outputs[0]] + ([] if c is None else [c])
                    stops = {cell.x, h_prev} | ({c_prev} if c_prev is not None else set())
                    if root in step_nodes(ends, stops, constants):
                        return op_type
            following += [user for v in node.outputs for user, _ in v.uses()]
        frontier = following
    return None


def _inside_only(
    nodes: set[ir.Node], ends: list[ir.Value], root: ir.Node, graph: ir.Graph
) -> Refusal | None:
    """Why the step's values are not the step's alone, or a reader of ``c_t`` comes early."""
    for node in nodes:
        for value in node.outputs:
            if value in ends:
                continue
            if value.is_graph_output():
                return Refusal(f"a value inside the step ({value.name}) is a graph output")
            for user, _ in value.uses():
                if user not in nodes:
                    return Refusal(
                        f"a value inside the step ({value.name}) is read outside it ({user.name})"
                    )
    outside = {user for end in ends[1:] for user, _ in end.uses() if user not in nodes}
    if any(user.graph is not graph for user in outside):
        return Refusal("c_t is read inside a subgraph")
    for node in graph:
        if node is root:
            break
        if node in outside:
            return Refusal(f"{node.name} reads c_t before the step's h_t is computed")
    return None


def _shapes(
    prover: ShapeProver,
    cell: Cell,
    h_prev: ir.Value,
    c_prev: ir.Value | None,
    equal: SizeEquality,
) -> tuple[Broadcast, int | None] | Refusal:
    """(the broadcast, static batch) when ``x_t`` and the states fit the node, else why
    not. A batch is ``x_t``'s when the prover or a node of the step (``equal``) proves it."""
    hidden = cell.hidden_size
    if prover.rank(cell.x) != 2:
        return Refusal(f"the step input {cell.x.name} is not provably of rank 2")
    batch = prover.dim(cell.x, 0)
    unproven: list[str] = []
    for state, name in ((h_prev, "h"), (c_prev, "c")):
        if state is None:
            continue
        if prover.rank(state) != 2:
            return Refusal(f"{name}_(t-1) ({state.name}) is not provably of rank 2")
        width = prover.dim(state, 1) == Dim.const(hidden) or (cell.h_width_read and name == "h")
        if not width:
            return Refusal(f"cannot prove {name}_(t-1) ({state.name}) is [batch, {hidden}]")
        state_batch = prover.dim(state, 0)
        if batch is None or not (state_batch == batch or equal.same(state_batch, batch)):
            unproven.append(name)
    broadcast: Broadcast = None if not unproven else "c" if unproven == ["c"] else "all"
    static = None if broadcast or batch is None else batch.value
    return broadcast, static


def _emitted_nodes(plan: _Plan, opset: int) -> int:
    """The nodes :meth:`OneStepCell.rewrite` emits: Unsqueezes, the node, Squeezes, the
    broadcast (``rules._broadcast``) and the batch-0 guard (``Size``, ``Equal``, ``If``
    and an ``Identity`` per read state in its batch-0 branch)."""
    lstm = plan.c_prev is not None
    count = (3 if lstm else 2) + 1 + (2 if lstm else 1)
    if plan.broadcast == "c":
        count += broadcast_state_nodes(opset)
    elif plan.broadcast:
        count += 12 if lstm else 8
    if plan.guarded:
        count += 3 + 1 + int(plan.c_read)
    return count


class OneStepCell(ChainRule[_Plan]):
    """``h_t`` of one streaming step -> ``Squeeze(Y_h)`` of one LSTM/GRU/RNN node."""

    def __init__(self, op_type: str, root: str, target: str = "portable") -> None:
        super().__init__(name=f"OneStepCell[{op_type}]")
        self.op_type, self.root, self.target = op_type, root, target
        #: one evaluator per visit of a graph (reset by :meth:`setup`): its memo is shared
        #: by every node tried there, and never outlives the graph the rewrites change
        self._constants: tuple[ir.Graph, Constants] | None = None

    def setup(self) -> None:
        self._constants = None

    def pattern(self, op: Any, a: ir.Value, b: ir.Value) -> ir.Value:
        if self.root in _ACTIVATIONS:
            return getattr(op, self.root)(a)
        return getattr(op, self.root)(a, b)

    def plan_chain(self, root: ir.Node, main_graph: ir.Graph) -> _Plan | Refusal:
        if root.graph is not main_graph:
            return Inapplicable("a step inside a subgraph is the Loop/Scan rules'")
        if not _plausible(self.op_type, root):  # cheap: most Mul/Add/Tanh are not a step
            return Inapplicable(f"not one step of a cell ({self.op_type})")
        if self._constants is None or self._constants[0] is not main_graph:
            self._constants = (main_graph, Constants(main_graph.opset_imports.get("", 0)))
        constants = self._constants[1]
        sources = _candidates(root, main_graph, constants)
        if not sources:
            return Inapplicable("no state is read from the graph's inputs")
        prover = ShapeProver(main_graph)
        reasons: list[Refusal] = []
        proven: list[Refusal] = []  # why a proven cell is not rewritten: reported first
        for found in _proofs(self.op_type, root.outputs[0], sources, constants):
            if isinstance(found, Refusal):
                reasons.append(found)
                continue
            plan = self._plan(root, main_graph, prover, constants, *found)
            if not isinstance(plan, Refusal):
                return plan
            proven.append(plan)
        if proven:
            return proven[0]
        clipped = _clipped_state(root) if self.op_type == "LSTM" else None
        if clipped is not None:
            return clipped
        if not reasons or not _looks_like(self.op_type, root):
            return Inapplicable(f"not one step of a cell ({self.op_type})")
        # the closest attempt: one that got as far as reading a gate's terms
        return next((r for r in reasons if r.startswith("gate ")), reasons[0])

    def _plan(
        self,
        root: ir.Node,
        graph: ir.Graph,
        prover: ShapeProver,
        constants: Constants,
        cell: Cell,
        h_prev: ir.Value,
        c_prev: ir.Value | None,
        c: ir.Value | None,
    ) -> _Plan | Refusal:
        """The plan of a proven step, or why it is not rewritten."""
        h, c = root.outputs[0], None if c is None else _named(c)
        ends = [h] if c is None else [h, c]
        stops = {cell.x, h_prev} | ({c_prev} if c_prev is not None else set())
        nodes = step_nodes(ends, stops, constants)
        equal = required_equal(prover, nodes_computing_every(ends, stops, constants))
        shapes = _shapes(prover, cell, h_prev, c_prev, equal)
        if isinstance(shapes, Refusal):
            return shapes
        if self.op_type != "RNN" and cell.w.shape[1] == 0:
            return Refusal(EMPTY_INPUT_REASON.format(op=self.op_type))
        if self.op_type == "RNN" and (larger := _larger_cell(root, graph, constants)):
            return Inapplicable(f"{root.name} is a gate of an {larger} step, not an RNN step")
        if _feeds_a_step(self.op_type, h, constants):
            return Refusal("h_t feeds another step as its state: an unrolled chain (reroll's)")
        reason = _inside_only(nodes, ends, root, graph)
        if reason is not None:  # an RNN "step" inside a bigger cell is not one
            return Inapplicable(reason) if self.op_type == "RNN" else reason
        return _Plan(cell, h_prev, c_prev, h, c, nodes, *shapes)

    def refuse(self, context, plan: _Plan) -> Refusal | None:
        opset = opset_version(context.model, context.graph_or_function)
        if plan.broadcast and not isinstance(opset, Refusal):
            reason = broadcast_opset_reason(opset)
            if reason is not None:
                return Refusal(reason)
        return None

    def decline(self, context, plan: _Plan) -> KeptUnrolled | None:
        """Why a proven step stays as plain ops (recorded, so ``--check`` lists it): its
        element type, a runtime of the target without the kernel or that computes the op's
        default activations instead of the step's, a broadcast that outgrows the step, or
        the measured table."""
        kept = "one step kept as plain ops: "
        dtype = plan.cell.dtype
        if dtype == np.float16:
            return KeptUnrolled(
                f"{kept}it computes in float16 op by op: one float16 {self.op_type} node "
                "rounds otherwise"
            )
        missing = missing_kernel("", self.op_type, dtype, (self.target,)) or other_activations(
            self.op_type, plan.cell.written_activations, (self.target,)
        )
        if missing is not None:
            return KeptUnrolled(f"{kept}{missing}")
        opset = opset_version(context.model, context.graph_or_function)
        emitted = _emitted_nodes(plan, opset if isinstance(opset, int) else 0)
        if emitted > len(plan.nodes):
            what = {
                None: "its Unsqueezes and Squeezes",
                "c": "the Expands broadcasting c_(t-1)'s batch to x_t's (not proven equal; "
                "h_(t-1)'s is)",
                "all": "the Expands broadcasting the batches of x_t and the states (not "
                "proven equal)",
            }[plan.broadcast]
            if plan.guarded:
                what += f" and its batch-0 guard ({_GUARD_REASON})"
            return KeptUnrolled(
                f"{kept}the node with {what} is {emitted} nodes, the step {len(plan.nodes)}"
            )
        form = FORM_BROADCAST if plan.broadcast else FORM_GUARDED if plan.guarded else FORM
        decision = costs.of(context.model).no_slower(
            self.target, self.op_type, plan.cell.hidden_size, 1, plan.batch, "forward", form
        )
        if decision.fires:
            return None
        return KeptUnrolled(f"{kept}{decision.reason}")

    def rewrite(self, op: Any, **_: Any) -> ir.Value:
        plan, emit = self.plan, self.emitter(op)
        cell = plan.cell
        prefix = f"one_step_{plan.h.name or 'cell'}"
        w = emit.constant(cell.w[np.newaxis], f"{prefix}_W")
        r = emit.constant(cell.r[np.newaxis], f"{prefix}_R")
        b = emit.constant(cell.b[np.newaxis], f"{prefix}_B")
        x_t, h0, c0 = cell.x, plan.h_prev, plan.c_prev
        if plan.broadcast == "c" and c0 is not None:
            x_t, h0, c0 = broadcast_cell_state(op, x_t, h0, c0, emit.opset, emit.ints)
        x = emit.unsqueeze(x_t, 0)
        assert x is not None
        if plan.broadcast == "all":
            x, h0, c0 = broadcast_batches(op, x, h0, c0, emit.opset, emit.ints)
        inputs = [x, w, r, b, None, emit.unsqueeze(h0, 0)]
        if c0 is not None:
            inputs.append(emit.unsqueeze(c0, 0))
        outputs = recurrent_node(
            op,
            self.op_type,
            inputs,
            hidden_size=cell.hidden_size,
            reverse=False,
            activations=cell.written_activations,
            linear_before_reset=cell.linear_before_reset if self.op_type == "GRU" else None,
        )
        if plan.guarded:
            mark_replaces_batch_0_run(outputs[0])
        if plan.c is not None and plan.c_read:
            redirect(plan.c, emit.squeeze(outputs[2], 0))
        return emit.squeeze(outputs[1], 0)


def make_rules(target: str = "portable") -> list:
    """One rule per op (``RNN``: one variant per activation at the root)."""
    rnn = FormRule(
        "OneStepCell[RNN]", [OneStepCell.rule("RNN", act, target) for act in _ACTIVATIONS]
    )
    return [OneStepCell.rule("LSTM", "Mul", target), OneStepCell.rule("GRU", "Add", target), rnn]


FAMILY = RuleFamily.measured("one_step", __doc__, make_rules)
