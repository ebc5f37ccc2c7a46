"""ONNX shape semantics on symbolic sizes, each written once: Reshape, broadcasting, Slice.

The transfer functions in :mod:`.ops` and the rules that build new shape targets both
use these, so a proof and the replacement it justifies read one definition.
"""

from __future__ import annotations

from collections.abc import Sequence

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.shape.dim import ONE, Dim, known, product

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "broadcast",
    "clamp_bounds",
    "normalize_axes",
    "reshape",
    "slice_indices",
    "slice_length",
]

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def normalize_axes(axes: Sequence[int], rank: int) -> list[int] | None:
    """Axes in ``[0, rank)`` (negatives counted from the end), None if out of range or repeated."""
    result = [a + rank if a < 0 else a for a in axes]
    if any(not 0 <= a < rank for a in result) or len(set(result)) != len(result):
        return None
    return result


def reshape(
    input_dims: Sequence[Dim | None], target: Sequence[Dim | None], allowzero: int
) -> tuple[Dim | None, ...] | Refusal:
    """The output sizes of ``Reshape(input, target)``, or why the target is invalid.

    An element (or input size) that is None is unknown, and so is its output size. A
    ``0`` copies the input's size at that position unless ``allowzero``; a computed
    element that may be 0 at run time (a size read with ``Shape``) therefore yields a
    known size only when it equals the input's size there, so both readings agree.
    ``-1`` is the input's element count divided by the others' product; the result holds
    wherever the runtime accepts the reshape (it rejects ``-1`` next to a zero-sized
    element).
    """
    out: list[Dim | None] = []
    infer = None
    for i, element in enumerate(target):
        copy = input_dims[i] if i < len(input_dims) else None
        value = None if element is None else element.value
        if element is None:
            out.append(None)
        elif value == -1:
            if infer is not None:
                return Refusal("more than one -1 in the target")
            infer = i
            out.append(None)
        elif value is not None and value < -1:
            return Refusal(f"negative target element {value}")
        elif value == 0 and not allowzero:
            if copy is None:
                return Refusal(
                    f"target element {i} is 0 but the input has only {len(input_dims)} axes"
                )
            out.append(copy)
        elif value is not None:
            out.append(element)
        elif not element.nonnegative:
            out.append(None)  # may be negative (-1 infers) or 0: unknown
        elif allowzero or element.positive or element == copy:
            out.append(element)
        else:
            out.append(None)  # a computed 0 would copy another size
    if infer is not None:
        sizes, others = known(input_dims), known([d for i, d in enumerate(out) if i != infer])
        if sizes is not None and others is not None:
            divisor = product(others)
            out[infer] = product(sizes).divide(divisor) if len(divisor.terms) == 1 else None
    return tuple(out)


def broadcast(*shapes: Sequence[Dim]) -> tuple[Dim | None, ...]:
    """Multidirectional (numpy) broadcasting; a size is None where it cannot be proven."""
    rank = max(len(s) for s in shapes)
    padded = [[ONE] * (rank - len(s)) + list(s) for s in shapes]
    out: list[Dim | None] = []
    for sizes in zip(*padded, strict=True):
        others = {d for d in sizes if d != ONE}
        out.append(others.pop() if len(others) == 1 else ONE if not others else None)
    return tuple(out)


def slice_length(size: Dim, start: int, end: int, step: int) -> Dim | None:
    """The length of ``Slice`` along an axis of ``size`` with constant bounds (ONNX clamping)."""
    n = size.value
    if n is not None:
        return Dim.const(len(_clamped_range(n, start, end, step)))
    if step == 1 and start == 0 and end >= INT64_MAX // 2:
        return size  # everything
    if step == -1 and start == -1 and end <= INT64_MIN // 2:
        return size  # everything, reversed
    return None


def clamp_bounds(n: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice's effective ``start`` and ``end`` for an axis of length ``n``."""
    if step == 0:
        raise ValueError("Slice step 0")
    start += n if start < 0 else 0
    end += n if end < 0 else 0
    if step > 0:
        return min(max(start, 0), n), min(max(end, 0), n)
    return min(max(start, -1), n - 1), min(max(end, -1), n - 1)


def _clamped_range(n: int, start: int, end: int, step: int) -> range:
    start, end = clamp_bounds(n, start, end, step)
    return range(start, end, step)


def slice_indices(n: int, start: int, end: int, step: int) -> list[int]:
    """The indices ``Slice`` reads along an axis of constant length ``n``."""
    return list(_clamped_range(n, start, end, step))
