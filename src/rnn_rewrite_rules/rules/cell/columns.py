"""Which columns a ``Slice`` of a ``[rows, width]`` value keeps, when it keeps every row:
one gate's block of a projection computed once for every gate (Keras 3's GRU and SimpleRNN
cells as tf2onnx writes them: ``Slice(MatMul(h, R) + b, [0, s], [2**31 - 1, e], [0, 1])``).

The rows: a ``Slice`` whose row axis (0), if named, starts at 0 and ends at ``2**31 - 1``
or more keeps every row of any value with fewer rows. A gate's pre-activation adds this
block to the input's part, ``[batch, width]``: the one value with ``2**31 - 1`` rows or more
the slice would cut is a batch of that size, where the cut block would not broadcast
against the input's part and the original fails. So wherever it runs, the block is
``value[:, s:e]``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array

__all__ = ["ALL_ROWS", "slice_columns"]

#: A rows' end at least this keeps every row (see the module docstring).
ALL_ROWS = 2**31 - 1


def slice_columns(
    node: ir.Node,
    width: int,
    read: Callable[[ir.Value], np.ndarray | None] = const_array,
) -> tuple[int, int] | None:
    """``[s, e)`` of the columns when ``node`` (a ``Slice`` with constant starts, ends,
    axes and steps of 1, of a ``[rows, width]`` value) keeps every row and those
    columns (axis 1 or -1), clamped to ``[0, width]``; None for anything else.
    ``read``: the constant value of a bound (default: a constant or initializer)."""
    if node.op_type != "Slice" or node.domain != "" or node.attributes.get("starts") is not None:
        return None
    arrays = [read(v) if v is not None else None for v in node.inputs[1:]]
    if len(arrays) < 3 or any(a is None for a in arrays[:3]):
        return None
    starts, ends, axes = (np.asarray(a).reshape(-1) for a in arrays[:3])
    if len(arrays) > 3 and arrays[3] is not None and not np.all(arrays[3] == 1):
        return None
    if not len(starts) == len(ends) == len(axes):
        return None
    found = None
    for start, end, axis in zip(starts.tolist(), ends.tolist(), axes.tolist(), strict=True):
        if axis == 0:
            if start != 0 or end < ALL_ROWS:
                return None
        elif axis in (1, -1) and found is None:
            s = max(0, start + width if start < 0 else start)
            e = min(width, end + width if end < 0 else end)
            found = (s, max(s, e))
        else:
            return None
    return found
