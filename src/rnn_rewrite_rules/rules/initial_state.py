"""Zero initial states made explicit and shared, or dropped (target ``onnxruntime``).

A provably-zero initial state becomes one shared explicit zero state per shape (target
``portable``, the default) or no state at all (target ``onnxruntime``).

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
   (the same symbol, or the number a graph input declares; or that size round-tripped
   through int32, as tf2onnx's ``Cast(int32) -> Slice -> Concat -> Cast(int64)`` writes
   it: see :func:`_required_size` for why that is the size wherever the node runs). A
   zero constant
   ``[D, 1, H]`` fed to a model with a dynamic batch fails at run time for other
   batches; replacing it would hide that frozen axis, so it is left alone.

Target ``portable`` also needs the zeros computed by nodes that no other node reads (an
RNN node's initial-state input, or a node computing zeros read so, aside): otherwise they
stay computed and the explicit state adds nodes and removes none (a zero-step guard's
``Loop`` reading tf2onnx's zeros, see ``loop_scan``).

Replacement, by target:

* ``ShareZeroInitialState`` (``portable``): with a static batch the input is left empty,
  as for ``onnxruntime`` (every runtime takes that; ONNX Runtime's ``RNN`` kernel
  multiplies a given state by ``R`` at step 0 even when it is zeros). With a symbolic
  batch the state becomes
  ``ConstantOfShape(Concat([D], Shape(src, start=a, end=a + 1), [H]))`` (before opset 15
  ``Gather(Shape(src), [a])``) of the state's element type, ``src``'s axis ``a`` being
  where the prover found the batch size (a graph input's axis for every layer of a
  stack). One such node serves every later node of the graph with the same shape and type, and a
  state already in this form is left alone. tract 0.23.9 panics on an RNN without
  ``initial_h`` when the batch is symbolic and mis-runs torchlib's per-layer ``Slice`` of
  a stacked zero tensor; this form runs in ONNX Runtime, tract, OpenVINO and
  ``onnx.reference``.
* ``DropZeroInitialState`` (``onnxruntime``): the input is left empty (ONNX defines a
  missing state as zeros), which saves those three small nodes per call (about 1-2 us at
  seq 1 in ONNX Runtime, see ``docs/benchmarks.md``); tract rejects the result.

Either way the exporter's ``Shape``/``Concat``/``Expand``/``Slice`` chain dies.
"""

from __future__ import annotations

from typing import Union

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRule

from rnn_rewrite_rules._ir import const_array, opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules._rnn_ops import RNN_OPS
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._graph import cached_ints
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, copy_rnn_node, rnn_node_rules
from rnn_rewrite_rules.shape import Dim, ShapeProver
from rnn_rewrite_rules.shape.values import ZERO_PRESERVING, is_all_zeros, is_finite

__all__ = [
    "FAMILY",
    "DropZeroInitialState",
    "ShareZeroInitialState",
    "explicit_zero_form",
    "is_all_zeros",
    "is_finite",
    "make_rules",
    "state_reason",
]

#: One size of an explicit zero state's shape: a constant, or axis ``a`` of value ``src``.
Piece = Union[int, tuple[ir.Value, int]]  # noqa: UP007 (Python 3.10 evaluates aliases)
#: (element type, one piece per axis): what :func:`explicit_zero_form` recognises.
ZeroForm = tuple[ir.DataType, tuple[Piece, ...]]


#: Zero values followed up from a state, and readers down from one (bounds the walk).
_MAX_CHAIN = 16


def state_reason(node: ir.Node, state: ir.Value, prover: ShapeProver) -> Refusal | None:
    """None when ``state`` provably has the shape ``node`` requires of its initial states:
    ``[D, batch of X, H]`` (layout 1: ``[batch of X, D, H]``), else why not."""
    facts = rnn_facts(node, prover)
    if isinstance(facts, Refusal):
        return facts
    x = node.inputs[0]
    if x is None:
        return Refusal("the node has no X")
    batch_axis = 0 if facts.layout == 1 else 1
    batch = prover.dim(x, batch_axis)
    if batch is None:
        return Refusal("the rank of X is not proven")
    d, h = Dim.const(facts.num_directions), Dim.const(facts.hidden_size)
    expected = (batch, d, h) if facts.layout == 1 else (d, batch, h)
    shape = prover.dims(state)
    if shape is None:
        return Refusal("cannot prove the zero state's shape")
    if len(shape) != len(expected) or not all(
        _required_size(got, want, prover) for got, want in zip(shape, expected, strict=False)
    ):
        got = "[" + ", ".join(map(str, shape)) + "]"
        return Refusal(
            f"the zero state's shape {got} is not provably [D, batch of X, H] (a frozen axis?)"
        )
    return None


def _required_size(got: Dim, want: Dim, prover: ShapeProver) -> bool:
    """``got``, a size of an RNN node's initial state, equals ``want``, the size the node
    requires there, wherever the node runs.

    Equal polynomials, or ``got`` a size ``want`` round-tripped through a type of at least
    32 bits (tf2onnx's ``Cast(int64 -> int32) ... Cast(int32 -> int64)`` of a batch size,
    see :meth:`ShapeProver.narrowed_from`). That cast is the identity for sizes below
    ``2**31`` and gives another number at and above, where the RNN node rejects the
    state (its shape must be ``[D, batch, H]``): so wherever the original runs, ``got``
    is ``want``. A narrower round trip (int16: 32768) is refused: a batch that large is
    a real input, and the rewrite would hide the original's failure on it."""
    return got == want or prover.narrowed_from(got) == want


class _ZeroStateRule(RnnNodeRule):
    """The condition both targets share: which initial states are provable zeros of the
    shape the node requires. Sets ``self._zero_states`` (input indices)."""

    def check_node(self, context: MatchContext, node: ir.Node) -> MatchResult:
        check_result = MatchResult()
        inputs = node.inputs
        states = {
            i: state
            for i in RNN_OPS[(self.domain, self.op_type)].state_inputs
            if i < len(inputs) and (state := inputs[i]) is not None
        }
        zeros = [i for i, state in states.items() if is_all_zeros(state)]
        if not zeros:
            return check_result.fail("no initial state is a provable all-zero tensor", node)
        prover = ShapeProver(context.model.graph)
        for i in zeros:
            reason = state_reason(node, states[i], prover)
            if reason is not None:
                return check_result.fail(reason, states[i])
        self._zero_states = zeros
        return self.check_target(context, node, prover)

    def check_target(
        self, context: MatchContext, node: ir.Node, prover: ShapeProver
    ) -> MatchResult:
        return MatchResult()


class DropZeroInitialState(_ZeroStateRule):
    """RNN(..., initial_h=zeros, initial_c=zeros) -> RNN(..., "", "")."""

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        return copy_rnn_node(op, node, self.num_outputs, dict.fromkeys(self._zero_states))


class ShareZeroInitialState(_ZeroStateRule):
    """RNN(..., initial_h=zeros, initial_c=zeros) ->
    RNN(..., z, z) with z = ConstantOfShape(Concat([D], Shape(src)[a], [H])), shared."""

    def check_target(
        self, context: MatchContext, node: ir.Node, prover: ShapeProver
    ) -> MatchResult:
        check_result = MatchResult()
        facts = rnn_facts(node, prover)
        assert not isinstance(facts, Refusal)  # proven by state_reason
        x = node.inputs[0]
        batch_axis = 0 if facts.layout == 1 else 1
        batch = prover.dim(x, batch_axis)
        assert batch is not None and x is not None  # proven by state_reason
        # a static batch: every runtime takes a missing state (tract's panic needs a
        # symbolic batch), and ONNX Runtime's RNN kernel then skips R at step 0
        self._drop = batch.value is not None
        if self._drop:
            return check_result
        self._zero_states = [
            i for i in self._zero_states if explicit_zero_form(node.inputs[i]) is None
        ]
        if not self._zero_states:
            return check_result.fail(
                "the zero states already are an explicit ConstantOfShape of the batch size", node
            )
        state = node.inputs[self._zero_states[0]]
        assert state is not None  # a zero state is a present input (check_node)
        for i in self._zero_states:
            keeper = _kept_by(node.inputs[i])
            if keeper is not None:
                return check_result.fail(
                    f"the zero state's source is also read by {keeper.op_type} "
                    f"{keeper.name or '(unnamed)'}, so it stays computed: an explicit state"
                    " would add nodes and remove none",
                    node,
                )
        dtype = _state_type(node, state, context.model.graph)
        if dtype is None:
            return check_result.fail("cannot prove the initial state's element type", state)
        opset = opset_version(context.model, context.graph_or_function)
        if isinstance(opset, Refusal):
            return check_result.fail(opset, node)
        piece = _batch_piece(batch, x, batch_axis, context)
        if opset < 9:
            return check_result.fail(f"opset {opset} has no ConstantOfShape", node)
        d, h = facts.num_directions, facts.hidden_size
        pieces = (piece, d, h) if facts.layout == 1 else (d, piece, h)
        self._form: ZeroForm = (dtype, pieces)
        self._opset = opset
        self._graph = context.graph_or_function
        self._main_graph = context.graph_or_function is context.model.graph
        return check_result

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        if self._drop:
            return copy_rnn_node(op, node, self.num_outputs, dict.fromkeys(self._zero_states))
        zeros = self._existing(node) or self._emit(op)
        return copy_rnn_node(op, node, self.num_outputs, dict.fromkeys(self._zero_states, zeros))

    def _existing(self, node: ir.Node) -> ir.Value | None:
        """An explicit zero state of the same form defined before ``node`` in its graph."""
        for earlier in self._graph:
            if earlier is node:
                return None
            if (earlier.op_type, earlier.domain) == ("ConstantOfShape", "") and (
                explicit_zero_form(earlier.outputs[0]) == self._form
            ):
                return earlier.outputs[0]
        return None

    def _emit(self, op) -> ir.Value:
        self._constants: dict[tuple[int, ...], ir.Value] = {}
        dtype, pieces = self._form
        parts: list[ir.Value] = []
        constant: list[int] = []
        for piece in pieces:
            if isinstance(piece, int):
                constant.append(piece)
                continue
            if constant:
                parts.append(self._ints(op, constant))
                constant = []
            source, axis = piece
            if self._opset >= 15:
                parts.append(op.Shape(source, start=axis, end=axis + 1))
            else:  # Shape has no start/end before opset 15
                parts.append(op.Gather(op.Shape(source), self._ints(op, [axis]), axis=0))
        if constant:
            parts.append(self._ints(op, constant))
        shape = parts[0] if len(parts) == 1 else op.Concat(*parts, axis=0)
        fill = ir.tensor(np.zeros(1, dtype=dtype.numpy()))
        return op.ConstantOfShape(shape, value=fill)

    def _ints(self, op, values: list[int]) -> ir.Value:
        return cached_ints(op, self._graph, self._constants, values, as_node=not self._main_graph)


def _kept_by(state: ir.Value | None) -> ir.Node | None:
    """A node that keeps the zeros ``state`` is computed from alive after every zero state
    of an RNN node is replaced (a zero-step guard's ``Loop`` reading the exporter's
    zeros), or None: each zero value ``state`` is computed from by a node (its producers
    through :data:`values.ZERO_PRESERVING` ops and ``Concat``; constants cost no node) is
    read only by RNN nodes' initial-state inputs or by nodes whose every output is such a
    zero value."""
    chain: list[ir.Value] = []
    pending: list[ir.Value | None] = [state]
    while pending and len(chain) < _MAX_CHAIN:
        value = pending.pop()
        node = None if value is None else value.producer()
        if value is None or node is None or node.op_type == "Constant":
            continue  # a stored constant: no node to keep alive
        if not is_all_zeros(value):
            continue
        chain.append(value)
        if node is not None and (node.op_type in ZERO_PRESERVING or node.op_type == "Concat"):
            pending.extend(node.inputs if node.op_type == "Concat" else node.inputs[:1])
    for value in chain:
        keeper = _keeper(value, 0)
        if keeper is not None:
            return keeper
    return None


def _keeper(value: ir.Value, depth: int) -> ir.Node | None:
    """A reader of the zeros ``value`` that is neither an RNN node's initial state nor
    (through readers of its own) on the way to one; the producer when it is a graph output
    or the readers are too deep to follow."""
    producer = value.producer()
    if value.is_graph_output() or depth > _MAX_CHAIN:
        return producer
    for user, index in value.uses():
        op = RNN_OPS.get((user.domain, user.op_type))
        if op is not None and index in op.state_inputs:
            continue
        if not all(is_all_zeros(out) for out in user.outputs):
            return user
        for out in user.outputs:
            keeper = _keeper(out, depth + 1)
            if keeper is not None:
                return keeper
    return None


def _batch_piece(batch: Dim, x: ir.Value, axis: int, context: MatchContext) -> tuple[ir.Value, int]:
    """The (value, axis) to read a symbolic batch size from at run time: the axis the
    prover traced it to when visible here (shared by every layer), else ``X``'s."""
    symbol = batch.symbol
    visible = (context.graph_or_function, context.model.graph)
    if symbol is not None and not symbol.narrowed and symbol.value.graph in visible:
        return symbol.value, symbol.axis
    return x, axis


def _state_type(node: ir.Node, state: ir.Value, main_graph: ir.Graph) -> ir.DataType | None:
    """The element type ``T`` of ``node``'s states, from a constant or a main-graph input
    of type ``T`` (``X``, ``W``, ``R``; ``DynamicQuantizeLSTM``'s ``W``/``R`` are int8; a
    subgraph input's declaration is not a fact), or from the zero state's own constants:
    every proven-zero chain ends in a typed leaf (a constant, a ConstantOfShape or a Cast)
    within the depth that proved it, so the last is a guard for graphs whose types do not
    check."""
    quantized = node.op_type == "DynamicQuantizeLSTM"
    for value in node.inputs[:1] if quantized else node.inputs[:3]:
        if value is None:
            continue
        tensor = None if value.is_graph_input() else ir.convenience.get_const_tensor(value)
        if tensor is not None:
            return tensor.dtype
        declared = value.is_graph_input() and value.graph is main_graph
        if declared and value.dtype is not None:
            return value.dtype
    return _zero_type(state)


def _zero_type(value: ir.Value | None, depth: int = 0) -> ir.DataType | None:
    """The element type of a zero chain, read from its constants and casts."""
    if value is None or depth > 16 or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is not None:
        return tensor.dtype
    node = value.producer()
    if node is None or node.domain != "" or not node.inputs:
        return None
    if node.op_type == "ConstantOfShape":
        attr = node.attributes.get("value")
        return ir.DataType.FLOAT if attr is None else attr.as_tensor().dtype
    if node.op_type == "Cast":
        return ir.DataType(node.attributes.get_int("to", 0))
    if node.op_type == "DequantizeLinear":
        scale = node.inputs[1] if len(node.inputs) > 1 else None
        return _zero_type(scale, depth + 1)
    return _zero_type(node.inputs[0], depth + 1)


def explicit_zero_form(value: ir.Value | None) -> ZeroForm | None:
    """(element type, shape pieces) when ``value`` is ``ConstantOfShape`` of zero with a
    constant shape or a ``Concat`` of int64 constants and one-axis ``Shape`` reads (see
    ``_shape_read``), else None."""
    node = None if value is None else value.producer()
    if node is None or node.op_type != "ConstantOfShape" or node.domain != "" or not node.inputs:
        return None
    assert value is not None
    if not is_all_zeros(value):
        return None
    dtype = _zero_type(value)
    shape = node.inputs[0]
    array = const_array(shape)
    if dtype is None or shape is None:
        return None
    if array is not None:
        return dtype, tuple(int(v) for v in array.reshape(-1))
    concat = shape.producer()
    if concat is None or concat.op_type != "Concat" or concat.domain != "":
        return None
    if concat.attributes.get_int("axis", 0) != 0:
        return None
    pieces: list[Piece] = []
    for part in concat.inputs:
        array = const_array(part)
        if array is not None and array.ndim == 1 and array.dtype == np.int64:
            pieces.extend(int(v) for v in array)
            continue
        read = _shape_read(part)
        if read is None:
            return None
        pieces.append(read)
    return dtype, tuple(pieces)


def _shape_read(value: ir.Value | None) -> tuple[ir.Value, int] | None:
    """(src, a) when ``value`` is ``Shape(src, start=a, end=a+1)`` or
    ``Gather(Shape(src), [a])`` (a 1-D constant index, axis 0), a >= 0."""
    node = None if value is None else value.producer()
    if node is None or node.domain != "" or not node.inputs or node.inputs[0] is None:
        return None
    if node.op_type == "Shape":
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", -1) if "end" in node.attributes else None
        return (node.inputs[0], start) if start >= 0 and end == start + 1 else None
    if node.op_type != "Gather" or len(node.inputs) != 2 or node.attributes.get_int("axis", 0) != 0:
        return None
    inner = node.inputs[0].producer()
    if inner is None or (inner.op_type, inner.domain) != ("Shape", "") or inner.attributes:
        return None
    index = const_array(node.inputs[1])
    if index is None or index.shape != (1,) or index[0] < 0:
        return None
    source = inner.inputs[0]
    return None if source is None else (source, int(index[0]))


def make_rules() -> list[RewriteRule]:
    """The default (portable) target's rules: zero states become one shared one."""
    return rnn_node_rules(ShareZeroInitialState)


def make_drop_rules() -> list[RewriteRule]:
    """ONNX Runtime's: zero states are dropped."""
    return rnn_node_rules(DropZeroInitialState)


FAMILY = RuleFamily(
    name="initial_state",
    description=(__doc__ or "").partition("\n")[0],
    make_rules=make_rules,
    install_by_default=True,
    # tract 0.23.9 panics (``UndeterminedSymbol("batch")``) on an LSTM/GRU without
    # ``initial_h`` when the batch axis is symbolic: dropping is for ONNX Runtime only.
    target_rules={"onnxruntime": make_drop_rules},
    fixes=("unproven-zero-state",),
)
