"""Small int64 constants that rewrites emit (Squeeze axes, Reshape targets)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

__all__ = ["int64_constant"]


def int64_constant(
    op, graph: ir.Graph | ir.Function, values: list[int], *, as_node: bool = False
) -> ir.Value:
    """An int64 1-D constant: a shared initializer of ``graph``, or a ``Constant`` node.

    A function cannot hold initializers, so there (or with ``as_node``) it is a node. An
    initializer with the same values that an earlier rewrite made is reused.
    """
    tensor = ir.tensor(np.array(values, dtype=np.int64))
    if as_node or not isinstance(graph, ir.Graph):
        return op.Constant(value=tensor)
    base = "rnn_rewrite_rules_" + "_".join(str(v) for v in values).replace("-", "m")
    name, index = base, 0
    existing = graph.initializers
    while name in existing:
        value = existing[name]
        if value.const_value is not None and value.const_value.numpy().tolist() == values:
            return value
        index += 1
        name = f"{base}_{index}"
    return op.initializer(tensor, name)
