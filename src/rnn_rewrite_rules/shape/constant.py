"""The value of a value computed from constants: the one constant evaluator.

Two entry points over one per-node semantics (:func:`evaluate_node`: ``onnx.reference``,
ONNX's reference of each op, and Casts the way ONNX Runtime rounds them,
:func:`cast_as_runtime`):

* :class:`Constants`: small values a rule's check reads (a cell's weights, a loop's
  bounds), node by node, memoized; values may be bound to others (a Loop's invariants).
* :func:`fold_value`: a weight preparation sub-graph (:func:`preparation_nodes`: nodes of
  :data:`FOLDABLE_OPS`, leaves that are initializers which are not graph inputs or
  ``Constant`` outputs), lazy and memory-bounded. ``Slice``, ``Unsqueeze``, ``Squeeze``,
  ``Transpose``, ``Identity``, ``Split`` and a contiguous ``Reshape`` are numpy views of
  the original data and ``Concat`` is kept lazy, so the result is allocated once and
  filled in place; an intermediate is released as soon as its last consumer has run
  (``onnx.reference`` copies every intermediate: these view ops are written here for
  that reason alone, and checked against ONNX Runtime by
  ``tests/test_fold_against_onnxruntime.py``). See ``docs/weight-folding.md``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from rnn_rewrite_rules._ir import NUMPY_DTYPES, const_array, same_bits
from rnn_rewrite_rules._refusal import Refusal

__all__ = [
    "FOLDABLE_OPS",
    "Constants",
    "FoldError",
    "cast_as_runtime",
    "data_inputs",
    "evaluate_node",
    "fold_value",
    "is_constant_node",
    "preparation_nodes",
]


#: ONNX-domain ops a folded sub-graph may consist of.
FOLDABLE_OPS = frozenset(
    {
        "Slice",
        "Concat",
        "Unsqueeze",
        "Squeeze",
        "Transpose",
        "Reshape",
        "Gather",
        "Split",
        "Cast",
        "Identity",
    }
)

#: Cast targets folded (no float8/bfloat16 rounding modes); see :func:`cast_as_runtime`.
_CAST_TARGETS = NUMPY_DTYPES
#: Casts ONNX Runtime computes in two steps (its CPU kernel: double -> float -> float16),
#: so rounding twice; onnx.reference (numpy) rounds once. Folded only where both agree.
_TWO_STEP_CASTS = {(np.dtype(np.float64), np.dtype(np.float16)): np.dtype(np.float32)}


class FoldError(Exception):
    """The sub-graph cannot be evaluated with the semantics ONNX gives it."""


def data_inputs(node: ir.Node) -> range:
    """Indices of ``node``'s inputs that carry the tensor (not bounds, axes, shape, indices)."""
    return range(len(node.inputs)) if node.op_type == "Concat" else range(min(1, len(node.inputs)))


def is_constant_node(node: ir.Node | None) -> bool:
    return node is not None and node.domain == "" and node.op_type == "Constant"


def _leaf_reason(value: ir.Value) -> Refusal | None:
    """Why a producer-less ``value`` is not a constant leaf, or None if it is one."""
    name = value.name or "<unnamed>"
    if value.is_graph_input():
        if value.is_initializer():
            return Refusal(f"{name} is an initializer that is also a graph input (overridable)")
        return Refusal(f"{name} is a graph input")
    if not value.is_initializer() or value.const_value is None:
        return Refusal(f"{name} is neither an initializer nor a Constant output")
    return None


def preparation_nodes(value: ir.Value) -> tuple[list[ir.Node], list[ir.Value]] | Refusal:
    """The sub-graph computing ``value`` (topologically ordered) and its data leaves.

    Returns a reason instead when a node is not in :data:`FOLDABLE_OPS` or a leaf is not
    a constant initializer (or ``Constant``) that cannot be overridden.
    """
    order: list[ir.Node] = []
    data_leaves: dict[ir.Value, None] = {}
    done: set[ir.Node] = set()
    seen: set[tuple[ir.Value, bool]] = set()
    # iterative post-order DFS: (value, is_data, expanded)
    stack: list[tuple[ir.Value, bool, bool]] = [(value, True, False)]
    while stack:
        current, is_data, expanded = stack.pop()
        node = current.producer()
        if expanded:
            assert node is not None
            if node not in done:
                done.add(node)
                order.append(node)
            continue
        if node is None or is_constant_node(node):
            if node is None:
                reason = _leaf_reason(current)
                if reason is not None:
                    return reason
            if is_data:
                data_leaves[current] = None
            continue
        if (current, is_data) in seen:
            continue
        seen.add((current, is_data))
        if node.domain != "" or node.op_type not in FOLDABLE_OPS:
            op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
            return Refusal(f"{current.name} is computed by {op}, not one of the foldable ops")
        stack.append((current, is_data, True))
        data = data_inputs(node)
        for index in reversed(range(len(node.inputs))):  # first input popped first
            operand = node.inputs[index]
            if operand is not None:
                stack.append((operand, is_data and index in data, False))
    # A node reached twice may sit in `order` before a producer found later: re-sort.
    position = {node: i for i, node in enumerate(order)}
    graph = value.graph
    if graph is not None:
        listed = [n for n in graph if n in position]
        if len(listed) == len(order):
            return listed, list(data_leaves)
    return _toposort(order), list(data_leaves)


def _toposort(nodes: list[ir.Node]) -> list[ir.Node]:
    members = set(nodes)
    result: list[ir.Node] = []
    placed: set[ir.Node] = set()

    def visit(node: ir.Node) -> None:
        if node in placed:
            return
        placed.add(node)
        for operand in node.inputs:
            producer = operand.producer() if operand is not None else None
            if producer in members:
                visit(producer)
        result.append(node)

    for node in nodes:
        visit(node)
    return result


class _View:
    """A constant tensor not read yet, with the numpy view ops to apply once it is.

    The shape is tracked on a zero-strided probe, so nothing is read until the data is
    needed; a tensor backed by an in-memory protobuf is copied out on every read, so
    reading it late (and once per piece) keeps at most one such copy alive.
    """

    __slots__ = ("ops", "probe", "tensor")

    def __init__(self, tensor: ir.TensorProtocol, ops=(), probe: np.ndarray | None = None) -> None:
        if probe is None:
            dtype = np.dtype(tensor.dtype.numpy())
            if dtype.kind in "OSU":
                raise FoldError(f"{tensor.dtype} tensors are not folded")
            shape = tuple(int(d) for d in tensor.shape.numpy())
            probe = np.lib.stride_tricks.as_strided(
                np.zeros(1, dtype), shape, (0,) * len(shape), writeable=False
            )
        self.tensor = tensor
        self.ops = ops
        self.probe = probe

    @property
    def shape(self) -> tuple[int, ...]:
        return self.probe.shape

    @property
    def dtype(self) -> np.dtype:
        return self.probe.dtype

    def then(self, op) -> _View:
        return _View(self.tensor, (*self.ops, op), op(self.probe))

    def materialize(self) -> np.ndarray:
        array = self.tensor.numpy()
        for op in self.ops:
            array = op(array)
        return array


class _LazyConcat:
    """A ``Concat`` not computed yet: it is written piece by piece into its final buffer.

    ``pieces`` is not empty: the evaluator refuses a Concat without its first input."""

    __slots__ = ("axis", "dtype", "pieces", "shape")
    shape: tuple[int, ...]
    dtype: np.dtype

    def __init__(self, pieces: Sequence[_Array], axis: int) -> None:
        rank = len(pieces[0].shape)
        if not -rank <= axis < rank:
            raise FoldError(f"Concat axis {axis} out of range for rank {rank}")
        axis %= rank
        first = pieces[0]
        for piece in pieces:
            if piece.dtype != first.dtype:
                raise FoldError("Concat inputs of different dtypes")
            others = [d for i, d in enumerate(piece.shape) if i != axis]
            if len(piece.shape) != rank or others != [
                d for i, d in enumerate(first.shape) if i != axis
            ]:
                raise FoldError(f"Concat of shapes {first.shape} and {piece.shape}")
        shape = list(first.shape)
        shape[axis] = sum(piece.shape[axis] for piece in pieces)
        self.pieces = list(pieces)
        self.axis = axis
        self.shape = tuple(shape)
        self.dtype = first.dtype

    def expand_dims(self, axes: tuple[int, ...]) -> _LazyConcat:
        kept = [i for i in range(len(self.shape) + len(axes)) if i not in axes]
        pieces = [_expand_dims(p, axes) for p in self.pieces]
        return _LazyConcat(pieces, kept[self.axis])

    def squeeze(self, axes: tuple[int, ...]) -> _Array:
        if self.axis in axes:
            return np.squeeze(self.materialize(), axes)
        axis = self.axis - sum(1 for a in axes if a < self.axis)
        return _LazyConcat([_squeeze(p, axes) for p in self.pieces], axis)

    def transpose(self, perm: tuple[int, ...]) -> _LazyConcat:
        pieces = [_transpose(p, perm) for p in self.pieces]
        return _LazyConcat(pieces, perm.index(self.axis))

    def materialize(self) -> np.ndarray:
        out = np.empty(self.shape, dtype=self.dtype)
        self.fill(out)
        return out

    def fill(self, out: np.ndarray) -> None:
        offset = 0
        for piece in self.pieces:
            size = piece.shape[self.axis]
            index = [slice(None)] * len(self.shape)
            index[self.axis] = slice(offset, offset + size)
            target = out[tuple(index)]
            if isinstance(piece, _LazyConcat):
                piece.fill(target)
            else:
                np.copyto(target, _dense(piece), casting="no")
            offset += size


_Array = np.ndarray | _View | _LazyConcat


def _dense(value: _Array) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.materialize()


def _view_op(value: _Array, op) -> _Array:
    """Apply a numpy view operation (slicing, expand_dims, ...) as late as possible."""
    if isinstance(value, _View):
        return value.then(op)
    return op(_dense(value))


def _expand_dims(value: _Array, axes: tuple[int, ...]) -> _Array:
    if isinstance(value, _LazyConcat):
        return value.expand_dims(axes)
    return _view_op(value, lambda a: np.expand_dims(a, axes))


def _squeeze(value: _Array, axes: tuple[int, ...]) -> _Array:
    if isinstance(value, _LazyConcat):
        return value.squeeze(axes)
    return _view_op(value, lambda a: np.squeeze(a, axes))


def _transpose(value: _Array, perm: tuple[int, ...]) -> _Array:
    if isinstance(value, _LazyConcat):
        return value.transpose(perm)
    return _view_op(value, lambda a: np.transpose(a, perm))


def _int_list(value: _Array | None, what: str) -> list[int]:
    if value is None:
        raise FoldError(f"missing {what}")
    array = _dense(value)
    if array.dtype.kind not in "iu" or array.ndim > 1:
        raise FoldError(f"{what} is not a 1-D integer tensor")
    return [int(v) for v in array.reshape(-1)]


def _axes(raw: list[int], rank: int, what: str) -> tuple[int, ...]:
    """``raw`` made non-negative, in the order given (every reader takes any order)."""
    axes = []
    for axis in raw:
        if not -rank <= axis < rank:
            raise FoldError(f"{what} axis {axis} out of range for rank {rank}")
        axes.append(axis % rank)
    if len(set(axes)) != len(axes):
        raise FoldError(f"repeated {what} axes {raw}")
    return tuple(axes)


def _ints_attr_or_input(
    node: ir.Node, name: str, operands: list[_Array | None], index: int
) -> list[int] | None:
    attr = node.attributes.get(name)
    if attr is not None:
        return list(attr.as_ints())
    if len(operands) > index and operands[index] is not None:
        return _int_list(operands[index], name)
    return None


def cast_as_runtime(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``Cast(array, to=dtype)`` as every runtime computes it, or :class:`FoldError`.

    Checked against ORT 1.31 for every pair of :data:`NUMPY_DTYPES` on values that round
    (ties, subnormals, overflow): numpy's ``astype`` (what onnx.reference computes) is what
    ORT computes, except ``double -> float16``, which ORT rounds via ``float``: such a cast
    is folded only when rounding once and twice give the same tensor. Float to integer
    casts of a NaN, an infinity or a value out of the target's range are undefined in C++
    (x86 and ARM differ), so they are refused.
    """
    if array.dtype.kind == "f" and dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        finite = not np.isnan(array).any()
        if not (finite and info.min - 1 < float(array.min()) and float(array.max()) < info.max + 1):
            raise FoldError(f"Cast of values out of the {dtype} range is platform-dependent")
    via = _TWO_STEP_CASTS.get((array.dtype, dtype))
    with np.errstate(over="ignore"):  # overflow to infinity is the cast's semantics
        once = array.astype(dtype)
        if via is not None and not same_bits(once, array.astype(via).astype(dtype)):
            raise FoldError(
                f"Cast of {array.dtype} to {dtype} rounds differently in ONNX Runtime "
                f"(via {via}) and onnx.reference (once)"
            )
    return once


def _slice(node: ir.Node, operands: list[_Array | None]) -> _Array:
    data = operands[0]
    assert data is not None
    shape = data.shape
    starts = _ints_attr_or_input(node, "starts", operands, 1)
    ends = _ints_attr_or_input(node, "ends", operands, 2)
    if starts is None or ends is None or len(starts) != len(ends):
        raise FoldError("Slice starts/ends missing or of different lengths")
    axes_raw = _ints_attr_or_input(node, "axes", operands, 3)
    axes_raw = list(range(len(starts))) if axes_raw is None else axes_raw
    steps = _ints_attr_or_input(node, "steps", operands, 4) or [1] * len(starts)
    if not len(axes_raw) == len(steps) == len(starts):
        raise FoldError("Slice inputs of different lengths")
    index = [slice(None)] * len(shape)
    axes = _axes(axes_raw, len(shape), "Slice")
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        dim = shape[axis]
        if step == 0:
            raise FoldError("Slice step 0")
        start += dim if start < 0 else 0
        end += dim if end < 0 else 0
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            index[axis] = slice(start, end, step)
        else:
            # an empty axis gives start = end = -1: the slice (-1, None, -1) is empty too
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            index[axis] = slice(start, None if end < 0 else end, step)
    key = tuple(index)
    return _view_op(data, lambda a: a[key])


def _reshape(node: ir.Node, operands: list[_Array | None]) -> _Array:
    data = operands[0]
    assert data is not None
    shape, size = data.shape, math.prod(data.shape)
    target = _ints_attr_or_input(node, "shape", operands, 1)
    if target is None:
        raise FoldError("Reshape without shape")
    allowzero = node.attributes.get_int("allowzero", 0)
    dims = []
    for i, dim in enumerate(target):
        if dim == 0 and not allowzero:
            if i >= len(shape):
                raise FoldError("Reshape copies a dim the input does not have")
            dim = shape[i]
        dims.append(dim)
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise FoldError(f"invalid Reshape target {target}")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise FoldError(f"Reshape of {shape} to {target}")
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size:
        raise FoldError(f"Reshape of {shape} to {target}")
    return _view_op(data, lambda a: np.reshape(a, dims))


def _gather(node: ir.Node, operands: list[_Array | None]) -> np.ndarray:
    if len(operands) < 2 or operands[1] is None or operands[0] is None:
        raise FoldError("Gather without indices")
    indices = _dense(operands[1])
    if indices.dtype.kind not in "iu":
        raise FoldError("Gather indices are not integers")
    data = _dense(operands[0])
    axis = node.attributes.get_int("axis", 0)
    if not -data.ndim <= axis < data.ndim:
        raise FoldError(f"Gather axis {axis} out of range")
    dim = data.shape[axis]
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise FoldError("Gather index out of range")
    (result,) = evaluate_node(node, [data, indices], opset=13)
    return result


def _split(node: ir.Node, operands: list[_Array | None]) -> list[_Array]:
    data = operands[0] if operands else None
    if data is None:
        raise FoldError("Split without input")
    rank = len(data.shape)
    axis = node.attributes.get_int("axis", 0)
    if not -rank <= axis < rank:
        raise FoldError(f"Split axis {axis} out of range")
    axis %= rank
    dim = data.shape[axis]
    count = len(node.outputs)
    sizes = _ints_attr_or_input(node, "split", operands, 1)
    if sizes is None:
        num_outputs = node.attributes.get_int("num_outputs", count)
        if num_outputs != count:
            raise FoldError("Split num_outputs disagrees with its outputs")
        if "num_outputs" in node.attributes:  # opset 18: the last chunk may be smaller
            chunk = -(-dim // count)
            sizes = [chunk] * (count - 1) + [dim - chunk * (count - 1)]
        elif dim % count:
            raise FoldError(f"Split of {dim} into {count} equal parts")
        else:
            sizes = [dim // count] * count
    if len(sizes) != count or any(s < 0 for s in sizes) or sum(sizes) != dim:
        raise FoldError(f"Split sizes {sizes} of a dim of {dim}")
    parts, offset = [], 0
    for size in sizes:
        index = [slice(None)] * rank
        index[axis] = slice(offset, offset + size)
        key = tuple(index)
        parts.append(_view_op(data, lambda a, key=key: a[key]))
        offset += size
    return parts


def _evaluate_node(node: ir.Node, operands: list[_Array | None]) -> list[_Array]:
    op_type = node.op_type
    if op_type == "Split":
        return list(_split(node, operands))
    if not operands or operands[0] is None:
        raise FoldError(f"{op_type} without input")
    data = operands[0]
    if op_type == "Identity":
        return [data]
    if op_type == "Concat":
        if any(operand is None for operand in operands):
            raise FoldError("Concat with an empty input")
        axis = node.attributes.get("axis")
        if axis is None:
            raise FoldError("Concat without axis")
        return [_LazyConcat(operands, axis.as_int())]  # type: ignore[arg-type]
    if op_type == "Unsqueeze":
        raw = _ints_attr_or_input(node, "axes", operands, 1)
        if raw is None:
            raise FoldError("Unsqueeze without axes")
        return [_expand_dims(data, _axes(raw, len(data.shape) + len(raw), "Unsqueeze"))]
    if op_type == "Squeeze":
        raw = _ints_attr_or_input(node, "axes", operands, 1)
        shape = data.shape
        if raw is None:
            axes = tuple(i for i, d in enumerate(shape) if d == 1)
        elif not raw:
            raise FoldError("Squeeze with empty axes")
        else:
            axes = _axes(raw, len(shape), "Squeeze")
            if any(shape[a] != 1 for a in axes):
                raise FoldError(f"Squeeze of axes {raw} of shape {shape}")
        return [_squeeze(data, axes)]
    if op_type == "Transpose":
        perm_attr = node.attributes.get("perm")
        rank = len(data.shape)
        perm = tuple(perm_attr.as_ints()) if perm_attr is not None else tuple(range(rank))[::-1]
        if sorted(perm) != list(range(rank)):
            raise FoldError(f"Transpose perm {perm} for rank {rank}")
        return [_transpose(data, perm)]
    if op_type == "Cast":
        to = ir.DataType(node.attributes.get_int("to", 0))
        if to not in _CAST_TARGETS:
            raise FoldError(f"Cast to {to} is not folded")
        dense = _dense(data)
        if dense.dtype.kind not in "fiub":
            raise FoldError(f"Cast from {dense.dtype} is not folded")
        return [cast_as_runtime(dense, np.dtype(to.numpy()))]
    if op_type == "Slice":
        return [_slice(node, operands)]
    if op_type == "Reshape":
        return [_reshape(node, operands)]
    if op_type == "Gather":
        return [_gather(node, operands)]
    raise FoldError(f"{op_type} is not foldable")


def fold_value(value: ir.Value, nodes: Sequence[ir.Node] | None = None) -> np.ndarray | Refusal:
    """Evaluate ``value`` from its constant sub-graph (see :func:`preparation_nodes`).

    Returns a C-contiguous array that owns its data, or a reason. Intermediates are
    released once their last consumer has run; ``Concat`` is filled straight into the
    result, so the exporter's Slice/Concat/Unsqueeze chains allocate only the result.
    """
    if nodes is None:
        found = preparation_nodes(value)
        if isinstance(found, Refusal):
            return found
        nodes = found[0]
    pending: dict[ir.Value, int] = {value: 1}  # remaining reads inside the sub-graph
    for node in nodes:
        for operand in node.inputs:
            if operand is not None:
                pending[operand] = pending.get(operand, 0) + 1
    computed: dict[ir.Value, _Array] = {}
    sources: list[ir.TensorProtocol] = []

    def read(operand: ir.Value | None) -> _Array | None:
        if operand is None:
            return None
        if operand in computed:
            return computed[operand]
        producer = operand.producer()
        if producer is not None and not is_constant_node(producer):
            raise FoldError(f"{operand.name} is not computed by the sub-graph")
        tensor = ir.convenience.get_const_tensor(operand)
        if tensor is None:
            raise FoldError(f"{operand.name} has no constant value")
        sources.append(tensor)
        leaf = _View(tensor)
        computed[operand] = leaf
        return leaf

    try:
        for node in nodes:
            operands = [read(operand) for operand in node.inputs]
            results = _evaluate_node(node, operands)
            del operands
            for output, result in zip(node.outputs, results, strict=True):
                if output in pending:
                    computed[output] = result
            for operand in node.inputs:
                if operand is not None:
                    pending[operand] -= 1
                    if not pending[operand]:
                        computed.pop(operand, None)
        final = read(value)
        computed.clear()
        assert final is not None
        result = final
        if isinstance(result, _LazyConcat):
            return result.materialize()
        array = _dense(result)
        del result
        if array.base is not None or not array.flags.c_contiguous or not array.flags.owndata:
            owned = np.array(array, order="C", copy=True)  # never a view of the model's data
            del array  # so that a mapped source can be unmapped below
            return owned
        return array
    except (FoldError, ValueError, TypeError) as error:
        return Refusal(f"cannot evaluate {value.name}: {error}")
    finally:
        computed.clear()
        for tensor in sources:
            _unmap(tensor)


def _unmap(tensor: ir.TensorProtocol) -> None:
    """Drop a memory-mapped source's pages from the process (mapped again if read later)."""
    if isinstance(tensor, ir.ExternalTensor):
        with contextlib.suppress(BufferError):  # a view of the mapping is still alive
            tensor.release()


#: Ops :class:`Constants` evaluates: deterministic, no subgraphs, no randomness.
_EVALUATED = frozenset(
    {
        "Add", "And", "Cast", "Concat", "Div", "Equal", "Gather", "Greater",
        "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Mul", "Neg", "Not", "Or",
        "Reshape", "Shape", "Slice", "Split", "Squeeze", "Sub", "Transpose", "Unsqueeze",
        "Xor",
    }
)  # fmt: skip
#: Above this many elements a value is not evaluated (a weight is a few million at most).
_MAX_ELEMENTS = 1 << 27


class Constants:
    """The numpy value of a value computed from constants alone, else None.

    ``bound`` maps a value (a body input) to a value or array it provably equals (a
    loop-invariant carried value to the Loop's input; an iteration number to its number
    while the condition is evaluated). ``opset`` is the ONNX opset the nodes run at.
    """

    def __init__(
        self, opset: int, bound: Mapping[ir.Value, ir.Value | np.ndarray] | None = None
    ) -> None:
        self._opset = opset
        self._bound = dict(bound or {})
        self._memo: dict[ir.Value, np.ndarray | None] = {}

    def bind(self, bound: Mapping[ir.Value, ir.Value | np.ndarray]) -> Constants:
        """A new evaluator with this one's bindings and ``bound``'s (which win)."""
        return Constants(self._opset, {**self._bound, **bound})

    def __call__(self, value: ir.Value | None) -> np.ndarray | None:
        """Evaluated depth first with an explicit stack: a chain of thousands of steps
        (an unrolled recurrence) is walked without recursion."""
        if value is None:
            return None
        stack = [value]
        entered: set[ir.Value] = set()
        while stack:
            current = stack[-1]
            if current in self._memo:
                stack.pop()
                continue
            needed = self._first_unevaluated(current)
            if needed is None:
                stack.pop()
                self._memo[current] = self._compute(current)
            elif needed in entered:  # a cycle (there is none in a valid graph) is unknown
                self._memo[needed] = None
            else:
                entered.add(current)
                stack.append(needed)
        return self._memo[value]

    def _first_unevaluated(self, value: ir.Value) -> ir.Value | None:
        """The value :meth:`_compute` reads next that is not evaluated yet, if any."""
        if value in self._bound:
            bound = self._bound[value]
            return bound if isinstance(bound, ir.Value) and bound not in self._memo else None
        node = value.producer()
        if (
            node is None
            or value.const_value is not None
            or node.domain != ""
            or node.op_type not in _EVALUATED
        ):
            return None
        if any(self._opaque(operand) for operand in node.inputs):
            return None
        for operand in node.inputs:  # the first operand not constant ends _compute
            if operand is None:
                continue
            if operand not in self._memo:
                return operand
            array = self._memo[operand]
            if array is None or array.size > _MAX_ELEMENTS:
                return None
        return None

    def _opaque(self, value: ir.Value | None) -> bool:
        """``value`` is not a constant, seen from its producer alone (a graph or body
        input, or an op not evaluated): its readers are unknown without walking further."""
        if value is None or value in self._bound or value.const_value is not None:
            return False
        node = value.producer()
        if node is None:
            return True
        return node.domain != "" or (node.op_type not in _EVALUATED and node.op_type != "Constant")

    def _compute(self, value: ir.Value) -> np.ndarray | None:
        """``value`` from its operands, each evaluated already (:meth:`__call__`)."""
        if value in self._bound:
            bound = self._bound[value]
            return self._memo.get(bound) if isinstance(bound, ir.Value) else np.asarray(bound)
        array = _constant(value)
        if array is not None:
            return array
        node = value.producer()
        if node is None or node.domain != "" or node.op_type not in _EVALUATED:
            return None
        operands: list[np.ndarray | None] = []
        # the first operand not constant ends it (one not evaluated is opaque: see
        # _first_unevaluated)
        for operand in node.inputs:
            array = None if operand is None else self._memo.get(operand)
            if operand is not None and (array is None or array.size > _MAX_ELEMENTS):
                return None
            operands.append(array)
        try:
            results = evaluate_node(node, operands, self._opset)
        except Exception:
            return None
        for output, result in zip(node.outputs, results, strict=True):
            if output is not value:
                self._memo.setdefault(output, result)
        return results[list(node.outputs).index(value)]


def _constant(value: ir.Value) -> np.ndarray | None:
    """:func:`~rnn_rewrite_rules._ir.const_array` without its side effect: onnx_ir's
    ``get_const_tensor`` names a ``Constant`` node's tensor after its output, which changes
    the node as saved (a read must leave the graph as it is)."""
    node = value.producer()
    if (
        node is None
        or node.op_type != "Constant"
        or node.domain != ""
        or value.const_value is not None
    ):
        return const_array(value)
    if len(node.attributes) != 1 or len(node.outputs) != 1:
        return None
    ((name, attribute),) = node.attributes.items()
    if attribute.is_ref():
        return None
    if name == "value":
        return attribute.as_tensor().numpy()
    if name in ("value_float", "value_floats"):
        return np.array(attribute.value, dtype=np.float32)
    if name in ("value_int", "value_ints"):
        return np.array(attribute.value, dtype=np.int64)
    return None


def evaluate_node(
    node: ir.Node, operands: Sequence[np.ndarray | None], opset: int
) -> list[np.ndarray]:
    """``node``'s outputs for these operands, as ONNX (and ONNX Runtime's Cast) define them."""
    if node.op_type == "Cast":
        to = ir.DataType(node.attributes.get_int("to", 0))
        assert operands[0] is not None
        return [np.asarray(cast_as_runtime(operands[0], to.numpy()))]
    proto = ir.serde.serialize_node(node)
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(node.inputs)]
    del proto.input[:]
    proto.input.extend(names)
    del proto.output[:]
    proto.output.extend(f"out{i}" for i in range(len(node.outputs)))
    feeds = {n: a for n, a in zip(names, operands, strict=True) if n}
    results = ReferenceEvaluator(proto, opsets={"": opset}).run(None, feeds)
    return [np.asarray(r) for r in results]
