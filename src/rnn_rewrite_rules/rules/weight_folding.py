"""Fold the weight preparation in front of RNN nodes (W, R, B) into single initializers.

Pattern: an ``LSTM``/``GRU``/``RNN`` or ``com.microsoft`` ``DynamicQuantizeLSTM`` node
whose ``W``, ``R`` or ``B`` input (1, 2, 3) is computed, as torchlib exports it: ``Slice``
per gate, ``Concat`` in ONNX gate order, ``Unsqueeze`` of the direction axis, ``Concat``
across directions. onnxscript's constant folder leaves these alone above 8192 elements,
so the runtime redoes them on every call (or at every session creation).

Condition, for the input folded:

* every node of its producing sub-graph is one of :data:`FOLDABLE_OPS` (ONNX domain,
  deterministic, no data-dependent shapes), and every leaf is a constant initializer
  that is not a graph input (an initializer listed as a graph input can be overridden)
  or a ``Constant`` node's output;
* every tensor-data leaf (not a Slice bound, axes, shape or index) is read only by such
  nodes on the way to RNN weight inputs, and is not a graph output, so once folded the
  original is unused and removed: the model never stores the weights twice;
* the computed tensor has the shape the node needs: ``[D, G*H, I]`` for ``W``,
  ``[D, G*H, H]`` for ``R``, ``[D, 2*G*H]`` for ``B`` (``G`` = 4 LSTM, 3 GRU, 1 RNN;
  ``DynamicQuantizeLSTM``: ``[D, I, 4H]``, ``[D, H, 4H]``, ``[D, 8H]``), its declared
  dtype and shape (if any) and ``I`` = the static last dim of ``X`` (if known).

Replacement: the same node, attributes copied, with that input replaced by one new
initializer (in the graph the node lives in) holding the computed tensor. One input is
folded per rewrite; the new node matches again until ``W``, ``R`` and ``B`` are all
initializers, after which the condition fails (no self-loop). Two inputs that compute
identical tensors share one initializer.

Memory: ``Slice``, ``Unsqueeze``, ``Squeeze``, ``Transpose``, ``Identity``, ``Split`` and
a contiguous ``Reshape`` are numpy views of the original data and ``Concat`` is kept
lazy, so the result is allocated once and filled in place; an intermediate is released
as soon as its last consumer has run. See ``docs/weight-folding.md`` for the peak.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleSet

from rnn_rewrite_rules._rnn import DIRECTIONS, NUMPY_DTYPES, RNN_OPS
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, copy_rnn_node, rnn_node_rules

__all__ = [
    "FAMILY",
    "FOLDABLE_OPS",
    "FoldRnnWeights",
    "RemoveUnusedSubgraphInitializersPass",
    "fold_value",
    "preparation_nodes",
    "rules",
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
        "Constant",
    }
)

#: RNN input index -> name.
_WEIGHT_INPUTS = {1: "W", 2: "R", 3: "B"}
#: Cast targets whose numpy conversion is exactly ONNX's (no float8/bfloat16 rounding modes).
_CAST_TARGETS = NUMPY_DTYPES
#: Key of ``ir.Value.meta`` (in memory only) holding a folded initializer's digest.
_DIGEST_KEY = "rnn_rewrite_rules.weight_folding.digest"


class _FoldError(Exception):
    """The sub-graph cannot be evaluated with the semantics ONNX gives it."""


def _data_inputs(node: ir.Node) -> range:
    """Indices of ``node``'s inputs that carry the tensor (not bounds, axes, shape, indices)."""
    return range(len(node.inputs)) if node.op_type == "Concat" else range(min(1, len(node.inputs)))


def _is_constant_node(node: ir.Node | None) -> bool:
    return node is not None and node.domain == "" and node.op_type == "Constant"


def _leaf_reason(value: ir.Value) -> str | None:
    """Why a producer-less ``value`` is not a constant leaf, or None if it is one."""
    name = value.name or "<unnamed>"
    if value.is_graph_input():
        if value.is_initializer():
            return f"{name} is an initializer that is also a graph input (overridable)"
        return f"{name} is a graph input"
    if not value.is_initializer() or value.const_value is None:
        return f"{name} is neither an initializer nor a Constant output"
    return None


def preparation_nodes(value: ir.Value) -> tuple[list[ir.Node], list[ir.Value]] | str:
    """The sub-graph computing ``value`` (topologically ordered) and its data leaves.

    Returns a reason instead when a node is not in :data:`FOLDABLE_OPS` or a leaf is not
    a constant initializer (or ``Constant``) that cannot be overridden.
    """
    order: list[ir.Node] = []
    data_leaves: dict[ir.Value, None] = {}
    done: set[ir.Node] = set()
    seen: set[ir.Value] = set()
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
        if node is None or _is_constant_node(node):
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
            return f"{current.name} is computed by {op}, not one of the foldable ops"
        stack.append((current, is_data, True))
        data = _data_inputs(node)
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


def _stays_alive(leaf: ir.Value) -> str | None:
    """Why ``leaf`` would still be needed after folding every RNN weight it feeds, or None."""
    stack = [leaf]
    seen: set[ir.Value] = set()
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        if value.is_graph_output():
            return f"{leaf.name} feeds graph output {value.name}: folding would store it twice"
        for user, index in value.uses():
            if (user.domain, user.op_type) in RNN_OPS and index in _WEIGHT_INPUTS:
                continue
            if user.domain == "" and user.op_type in FOLDABLE_OPS and index in _data_inputs(user):
                stack.extend(user.outputs)
                continue
            return (
                f"{leaf.name} is also read by {user.op_type} {user.name!r} (input {index}): "
                "folding would store it twice"
            )
    return None


# ---------------------------------------------------------------- evaluation


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
                raise _FoldError(f"{tensor.dtype} tensors are not folded")
            shape = tuple(int(d) for d in tensor.shape.dims)
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
    """A ``Concat`` not computed yet: it is written piece by piece into its final buffer."""

    __slots__ = ("axis", "dtype", "pieces", "shape")

    def __init__(self, pieces: Sequence[_Array], axis: int) -> None:
        if not pieces:
            raise _FoldError("Concat without inputs")
        rank = len(pieces[0].shape)
        if not -rank <= axis < rank:
            raise _FoldError(f"Concat axis {axis} out of range for rank {rank}")
        axis %= rank
        first = pieces[0]
        for piece in pieces:
            if piece.dtype != first.dtype:
                raise _FoldError("Concat inputs of different dtypes")
            others = [d for i, d in enumerate(piece.shape) if i != axis]
            if len(piece.shape) != rank or others != [
                d for i, d in enumerate(first.shape) if i != axis
            ]:
                raise _FoldError(f"Concat of shapes {first.shape} and {piece.shape}")
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
        raise _FoldError(f"missing {what}")
    array = _dense(value)
    if array.dtype.kind not in "iu" or array.ndim > 1:
        raise _FoldError(f"{what} is not a 1-D integer tensor")
    return [int(v) for v in array.reshape(-1)]


def _axes(raw: list[int], rank: int, what: str, *, sort: bool = True) -> tuple[int, ...]:
    axes = []
    for axis in raw:
        if not -rank <= axis < rank:
            raise _FoldError(f"{what} axis {axis} out of range for rank {rank}")
        axes.append(axis % rank)
    if len(set(axes)) != len(axes):
        raise _FoldError(f"repeated {what} axes {raw}")
    return tuple(sorted(axes)) if sort else tuple(axes)


def _ints_attr_or_input(
    node: ir.Node, name: str, operands: list[_Array | None], index: int
) -> list[int] | None:
    attr = node.attributes.get(name)
    if attr is not None:
        return list(attr.as_ints())
    if len(operands) > index and operands[index] is not None:
        return _int_list(operands[index], name)
    return None


def _slice(node: ir.Node, operands: list[_Array | None]) -> _Array:
    data = operands[0]
    assert data is not None
    shape = data.shape
    starts = _ints_attr_or_input(node, "starts", operands, 1)
    ends = _ints_attr_or_input(node, "ends", operands, 2)
    if starts is None or ends is None or len(starts) != len(ends):
        raise _FoldError("Slice starts/ends missing or of different lengths")
    axes_raw = _ints_attr_or_input(node, "axes", operands, 3)
    axes_raw = list(range(len(starts))) if axes_raw is None else axes_raw
    steps = _ints_attr_or_input(node, "steps", operands, 4) or [1] * len(starts)
    if not len(axes_raw) == len(steps) == len(starts):
        raise _FoldError("Slice inputs of different lengths")
    index = [slice(None)] * len(shape)
    axes = _axes(axes_raw, len(shape), "Slice", sort=False)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        dim = shape[axis]
        if step == 0:
            raise _FoldError("Slice step 0")
        start += dim if start < 0 else 0
        end += dim if end < 0 else 0
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            index[axis] = slice(start, end, step)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            index[axis] = slice(0, 0) if dim == 0 else slice(start, None if end < 0 else end, step)
    key = tuple(index)
    return _view_op(data, lambda a: a[key])


def _reshape(node: ir.Node, operands: list[_Array | None]) -> _Array:
    data = operands[0]
    assert data is not None
    shape, size = data.shape, math.prod(data.shape)
    target = _ints_attr_or_input(node, "shape", operands, 1)
    if target is None:
        raise _FoldError("Reshape without shape")
    allowzero = node.attributes.get_int("allowzero", 0)
    dims = []
    for i, dim in enumerate(target):
        if dim == 0 and not allowzero:
            if i >= len(shape):
                raise _FoldError("Reshape copies a dim the input does not have")
            dim = shape[i]
        dims.append(dim)
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise _FoldError(f"invalid Reshape target {target}")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise _FoldError(f"Reshape of {shape} to {target}")
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size:
        raise _FoldError(f"Reshape of {shape} to {target}")
    return _view_op(data, lambda a: np.reshape(a, dims))


def _gather(node: ir.Node, operands: list[_Array | None]) -> np.ndarray:
    data = _dense(operands[0])
    if len(operands) < 2 or operands[1] is None:
        raise _FoldError("Gather without indices")
    indices = _dense(operands[1])
    if indices.dtype.kind not in "iu":
        raise _FoldError("Gather indices are not integers")
    axis = node.attributes.get_int("axis", 0)
    if not -data.ndim <= axis < data.ndim:
        raise _FoldError(f"Gather axis {axis} out of range")
    axis %= data.ndim
    dim = data.shape[axis]
    indices = indices.astype(np.int64)
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise _FoldError("Gather index out of range")
    return np.take(data, np.where(indices < 0, indices + dim, indices), axis=axis)


def _split(node: ir.Node, operands: list[_Array | None]) -> list[_Array]:
    data = operands[0] if operands else None
    if data is None:
        raise _FoldError("Split without input")
    rank = len(data.shape)
    axis = node.attributes.get_int("axis", 0)
    if not -rank <= axis < rank:
        raise _FoldError(f"Split axis {axis} out of range")
    axis %= rank
    dim = data.shape[axis]
    count = len(node.outputs)
    sizes = _ints_attr_or_input(node, "split", operands, 1)
    if sizes is None:
        num_outputs = node.attributes.get_int("num_outputs", count)
        if num_outputs != count:
            raise _FoldError("Split num_outputs disagrees with its outputs")
        if "num_outputs" in node.attributes:  # opset 18: the last chunk may be smaller
            chunk = -(-dim // count)
            sizes = [chunk] * (count - 1) + [dim - chunk * (count - 1)]
        elif dim % count:
            raise _FoldError(f"Split of {dim} into {count} equal parts")
        else:
            sizes = [dim // count] * count
    if len(sizes) != count or any(s < 0 for s in sizes) or sum(sizes) != dim:
        raise _FoldError(f"Split sizes {sizes} of a dim of {dim}")
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
    if op_type == "Constant":
        tensor = ir.convenience.get_const_tensor(node.outputs[0])
        if tensor is None:
            raise _FoldError("Constant without a tensor value")
        return [_View(tensor)]
    if op_type == "Split":
        return list(_split(node, operands))
    if not operands or operands[0] is None:
        raise _FoldError(f"{op_type} without input")
    data = operands[0]
    if op_type == "Identity":
        return [data]
    if op_type == "Concat":
        if any(operand is None for operand in operands):
            raise _FoldError("Concat with an empty input")
        axis = node.attributes.get("axis")
        if axis is None:
            raise _FoldError("Concat without axis")
        return [_LazyConcat(operands, axis.as_int())]  # type: ignore[arg-type]
    if op_type == "Unsqueeze":
        raw = _ints_attr_or_input(node, "axes", operands, 1)
        if raw is None:
            raise _FoldError("Unsqueeze without axes")
        return [_expand_dims(data, _axes(raw, len(data.shape) + len(raw), "Unsqueeze"))]
    if op_type == "Squeeze":
        raw = _ints_attr_or_input(node, "axes", operands, 1)
        shape = data.shape
        if raw is None:
            axes = tuple(i for i, d in enumerate(shape) if d == 1)
        elif not raw:
            raise _FoldError("Squeeze with empty axes")
        else:
            axes = _axes(raw, len(shape), "Squeeze")
            if any(shape[a] != 1 for a in axes):
                raise _FoldError(f"Squeeze of axes {raw} of shape {shape}")
        return [_squeeze(data, axes)]
    if op_type == "Transpose":
        perm_attr = node.attributes.get("perm")
        rank = len(data.shape)
        perm = tuple(perm_attr.as_ints()) if perm_attr is not None else tuple(range(rank))[::-1]
        if sorted(perm) != list(range(rank)):
            raise _FoldError(f"Transpose perm {perm} for rank {rank}")
        return [_transpose(data, perm)]
    if op_type == "Cast":
        to = ir.DataType(node.attributes.get_int("to", 0))
        if to not in _CAST_TARGETS:
            raise _FoldError(f"Cast to {to} is not folded")
        dense = _dense(data)
        if dense.dtype.kind not in "fiub":
            raise _FoldError(f"Cast from {dense.dtype} is not folded")
        return [dense.astype(to.numpy())]
    if op_type == "Slice":
        return [_slice(node, operands)]
    if op_type == "Reshape":
        return [_reshape(node, operands)]
    if op_type == "Gather":
        return [_gather(node, operands)]
    raise _FoldError(f"{op_type} is not foldable")


def fold_value(value: ir.Value, nodes: Sequence[ir.Node] | None = None) -> np.ndarray | str:
    """Evaluate ``value`` from its constant sub-graph (see :func:`preparation_nodes`).

    Returns a C-contiguous array that owns its data, or a reason. Intermediates are
    released once their last consumer has run; ``Concat`` is filled straight into the
    result, so the exporter's Slice/Concat/Unsqueeze chains allocate only the result.
    """
    if nodes is None:
        found = preparation_nodes(value)
        if isinstance(found, str):
            return found
        nodes = found[0]
    pending: dict[ir.Value, int] = {value: 1}  # remaining reads inside the sub-graph
    for node in nodes:
        for operand in node.inputs:
            if operand is not None:
                pending[operand] = pending.get(operand, 0) + 1
    computed: dict[ir.Value, _Array] = {}

    def read(operand: ir.Value | None) -> _Array | None:
        if operand is None:
            return None
        if operand in computed:
            return computed[operand]
        producer = operand.producer()
        if producer is not None and not _is_constant_node(producer):
            raise _FoldError(f"{operand.name} is not computed by the sub-graph")
        tensor = ir.convenience.get_const_tensor(operand)
        if tensor is None:
            raise _FoldError(f"{operand.name} has no constant value")
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
        result = read(value)
        computed.clear()
        assert result is not None
        if isinstance(result, _LazyConcat):
            return result.materialize()
        array = _dense(result)
        del result
        if array.base is not None or not array.flags.c_contiguous or not array.flags.owndata:
            return np.array(array, order="C", copy=True)  # never a view of the model's data
        return array
    except (_FoldError, ValueError, TypeError) as error:
        return f"cannot evaluate {value.name}: {error}"


# ---------------------------------------------------------------- the rule


def _static_dims(value: ir.Value | None) -> tuple[int | None, ...] | None:
    if value is None:
        return None
    tensor = None if value.is_graph_input() else ir.convenience.get_const_tensor(value)
    if tensor is not None:
        return tuple(int(d) for d in tensor.shape.dims)
    if value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in value.shape.dims)


def _expected_shape(
    node: ir.Node, index: int, hidden: int, directions: int, gates: int
) -> tuple[int | None, ...]:
    x_dims = _static_dims(node.inputs[0]) if node.inputs else None
    input_size = x_dims[-1] if x_dims else None
    if node.domain == "com.microsoft":  # DynamicQuantizeLSTM: W, R transposed
        shapes = {
            1: (directions, input_size, gates * hidden),
            2: (directions, hidden, gates * hidden),
            3: (directions, 2 * gates * hidden),
        }
    else:
        shapes = {
            1: (directions, gates * hidden, input_size),
            2: (directions, gates * hidden, hidden),
            3: (directions, 2 * gates * hidden),
        }
    return shapes[index]


def _hidden_size(node: ir.Node, gates: int) -> int | None:
    attr = node.attributes.get("hidden_size")
    if attr is not None:
        return attr.as_int()
    r_dims = _static_dims(node.inputs[2]) if len(node.inputs) > 2 else None
    if r_dims is None or len(r_dims) != 3:
        return None
    return r_dims[1] if node.domain == "com.microsoft" else r_dims[2]


def _shape_mismatch(
    actual: tuple[int, ...], expected: Sequence[int | None], declared: Sequence[int | None] | None
) -> str | None:
    for wanted, what in ((expected, "needs"), (declared, "declares")):
        if wanted is None:
            continue
        if len(wanted) != len(actual) or any(
            w is not None and w != a for w, a in zip(wanted, actual, strict=True)
        ):
            return f"computed shape {actual}, but the node {what} {tuple(wanted)}"
    return None


def _digest(array: np.ndarray) -> str:
    return hashlib.blake2b(memoryview(array).cast("B"), digest_size=32).hexdigest()


def _same_folded(graph: ir.Graph, array: np.ndarray, digest: str) -> ir.Value | None:
    """An initializer this rule created earlier in ``graph`` with the same contents."""
    for initializer in graph.initializers.values():
        if initializer.meta.get(_DIGEST_KEY) != digest or initializer.is_graph_input():
            continue
        tensor = initializer.const_value
        if (
            tensor is not None
            and tuple(tensor.shape.dims) == array.shape
            and tensor.dtype.numpy() == array.dtype
        ):
            return initializer
    return None


def _unique_name(model: ir.Model, graph: ir.Graph, base: str) -> str:
    taken: set[str] = set(graph.initializers) | set(model.graph.initializers)
    for graph_like in (model.graph, graph):
        taken.update(v.name for v in graph_like.inputs if v.name)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        taken.update(v.name for v in node.outputs if v.name)
    name, suffix = base, 1
    while name in taken:
        name, suffix = f"{base}_{suffix}", suffix + 1
    return name


class FoldRnnWeights(RnnNodeRule):
    """RNN(X, <computed W>, <computed R>, <computed B>, ...) -> RNN(X, W', R', B', ...)."""

    #: Set by a successful check for the rewrite: (input index, tensor or reused value, name).
    _fold: tuple[int, ir.Value | np.ndarray, str] | None = None
    _new_digest = ""

    def check_node(self, context, node: ir.Node) -> MatchResult:
        check_result = MatchResult()
        self._fold = None
        graph = context.graph_or_function
        if not isinstance(graph, ir.Graph):
            return check_result.fail("initializers cannot be added to a function", node)
        gates = RNN_OPS[(node.domain, node.op_type)]
        direction_attr = node.attributes.get("direction")
        direction = direction_attr.as_string() if direction_attr is not None else "forward"
        if direction not in DIRECTIONS:
            return check_result.fail(f"unknown direction {direction!r}", node)
        hidden = _hidden_size(node, gates)
        reasons = []
        for index, label in _WEIGHT_INPUTS.items():
            value = node.inputs[index] if len(node.inputs) > index else None
            if value is None:
                continue
            producer = value.producer()
            if producer is None or _is_constant_node(producer):
                continue  # already a constant (or a graph input): nothing to fold
            found = preparation_nodes(value)
            if isinstance(found, str):
                reasons.append(f"{label}: {found}")
                continue
            nodes, leaves = found
            alive = next((r for r in map(_stays_alive, leaves) if r is not None), None)
            if alive is not None:
                reasons.append(f"{label}: {alive}")
                continue
            if hidden is None and index != 2:
                reasons.append(f"{label}: hidden_size is unknown (no attribute, R not constant)")
                continue
            array = fold_value(value, nodes)
            if isinstance(array, str):
                reasons.append(f"{label}: {array}")
                continue
            if hidden is None:  # R itself tells H: [D, G*H, H] (transposed for the contrib op)
                h = array.shape[1] if node.domain == "com.microsoft" else array.shape[-1]
            else:
                h = hidden
            expected = _expected_shape(node, index, h, DIRECTIONS[direction], gates)
            mismatch = _shape_mismatch(array.shape, expected, _static_dims(value))
            if value.dtype is not None and value.dtype.numpy() != array.dtype:
                mismatch = f"computed dtype {array.dtype}, declared {value.dtype}"
            if mismatch is not None:
                reasons.append(f"{label}: {mismatch}")
                continue
            digest = _digest(array)
            existing = _same_folded(graph, array, digest)
            if existing is not None:
                self._fold = (index, existing, digest)
            else:
                named = [leaf.name for leaf in leaves if leaf.name]
                base = f"{named[0] if named else node.name or node.op_type}_{label}"
                self._fold = (index, array, _unique_name(context.model, graph, base))
                self._new_digest = digest
            return check_result
        if not reasons:
            return check_result.fail("W, R and B are constants already", node)
        return check_result.fail("; ".join(reasons), node)

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        assert self._fold is not None
        index, folded, name = self._fold
        self._fold = None
        if isinstance(folded, np.ndarray):
            folded = op.initializer(ir.tensor(folded, name=name), name=name)
            folded.meta[_DIGEST_KEY] = self._new_digest
        return copy_rnn_node(op, node, self.num_outputs, {index: folded})

    def cleanup(self) -> None:
        self._fold = None  # never keep a folded tensor alive past the pass


class RemoveUnusedSubgraphInitializersPass(ir.passes.InPlacePass):
    """Drop initializers of If/Loop/Scan bodies that nothing reads any more.

    onnx-ir's ``RemoveUnusedNodesPass`` drops unused initializers of the main graph
    only; without this, folding weights stored inside a subgraph would keep the
    originals next to the folded tensors. :func:`rnn_rewrite_rules.rewrite` runs it.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = 0
        for graph in model.graphs():
            if graph is model.graph:
                continue
            for name, value in tuple(graph.initializers.items()):
                if not (value.uses() or value.is_graph_output() or value.is_graph_input()):
                    del graph.initializers[name]
                    count += 1
        return ir.passes.PassResult(model, modified=bool(count))


rules = RewriteRuleSet(rnn_node_rules(FoldRnnWeights))

FAMILY = RuleFamily(
    name="weight_folding",
    description=(__doc__ or "").partition("\n")[0],
    rule_set=rules,
    install_by_default=True,
    portable=True,
    fixes=("runtime-weight-prep",),
)
