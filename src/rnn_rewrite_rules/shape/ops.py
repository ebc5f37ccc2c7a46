"""One transfer function per ONNX op: the output facts from the input facts.

A transfer function receives the node and one :class:`Fact` per input (None for an
absent optional input) and returns the facts of its outputs (fewer: the rest are
unknown). A size it cannot prove is None; the prover then names it by the output axis
itself, so a value's unknown size is still the same size everywhere it is read. Only
op semantics are used: never a value_info or a declared output shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn_ops import DIRECTIONS, RNN_OPS
from rnn_rewrite_rules.shape import semantics
from rnn_rewrite_rules.shape.dim import ONE, Dim, Sym, known, product
from rnn_rewrite_rules.shape.fact import MAX_ELEMENTS, TRACKED_ELEMENT_TYPES, UNKNOWN, Fact

__all__ = ["TRANSFER", "rnn_output_facts", "rnn_sizes"]

Inputs = Sequence[Fact | None]
Transfer = Callable[[ir.Node, Inputs], list[Fact]]

TRANSFER: dict[tuple[str, str], Transfer] = {}

_INT_TYPES = frozenset(
    {
        ir.DataType.INT64,
        ir.DataType.INT32,
        ir.DataType.INT16,
        ir.DataType.INT8,
        ir.DataType.UINT64,
        ir.DataType.UINT32,
        ir.DataType.UINT16,
        ir.DataType.UINT8,
    }
)


#: The integer types whose constant elements are tracked (:data:`TRACKED_ELEMENT_TYPES`).
_TRACKED_TYPES = TRACKED_ELEMENT_TYPES
_INT32_MAX = int(np.iinfo(np.int32).max)


def _fact(ins: Inputs, index: int) -> Fact:
    fact = ins[index] if index < len(ins) else None
    return UNKNOWN if fact is None else fact


def _present(ins: Inputs, index: int) -> bool:
    return index < len(ins) and ins[index] is not None


class _Unknown:
    """An optional operand that is present but not constant: neither its value nor absent."""


#: What :func:`_ints` returns for an operand given at run time.
RUNTIME = _Unknown()


def _operand(ins: Inputs, index: int) -> list[int] | _Unknown | None:
    """Optional int input ``index``: None when absent, :data:`RUNTIME` when present but
    not a constant (never read as absent)."""
    if not _present(ins, index):
        return None
    values = _fact(ins, index).ints()
    return RUNTIME if values is None else values


def _ints(node: ir.Node, name: str, ins: Inputs, index: int) -> list[int] | _Unknown | None:
    """An int list from attribute ``name`` or, when absent, :func:`_operand` ``index``."""
    attr = node.attributes.get(name)
    if attr is not None:
        return list(attr.as_ints())
    return _operand(ins, index)


def _any_narrowed(fact: Fact) -> bool:
    """A narrowed element (:meth:`Sym.narrowing`): arithmetic on it may wrap."""
    return fact.elements is not None and any(e is not None and e.narrowed for e in fact.elements)


def _size_element(element: Dim | None) -> Dim | None:
    """``element`` read as a size by an op that rejects a negative one (``Expand``,
    ``ConstantOfShape``): a nonnegative polynomial, or one narrowed symbol (where the
    op runs it is >= 0), else None."""
    if element is None:
        return None
    symbol = element.symbol
    return element if element.nonnegative or (symbol is not None and symbol.narrowed) else None


def _same(fact: Fact) -> Fact:
    return Fact(fact.dims)


# ---------------------------------------------------------------- data movement


def _elementwise_unary(node: ir.Node, ins: Inputs) -> list[Fact]:
    data = _fact(ins, 0)
    if node.op_type == "Identity":
        return [data]
    if node.op_type == "Neg" and data.elements is not None and not _any_narrowed(data):
        return [Fact(data.dims, tuple(None if e is None else -e for e in data.elements))]
    return [_same(data)]


def _first_output_same(node: ir.Node, ins: Inputs) -> list[Fact]:
    return [_same(_fact(ins, 0))]


def _cast(node: ir.Node, ins: Inputs) -> list[Fact]:
    """A cast to an integer type keeps the elements it cannot change: a constant within
    the target's range, and a symbolic one when cast to int64 (what shape arithmetic
    computes in). A narrowing cast wraps (``5 * 2**32`` to int32 is 0), so a symbolic
    size cast to another integer type becomes a narrowed symbol (:meth:`Sym.narrowing`):
    the size when it fits, which only a consumer that rejects every other value can
    conclude (``ShapeProver.narrowed_from``)."""
    data = _fact(ins, 0)
    if node.op_type != "Cast" or data.elements is None:
        return [_same(data)]
    to = ir.DataType(node.attributes.get_int("to", 0))
    if to not in _INT_TYPES:
        return [_same(data)]
    info = np.iinfo(to.numpy())

    def kept(index: int, element: Dim | None) -> Dim | None:
        if element is None:
            return None
        if element.value is None:
            if to == ir.DataType.INT64:
                return element
            return Dim((((Sym.narrowing(node.outputs[0], index),), 1),))
        if to not in _TRACKED_TYPES:  # arithmetic in it wraps at other bounds
            return None
        return element if info.min <= element.value <= info.max else None

    return [Fact(data.dims, tuple(kept(i, e) for i, e in enumerate(data.elements)))]


def _quantize(node: ir.Node, ins: Inputs) -> list[Fact]:
    return [_same(_fact(ins, 0))]


def _dynamic_quantize(node: ir.Node, ins: Inputs) -> list[Fact]:
    return [_same(_fact(ins, 0)), Fact(()), Fact(())]


def _transpose(node: ir.Node, ins: Inputs) -> list[Fact]:
    """The input's sizes permuted. Of an input of unknown rank nothing: ``perm`` would
    prove its rank only where the node runs, and ONNX Runtime's optimiser removes a
    Transpose it cancels against another without checking it (``perm=[1, 0, 2]`` twice
    then runs at rank 2: ``tests/test_hostile_shape_proofs.py``)."""
    data = _fact(ins, 0)
    attr = node.attributes.get("perm")
    if data.dims is None:
        return [UNKNOWN]
    rank = len(data.dims)
    perm = list(attr.as_ints()) if attr is not None else list(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        return [UNKNOWN]
    elements = data.elements if rank == 1 else None
    return [Fact(tuple(data.dims[p] for p in perm), elements)]


def _reshape(node: ir.Node, ins: Inputs) -> list[Fact]:
    data, target = _fact(ins, 0), _fact(ins, 1)
    if node.op_type == "Reshape" and not _present(ins, 1):  # Reshape-1: shape attribute
        shape = node.attributes.get("shape")
        target = UNKNOWN if shape is None else Fact.vector(tuple(map(Dim.const, shape.as_ints())))
    if target.elements is None:
        rank = target.dims[0].value if target.dims and target.dims[0] else None
        return [Fact((None,) * rank) if rank is not None else UNKNOWN]
    if data.dims is None:  # a positive element is the size wherever the reshape runs
        return [Fact(tuple(_positive(e) for e in target.elements))]
    out = semantics.reshape(data.dims, target.elements, node.attributes.get_int("allowzero", 0))
    if isinstance(out, Refusal):
        return [UNKNOWN]
    elements = data.elements if data.elements is not None and len(out) <= 1 else None
    return [Fact(out, elements)]


def _positive(element: Dim | None) -> Dim | None:
    """A Reshape target element that is the output's size whatever the input: a number
    above 0 or a size proven positive (neither ``-1`` nor a ``0`` that copies)."""
    if element is None or not element.positive:
        return None
    return element


def _flatten(node: ir.Node, ins: Inputs) -> list[Fact]:
    dims = known(_fact(ins, 0).dims)
    if dims is None:
        return [Fact((None, None))]
    axis = node.attributes.get_int("axis", 1)
    axis += len(dims) if axis < 0 else 0
    if not 0 <= axis <= len(dims):
        return [UNKNOWN]
    return [Fact((product(dims[:axis]), product(dims[axis:])))]


def _squeeze(node: ir.Node, ins: Inputs) -> list[Fact]:
    data = _fact(ins, 0)
    axes = _ints(node, "axes", ins, 1)
    if data.dims is None or isinstance(axes, _Unknown):  # axes fed at run time: rank unknown
        return [UNKNOWN]
    dims = list(data.dims)
    elements = data.elements
    if node.op_type == "Unsqueeze":
        if axes is None:
            return [UNKNOWN]
        norm = semantics.normalize_axes(axes, len(dims) + len(axes))
        if norm is None:
            return [UNKNOWN]
        for a in sorted(norm):
            dims.insert(a, ONE)
        return [Fact(tuple(dims), elements if len(dims) <= 1 else None)]
    if axes is None:  # every axis of size 1: only when each size is known
        if any(d is None or d.value is None for d in dims):
            return [UNKNOWN]
        axes = [i for i, d in enumerate(dims) if d == ONE]
    elif not axes and any(d is None or d.value in (None, 1) for d in dims):
        # empty axes: ONNX Runtime squeezes every size-1 axis, onnx.reference none; the
        # two agree only when no size can be 1
        return [UNKNOWN]
    norm = semantics.normalize_axes(axes, len(dims))
    if norm is None or any(dims[a] not in (ONE, None) for a in norm):
        return [UNKNOWN]  # squeezing a size that is not 1 fails at run time
    out = tuple(d for i, d in enumerate(dims) if i not in norm)
    return [Fact(out, elements if len(out) <= 1 else None)]


def _concat(node: ir.Node, ins: Inputs) -> list[Fact]:
    parts = [_fact(ins, i) for i in range(len(ins))]
    ranks = {p.rank for p in parts if p.rank is not None}
    if len(ranks) != 1:
        return [UNKNOWN]
    (rank,) = ranks
    axis = node.attributes.get_int("axis", 0)
    axis += rank if axis < 0 else 0
    if not 0 <= axis < rank:
        return [UNKNOWN]
    dims: list[Dim | None] = []
    for i in range(rank):
        sizes = [p.dims[i] if p.dims is not None else None for p in parts]
        if i == axis:
            summands = known(sizes)
            dims.append(None if summands is None else sum(summands, Dim()))
        else:  # the runtime requires them equal: any known one is the size
            given = [d for d in sizes if d is not None]
            const = [d for d in given if d.is_const]
            dims.append(const[0] if const else given[0] if given else None)
    elements = None
    contents = [p.elements for p in parts if p.elements is not None]
    if rank == 1 and len(contents) == len(parts):
        elements = tuple(e for content in contents for e in content)
    return [Fact(tuple(dims), elements)]


def _slice(node: ir.Node, ins: Inputs) -> list[Fact]:
    """The data's sizes, each sliced axis' from constant starts and ends. With starts or
    ends computed at run time, the axes they slice (constant ``axes``, or the first
    ``len(starts)``) are unknown and every other axis keeps its size."""
    data = _fact(ins, 0)
    if data.dims is None:
        return [UNKNOWN]
    rank = len(data.dims)
    if len(node.inputs) <= 1:  # Slice-1: attributes
        starts, ends = _ints(node, "starts", [], 0), _ints(node, "ends", [], 0)
        axes, steps = _ints(node, "axes", [], 0), None
        count = len(starts) if isinstance(starts, list) and isinstance(ends, list) else None
    else:
        starts, ends = _fact(ins, 1).ints(), _fact(ins, 2).ints()
        axes, steps = _operand(ins, 3), _operand(ins, 4)
        count = _length(_fact(ins, 1)) if _present(ins, 2) else None
    if isinstance(steps, _Unknown) or isinstance(axes, _Unknown) or count is None:
        return [Fact((None,) * rank)]
    axes = list(range(count)) if axes is None else axes
    steps = [1] * count if steps is None else steps  # absent: all 1
    norm = semantics.normalize_axes(axes, rank)
    if norm is None or not count == len(norm) == len(steps) or 0 in steps:
        return [UNKNOWN]
    if not isinstance(starts, list) or not isinstance(ends, list):
        return [Fact(tuple(None if a in norm else d for a, d in enumerate(data.dims)))]
    if not len(starts) == len(ends) == count:
        return [UNKNOWN]
    dims = list(data.dims)
    for start, end, axis, step in zip(starts, ends, norm, steps, strict=True):
        size = dims[axis]
        dims[axis] = None if size is None else semantics.slice_length(size, start, end, step)
    elements = None
    if data.elements is not None and len(dims) == 1:
        n = len(data.elements)
        picks = semantics.slice_indices(n, starts[0], ends[0], steps[0])
        elements = tuple(data.elements[i] for i in picks)
    return [Fact(tuple(dims), elements)]


def _length(fact: Fact) -> int | None:
    """The constant length of a rank-1 value, else None."""
    if fact.dims is None or len(fact.dims) != 1 or fact.dims[0] is None:
        return None
    return fact.dims[0].value


def _gather(node: ir.Node, ins: Inputs) -> list[Fact]:
    data, indices = _fact(ins, 0), _fact(ins, 1)
    if data.dims is None or indices.dims is None:
        return [UNKNOWN]
    axis = node.attributes.get_int("axis", 0)
    axis += len(data.dims) if axis < 0 else 0
    if not 0 <= axis < len(data.dims):
        return [UNKNOWN]
    dims = data.dims[:axis] + indices.dims + data.dims[axis + 1 :]
    elements = None
    picks = indices.ints()
    if data.elements is not None and len(data.dims) == 1 and picks is not None:
        n = len(data.elements)
        if all(-n <= i < n for i in picks):
            elements = tuple(data.elements[i] for i in picks)
    return [Fact(dims, elements)]


def _shape(node: ir.Node, ins: Inputs) -> list[Fact]:
    data = _fact(ins, 0)
    if data.dims is None:
        return [Fact((None,))]
    rank = len(data.dims)
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return [Fact.vector(data.dims[start:end])]


def _size(node: ir.Node, ins: Inputs) -> list[Fact]:
    dims = known(_fact(ins, 0).dims)
    return [Fact.scalar(None if dims is None else product(dims))]


def _constant_of_shape(node: ir.Node, ins: Inputs) -> list[Fact]:
    shape = _fact(ins, 0)
    if shape.elements is None:
        n = shape.dims[0].value if shape.dims and shape.dims[0] is not None else None
        return [Fact((None,) * n) if n is not None else UNKNOWN]
    dims = tuple(_size_element(e) for e in shape.elements)
    attr = node.attributes.get("value")
    fill = 0.0 if attr is None else attr.as_tensor().numpy().reshape(-1)[0].item()
    elements = None
    if len(dims) <= 1 and float(fill).is_integer():
        size = dims[0] if dims else ONE  # None: unknown, or possibly negative
        count = None if size is None else size.value
        if count is not None and count <= MAX_ELEMENTS:
            elements = (Dim.const(int(fill)),) * count
    return [Fact(dims, elements)]


def _expand(node: ir.Node, ins: Inputs) -> list[Fact]:
    """The broadcast of the data's shape and the target's elements; with a target whose
    elements are unknown but whose length ``k`` is, the rank alone: ``max(rank, k)``."""
    data, shape = _fact(ins, 0), _fact(ins, 1)
    if data.dims is None:
        return [UNKNOWN]
    if shape.elements is None:
        length = None if shape.dims is None or len(shape.dims) != 1 else shape.dims[0]
        if length is None or length.value is None:
            return [UNKNOWN]
        return [Fact((None,) * max(len(data.dims), length.value))]
    dims, target = known(data.dims), known([_size_element(e) for e in shape.elements])
    if dims is None or target is None:
        rank = max(len(data.dims), len(shape.elements))
        return [Fact((None,) * rank)]
    return [Fact(semantics.broadcast(dims, target))]


def _tile(node: ir.Node, ins: Inputs) -> list[Fact]:
    data, repeats = _fact(ins, 0), _fact(ins, 1)
    if data.dims is None or repeats.elements is None:
        return [UNKNOWN if data.dims is None else Fact((None,) * len(data.dims))]
    if len(repeats.elements) != len(data.dims):
        return [UNKNOWN]
    dims = tuple(
        None if d is None or r is None or not r.nonnegative else d * r
        for d, r in zip(data.dims, repeats.elements, strict=True)
    )
    return [Fact(dims)]


def _split(node: ir.Node, ins: Inputs) -> list[Fact]:
    data = _fact(ins, 0)
    count = len(node.outputs)
    if data.dims is None:
        return [UNKNOWN] * count
    axis = node.attributes.get_int("axis", 0)
    axis += len(data.dims) if axis < 0 else 0
    if not 0 <= axis < len(data.dims):
        return [UNKNOWN] * count
    sizes_int = _ints(node, "split", ins, 1)
    size = data.dims[axis]
    if isinstance(sizes_int, _Unknown):  # sizes fed at run time
        sizes: list[Dim | None] = [None] * count
    elif sizes_int is not None:
        sizes = [Dim.const(s) for s in sizes_int]
    elif "num_outputs" in node.attributes:  # opset 18: ceil division, last one smaller
        n = None if size is None else size.value
        if n is None:
            sizes = [None] * count
        else:
            chunk = -(-n // count)
            sizes = [*[Dim.const(chunk)] * (count - 1), Dim.const(n - chunk * (count - 1))]
    else:
        part = None if size is None else size.divide(count)
        sizes = [part] * count
    facts = []
    for s in sizes:
        dims = list(data.dims)
        dims[axis] = s
        facts.append(Fact(tuple(dims)))
    return facts


def _reduce(node: ir.Node, ins: Inputs) -> list[Fact]:
    """Reduced axes become 1 (``keepdims``, the default) or go; axes from the attribute
    (ReduceSum before opset 13, the others before 18, ArgMax/ArgMin's ``axis``) or input 1;
    no axes: every axis, or none with ``noop_with_empty_axes``."""
    data = _fact(ins, 0)
    if data.dims is None:
        return [UNKNOWN]
    keep = node.attributes.get_int("keepdims", 1)
    if node.op_type in ("ArgMax", "ArgMin"):
        axes: list[int] | None = [node.attributes.get_int("axis", 0)]
    elif "axes" in node.attributes:
        axes = list(node.attributes["axes"].as_ints())
    elif _present(ins, 1):
        axes = _fact(ins, 1).ints()
        if axes is None:
            return [UNKNOWN if not keep else Fact((None,) * len(data.dims))]
    else:
        axes = []
    if not axes:
        if node.attributes.get_int("noop_with_empty_axes", 0):
            return [_same(data)]
        axes = list(range(len(data.dims)))
    norm = semantics.normalize_axes(axes, len(data.dims))
    if norm is None:
        return [UNKNOWN]
    if keep:
        return [Fact(tuple(ONE if i in norm else d for i, d in enumerate(data.dims)))]
    return [Fact(tuple(d for i, d in enumerate(data.dims) if i not in norm))]


# ---------------------------------------------------------------- arithmetic


def _exact(*dims: Dim) -> bool:
    """Every coefficient of ``dims`` fits int32: integer arithmetic computes ``Add``,
    ``Sub`` and ``Mul`` of such values exactly in int32 and int64 (the only types whose
    elements are tracked) where the sizes are below ``2**31``, so its result is the
    polynomial's; beyond, it wraps (``8 * 2**61`` is 0 in int64, and a ``Div`` or a
    ``Slice`` bound reading it sees 0, not ``2**64``)."""
    return all(abs(c) <= _INT32_MAX for dim in dims for _, c in dim.terms)


def _element_op(name: str, a: Dim, b: Dim) -> Dim | None:
    if a.narrowed or b.narrowed:  # computed in a narrow type: may wrap
        return ONE if name == "Equal" and a == b else None
    if name in ("Add", "Sub", "Mul"):
        result = a + b if name == "Add" else a - b if name == "Sub" else a * b
        return result if _exact(a, b, result) else None
    if name == "Div":
        if a.value is not None and b.value is not None:
            if b.value == 0 or a.value < 0 or b.value < 0:
                return None
            return Dim.const(a.value // b.value)  # non-negative: truncation == floor
        return a.divide(b)
    if name in ("Max", "Min") and a.value is not None and b.value is not None:
        return Dim.const(max(a.value, b.value) if name == "Max" else min(a.value, b.value))
    if name == "Equal":
        if a == b:
            return ONE
        if a.value is not None and b.value is not None:
            return Dim()
        return None
    if name in ("And", "Or") and a.value in (0, 1) and b.value in (0, 1):
        return Dim.const(a.value & b.value if name == "And" else a.value | b.value)
    return None


def _broadcast_elements(name: str, parts: list[Fact]) -> tuple[Dim | None, ...] | None:
    contents = [p.elements for p in parts if p.elements is not None]
    if len(contents) != len(parts):
        return None
    lengths = {len(c) for c in contents if len(c) != 1}
    if len(lengths) > 1:
        return None
    n = lengths.pop() if lengths else 1
    columns = [c * n if len(c) == 1 else c for c in contents]
    out: list[Dim | None] = []
    for values in zip(*columns, strict=True):
        result = values[0]
        for value in values[1:]:
            result = None if result is None or value is None else _element_op(name, result, value)
        out.append(result)
    return tuple(out)


def _broadcast_dims(parts: list[Fact]) -> tuple[Dim | None, ...] | None:
    shapes = [p.dims for p in parts if p.dims is not None]
    if not parts or len(shapes) != len(parts):
        return None
    sized = [dims for s in shapes if (dims := known(s)) is not None]
    if len(sized) != len(shapes):
        return (None,) * max(len(s) for s in shapes)
    return semantics.broadcast(*sized)


def _elementwise(node: ir.Node, ins: Inputs) -> list[Fact]:
    parts = [_fact(ins, i) for i in range(len(ins))]
    dims = _broadcast_dims(parts)
    if dims is None:
        return [UNKNOWN]
    elements = _broadcast_elements(node.op_type, parts) if len(dims) <= 1 else None
    return [Fact(dims, elements)]


def _not(node: ir.Node, ins: Inputs) -> list[Fact]:
    data = _fact(ins, 0)
    elements = None
    if data.elements is not None:
        elements = tuple(
            None if e is None or e.value not in (0, 1) else Dim.const(1 - e.value)
            for e in data.elements
        )
    return [Fact(data.dims, elements)]


def _where(node: ir.Node, ins: Inputs) -> list[Fact]:
    cond, a, b = (_fact(ins, i) for i in range(3))
    dims = _broadcast_dims([cond, a, b])
    if dims is None:
        return [UNKNOWN]
    picks = cond.ints()
    if picks and len(set(picks)) == 1:  # the same branch everywhere
        chosen = a if picks[0] else b
        if chosen.elements is not None and chosen.dims == dims:
            return [Fact(dims, chosen.elements)]
    return [Fact(dims)]


def _matmul(node: ir.Node, ins: Inputs) -> list[Fact]:
    a, b = _fact(ins, 0), _fact(ins, 1)
    if a.dims is None or b.dims is None or not a.dims or not b.dims:
        return [UNKNOWN]
    a_dims, b_dims = list(a.dims), list(b.dims)
    a_vector, b_vector = len(a_dims) == 1, len(b_dims) == 1
    if a_vector:
        a_dims.insert(0, ONE)
    if b_vector:
        b_dims.append(ONE)
    batch_a, batch_b = known(a_dims[:-2]), known(b_dims[:-2])
    batch: tuple[Dim | None, ...]
    if batch_a is None or batch_b is None:
        batch = (None,) * (max(len(a_dims), len(b_dims)) - 2)
    else:
        batch = semantics.broadcast(batch_a, batch_b)
    dims = [*batch, a_dims[-2], b_dims[-1]]
    if b_vector:
        dims.pop()
    if a_vector:
        dims.pop(-2 if not b_vector else -1)
    return [Fact(tuple(dims))]


def _gemm(node: ir.Node, ins: Inputs) -> list[Fact]:
    a, b = _fact(ins, 0), _fact(ins, 1)
    if a.dims is None or b.dims is None or len(a.dims) != 2 or len(b.dims) != 2:
        return [Fact((None, None))]
    m = a.dims[1 if node.attributes.get_int("transA", 0) else 0]
    n = b.dims[0 if node.attributes.get_int("transB", 0) else 1]
    return [Fact((m, n))]


# ---------------------------------------------------------------- recurrent ops


def _size_of(fact: Fact, rank: int, axis: int) -> Dim | None:
    """Size ``axis`` of a value proven to have rank ``rank``, else None."""
    return fact.dims[axis] if fact.dims is not None and len(fact.dims) == rank else None


def rnn_sizes(node: ir.Node, ins: Inputs) -> tuple[int, int, int] | Refusal:
    """``(num_directions, hidden_size, layout)`` of an RNN node, or why they are unknown.

    From the ``direction``, ``hidden_size`` and ``layout`` attributes and the proven
    sizes of ``W`` and ``R`` (``[D, G*H, I]``, ``[D, G*H, H]``; transposed for
    ``DynamicQuantizeLSTM``), which must agree with them.
    """
    direction_attr = node.attributes.get("direction")
    direction = direction_attr.as_string() if direction_attr is not None else "forward"
    if direction not in DIRECTIONS:
        return Refusal(f"unknown direction {direction!r}")
    directions = DIRECTIONS[direction]
    layout = node.attributes.get_int("layout", 0)
    w, r = _fact(ins, 1), _fact(ins, 2)
    for weight in (w, r):
        size = _size_of(weight, 3, 0)
        found = None if size is None else size.value
        if found is not None and found != directions:
            return Refusal(f"direction {direction!r} disagrees with a weight of {found} directions")
    hidden_attr = node.attributes.get("hidden_size")
    hidden = hidden_attr.as_int() if hidden_attr is not None else None
    r_axis = 2 if node.domain == "" else 1
    r_size = _size_of(r, 3, r_axis)
    r_hidden = None if r_size is None else r_size.value
    if hidden is None:
        hidden = r_hidden
    elif r_hidden is not None and r_hidden != hidden:
        return Refusal(f"hidden_size={hidden} disagrees with R's hidden size {r_hidden}")
    if hidden is None:
        return Refusal("hidden_size is not static (no attribute, and R's size is not proven)")
    if hidden <= 0:
        return Refusal(f"hidden_size={hidden} is not positive")
    return directions, hidden, layout


def rnn_output_facts(node: ir.Node, ins: Inputs) -> list[Fact]:
    """``Y``, ``Y_h``, ``Y_c``: ``[seq, D, batch, H]``, ``[D, batch, H]`` (layout 0) or
    ``[batch, seq, D, H]``, ``[batch, D, H]`` (layout 1), seq and batch read from X."""
    sizes = rnn_sizes(node, ins)
    x_value = node.inputs[0] if node.inputs else None
    if isinstance(sizes, Refusal) or x_value is None:
        return []
    x = _fact(ins, 0).dims
    if x is None:  # the op requires X of rank 3: name its sizes by X's axes
        x = (Dim.sym(x_value, 0), Dim.sym(x_value, 1), Dim.sym(x_value, 2))
    if len(x) != 3:
        return []
    directions, hidden, layout = sizes
    d, h = Dim.const(directions), Dim.const(hidden)
    a0, a1 = x[0], x[1]
    if layout == 0:
        y, state = Fact((a0, d, a1, h)), Fact((d, a1, h))
    else:
        y, state = Fact((a0, a1, d, h)), Fact((a0, d, h))
    return [y, state, state]


# Registered from a table, not a decorator: mutmut does not mutate decorated functions.
_TRANSFERS: dict[Transfer, str] = {
    _elementwise_unary: (
        "Identity Relu Tanh Sigmoid Neg Abs Exp Log Sqrt Erf Reciprocal Floor Ceil Round "
        "Sign Sin Cos Softplus Softsign Elu Selu LeakyRelu HardSigmoid HardSwish Gelu Clip "
        "Softmax LogSoftmax IsNaN IsInf"
    ),
    _first_output_same: "Dropout LayerNormalization BatchNormalization InstanceNormalization",
    _cast: "Cast CastLike",
    _quantize: "DequantizeLinear QuantizeLinear",
    _dynamic_quantize: "DynamicQuantizeLinear",
    _transpose: "Transpose",
    _reshape: "Reshape",
    _flatten: "Flatten",
    _squeeze: "Squeeze Unsqueeze",
    _concat: "Concat",
    _slice: "Slice",
    _gather: "Gather",
    _shape: "Shape",
    _size: "Size",
    _constant_of_shape: "ConstantOfShape",
    _expand: "Expand",
    _tile: "Tile",
    _split: "Split",
    _reduce: (
        "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum "
        "ReduceLogSumExp ReduceSumSquare ArgMax ArgMin"
    ),
    _elementwise: (
        "Add Sub Mul Div Pow Mod Max Min Equal Less Greater LessOrEqual GreaterOrEqual And "
        "Or Xor PRelu BitShift Sum Mean"
    ),
    _not: "Not",
    _where: "Where",
    _matmul: "MatMul MatMulInteger",
    _gemm: "Gemm",
}
for _function, _op_types in _TRANSFERS.items():
    for _op_type in _op_types.split():
        TRANSFER[("", _op_type)] = _function

for _domain, _op_type in RNN_OPS:
    TRANSFER[(_domain, _op_type)] = rnn_output_facts
