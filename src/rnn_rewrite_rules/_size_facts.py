"""What a model's graph says about the sizes of its inputs' axes (read for the size plan).

The shape prover (:mod:`rnn_rewrite_rules.shape`) names each symbolic axis of a graph
input and carries it through the graph. Where sizes meet in one op that needs them equal
and each is an input axis or a static size:

* **ties**: two input axes that must take one size, whatever their declared names
  (tf2onnx's ``x [unk__1, T, F]`` and ``h0 [unk__2, H]`` meet as an RNN's batch);
* **fixed**: an input axis that meets a static size (``X``'s feature axis and ``W``'s last
  dim, a state's hidden axis and ``hidden_size``, a ``MatMul`` with a constant weight).

The ops read (:func:`_equal_groups`): an RNN's batch, feature, direction and hidden axes
(its states and ``sequence_lens`` included), ``Concat`` (every axis but the one
concatenated), ``MatMul`` and ``Gemm`` (the reduced axis), ``Conv`` (the channels), and
multidirectional broadcasting (``Add``, ``Where``, ``Expand``, ...) where neither size is
the constant 1. The op accepts tied axes of one size, and refuses them of two sizes
(neither 1): a tie is read from the graph, not guessed.

Besides: the inputs whose values reach an RNN's ``sequence_lens`` (through ``Cast`` and
other copies) and the sequence length bounding them; the export's own sizes (a static
size the file declares on a value the prover proves is one input axis: sizes worth
trying when others fail, never facts, since exporters declare the sizes they traced);
and, per node, the input axes its inputs depend on and the static sizes it holds (which
axes a runtime failure at that node is about, and sizes it may want there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping

import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn_ops import rnn_op
from rnn_rewrite_rules.shape import Dim, ShapeProver, Sym

__all__ = ["AxisRef", "NodeSizes", "Poly", "SizeFacts", "evaluate", "size_facts"]

#: An axis of a graph input: (input name, axis).
AxisRef = tuple[str, int]
#: A size as a polynomial over input axes: ((axes multiplied, coefficient), ...).
Poly = tuple[tuple[tuple[AxisRef, ...], int], ...]

#: Ops whose inputs broadcast multidirectionally (numpy rules).
_BROADCAST = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean",
        "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
        "And", "Or", "Xor", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
        "Where", "PRelu",
    }
)  # fmt: skip
#: Ops that pass their first input's values on unchanged (as far as a length is concerned).
_COPIES = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
#: The RNN input that holds the sequence lengths.
_SEQUENCE_LENS = 4
#: The static sizes kept per node (the first distinct ones above 1).
_MAX_NODE_SIZES = 4


@dataclasses.dataclass(frozen=True)
class NodeSizes:
    """What a node's inputs' sizes depend on: input axes, and the static sizes its constant
    inputs and declared outputs hold (a Reshape target with the traced length)."""

    axes: tuple[AxisRef, ...] = ()
    sizes: tuple[int, ...] = ()

    def __or__(self, other: NodeSizes) -> NodeSizes:
        return NodeSizes(
            tuple(dict.fromkeys((*self.axes, *other.axes))),
            tuple(dict.fromkeys((*self.sizes, *other.sizes)))[:_MAX_NODE_SIZES],
        )


@dataclasses.dataclass
class SizeFacts:
    """What :func:`size_facts` read from one model."""

    #: Input axis -> the static size the graph needs there.
    fixed: dict[AxisRef, int] = dataclasses.field(default_factory=dict)
    #: Pairs of input axes the graph needs equal.
    ties: list[tuple[AxisRef, AxisRef]] = dataclasses.field(default_factory=list)
    #: Input name -> the sequence length bounding its values (it reaches ``sequence_lens``).
    lengths: dict[str, Poly] = dataclasses.field(default_factory=dict)
    #: Input axis -> a size the file declares for it (the export's own; not a fact).
    declared: dict[AxisRef, int] = dataclasses.field(default_factory=dict)
    #: Node name -> what its inputs' sizes depend on (:class:`NodeSizes`).
    nodes: dict[str, NodeSizes] = dataclasses.field(default_factory=dict)
    #: Op type -> the same over every node of that op (a runtime names unnamed nodes so).
    ops: dict[str, NodeSizes] = dataclasses.field(default_factory=dict)

    def merge(self, other: SizeFacts) -> None:
        """Add what ``other`` (the rewritten model's) knows and this does not: fixed and
        declared sizes, lengths. Ties stay the original's alone (a tie only the result
        needs would hide sizes where the result fails and the original runs), and so do
        the nodes (a runtime failure to read is the original's)."""
        self.fixed = {**other.fixed, **self.fixed}
        self.declared = {**other.declared, **self.declared}
        self.lengths = {**other.lengths, **self.lengths}

    def node(self, name: str, op_type: str) -> NodeSizes:
        """What the node a runtime names (by name, or by op type alone) reads."""
        return (self.nodes.get(name) if name else None) or self.ops.get(op_type, NodeSizes())


def evaluate(poly: Poly, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """``poly`` at the input shapes ``shapes``, or None when an axis is not in them."""
    total = 0
    for axes, coefficient in poly:
        term = coefficient
        for name, axis in axes:
            shape = shapes.get(name)
            if shape is None or axis >= len(shape):
                return None
            term *= shape[axis]
        total += term
    return total


class _Reader:
    """One pass over a model: the prover's sizes of every value, read as input axes."""

    def __init__(self, model: ir.Model) -> None:
        self.prover = ShapeProver(model.graph)
        self.inputs = {v for v in model.graph.inputs if not v.is_initializer()}

    def dims(self, value: ir.Value | None) -> tuple[Dim, ...] | None:
        return None if value is None else self.prover.dims(value)

    def input_axis(self, symbol: Sym) -> AxisRef | None:
        """The input axis ``symbol`` names, or None (another unknown size)."""
        if symbol.value not in self.inputs:
            return None
        return (symbol.value.name or "", symbol.axis)

    def axis(self, dim: Dim) -> AxisRef | None:
        """The input axis ``dim`` is, when it is exactly one (else None)."""
        symbol = dim.symbol
        return None if symbol is None else self.input_axis(symbol)

    def poly(self, dim: Dim) -> Poly | None:
        """``dim`` over input axes, or None when it depends on another unknown size."""
        terms = []
        for monomial, coefficient in dim.terms:
            axes = [self.input_axis(symbol) for symbol in monomial]
            if None in axes:
                return None
            terms.append((tuple(a for a in axes if a is not None), coefficient))
        return tuple(terms)

    def axes_of(self, values: Iterable[ir.Value | None]) -> tuple[AxisRef, ...]:
        """Every input axis the sizes of ``values`` depend on, in order."""
        found: dict[AxisRef, None] = {}
        for value in values:
            for dim in self.dims(value) or ():
                for monomial, _ in dim.terms:
                    for axis in map(self.input_axis, monomial):
                        if axis is not None:
                            found.setdefault(axis)
        return tuple(found)


def _broadcast_groups(shapes: list[tuple[Dim, ...] | None]) -> Iterator[list[Dim]]:
    """Sizes broadcasting aligns (from the right) that must be equal: those not the
    constant 1."""
    known = [s for s in shapes if s is not None]
    rank = max((len(s) for s in known), default=0)
    for offset in range(1, rank + 1):
        group = [s[-offset] for s in known if len(s) >= offset and s[-offset].value != 1]
        if len(group) > 1:
            yield group


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    return node.attributes.get_int(name, default)


def _rnn_groups(node: ir.Node, reader: _Reader) -> Iterator[list[Dim]]:
    """An RNN's batch (X, the states, ``sequence_lens``), feature, direction and hidden
    sizes."""
    op = rnn_op(node)
    sizes = reader.prover.rnn_sizes(node)
    x = reader.dims(node.inputs[0] if node.inputs else None)
    if op is None or isinstance(sizes, Refusal) or x is None or len(x) != 3:
        return
    directions, hidden, layout = sizes
    batch = x[0] if layout == 1 else x[1]
    w = reader.dims(node.inputs[1] if len(node.inputs) > 1 else None)
    if w is not None and len(w) == 3:
        yield [x[2], w[2] if node.domain == "" else w[1]]  # DynamicQuantizeLSTM: [D, I, 4H]
    lens = node.inputs[_SEQUENCE_LENS] if len(node.inputs) > _SEQUENCE_LENS else None
    lens_dims = reader.dims(lens)
    if lens_dims is not None and len(lens_dims) == 1:
        yield [lens_dims[0], batch]
    batch_axis, direction_axis = (0, 1) if layout == 1 else (1, 0)
    for index in op.state_inputs:
        state = reader.dims(node.inputs[index] if len(node.inputs) > index else None)
        if state is not None and len(state) == 3:
            yield [state[batch_axis], batch]
            yield [state[direction_axis], Dim.const(directions)]
            yield [state[2], Dim.const(hidden)]


def _matmul_groups(a: tuple[Dim, ...] | None, b: tuple[Dim, ...] | None) -> Iterator[list[Dim]]:
    if a is None or b is None or not a or not b:
        return
    yield [a[-1], b[-2] if len(b) >= 2 else b[0]]
    if len(a) > 2 and len(b) > 2:
        yield from _broadcast_groups([a[:-2], b[:-2]])


def _gemm_groups(node: ir.Node, reader: _Reader) -> Iterator[list[Dim]]:
    a, b = (reader.dims(v) for v in node.inputs[:2])
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return
    trans_a, trans_b = _int_attr(node, "transA", 0), _int_attr(node, "transB", 0)
    yield [a[0] if trans_a else a[1], b[1] if trans_b else b[0]]


def _concat_groups(node: ir.Node, reader: _Reader) -> Iterator[list[Dim]]:
    shapes = [reader.dims(v) for v in node.inputs]
    known = [s for s in shapes if s is not None]
    if len(known) < 2 or len({len(s) for s in known}) != 1:
        return
    rank = len(known[0])
    axis = _int_attr(node, "axis", 0)
    axis += rank if axis < 0 else 0
    for position in range(rank):
        if position != axis:
            yield [s[position] for s in known]


def _conv_groups(node: ir.Node, reader: _Reader) -> Iterator[list[Dim]]:
    x, w = (reader.dims(v) for v in node.inputs[:2])
    if x is None or w is None or len(x) < 2 or len(w) < 2:
        return
    yield [x[1], w[1] * _int_attr(node, "group", 1)]


def _expand_groups(node: ir.Node, reader: _Reader) -> Iterator[list[Dim]]:
    x = reader.dims(node.inputs[0] if node.inputs else None)
    target = reader.prover.vector(node.inputs[1] if len(node.inputs) > 1 else None)
    if x is None or target is None or any(d is None for d in target):
        return
    yield from _broadcast_groups([x, tuple(d for d in target if d is not None)])


def _equal_groups(node: ir.Node, reader: _Reader) -> Iterator[list[Dim]]:
    """Groups of sizes ``node`` needs equal (or it fails at run time)."""
    if rnn_op(node) is not None:
        yield from _rnn_groups(node, reader)
        return
    if node.domain not in ("", "ai.onnx"):
        return
    op = node.op_type
    if op in _BROADCAST:
        yield from _broadcast_groups([reader.dims(v) for v in node.inputs])
    elif op == "MatMul":
        yield from _matmul_groups(*(reader.dims(v) for v in node.inputs[:2]))
    elif op == "Gemm":
        yield from _gemm_groups(node, reader)
    elif op == "Concat":
        yield from _concat_groups(node, reader)
    elif op == "Conv":
        yield from _conv_groups(node, reader)
    elif op == "Expand":
        yield from _expand_groups(node, reader)


def _add_group(group: list[Dim], reader: _Reader, facts: SizeFacts) -> None:
    """Tie the input axes of ``group`` together and fix them to its static size."""
    axes = [a for a in (reader.axis(d) for d in group) if a is not None]
    constants = {d.value for d in group if d.value is not None}
    for other in axes[1:]:
        if other != axes[0]:
            facts.ties.append((axes[0], other))
    if len(constants) == 1:
        (size,) = constants
        for axis in axes:
            facts.fixed.setdefault(axis, size)


def _length_input(value: ir.Value | None, reader: _Reader) -> str | None:
    """The graph input whose values ``value`` carries (through copies), or None."""
    while value is not None and value not in reader.inputs:
        node = value.producer()
        if node is None or node.op_type not in _COPIES or node.domain not in ("", "ai.onnx"):
            return None
        value = node.inputs[0] if node.inputs else None
    return None if value is None else value.name


def _add_lengths(node: ir.Node, reader: _Reader, facts: SizeFacts) -> None:
    """An input reaching ``node``'s ``sequence_lens``: bounded by X's sequence axis."""
    if rnn_op(node) is None or len(node.inputs) <= _SEQUENCE_LENS:
        return
    name = _length_input(node.inputs[_SEQUENCE_LENS], reader)
    x = reader.dims(node.inputs[0])
    if name is None or x is None or len(x) != 3:
        return
    seq = reader.poly(x[1] if node.attributes.get_int("layout", 0) == 1 else x[0])
    if seq is not None:
        facts.lengths.setdefault(name, seq)


def _add_declared(value: ir.Value, reader: _Reader, facts: SizeFacts) -> None:
    """Static sizes the file declares on ``value`` where the prover proves an input axis."""
    if value.shape is None or value in reader.inputs:
        return
    dims = reader.dims(value)
    if dims is None or len(dims) != len(value.shape):
        return
    for declared, dim in zip(value.shape, dims, strict=True):
        axis = reader.axis(dim)
        if isinstance(declared, int) and declared > 0 and axis is not None:
            facts.declared.setdefault(axis, declared)


def _static_sizes(node: ir.Node, reader: _Reader) -> tuple[int, ...]:
    """Sizes above 1 in ``node``'s constant int inputs and its declared outputs."""
    found: list[int] = []
    for value in node.inputs:
        found += (reader.prover.ints(value) or []) if value is not None else []
    for value in node.outputs:
        found += [d for d in value.shape or () if isinstance(d, int)]
    return tuple(dict.fromkeys(size for size in found if size > 1))[:_MAX_NODE_SIZES]


def _add_node(node: ir.Node, reader: _Reader, facts: SizeFacts) -> None:
    axes = reader.axes_of(node.inputs)
    if not axes:
        return
    sizes = NodeSizes(axes, _static_sizes(node, reader))
    if node.name:
        facts.nodes.setdefault(node.name, sizes)
    facts.ops[node.op_type] = facts.ops.get(node.op_type, NodeSizes()) | sizes


def size_facts(model: ir.Model) -> SizeFacts:
    """What the main graph of ``model`` says about its inputs' sizes (see the module)."""
    reader = _Reader(model)
    facts = SizeFacts()
    for node in model.graph:
        for group in _equal_groups(node, reader):
            _add_group(group, reader, facts)
        _add_lengths(node, reader, facts)
        _add_node(node, reader, facts)
        for value in node.outputs:
            _add_declared(value, reader, facts)
    return facts
