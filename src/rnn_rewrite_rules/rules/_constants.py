"""Small int64 constants that rewrites emit (Squeeze axes, Reshape targets), safely named."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

__all__ = ["cached_ints", "fresh_name", "int64_constant"]


def _taken_names(graph: ir.Graph) -> set[str]:
    """Every value name of ``graph`` and the subgraphs in it (ONNX forbids shadowing)."""
    names = {v.name for v in graph.inputs if v.name}
    names.update(name for name in graph.initializers if name)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        names.update(v.name for v in node.outputs if v is not None and v.name)
        names.update(v.name for v in node.inputs if v is not None and v.name)
    return names


def fresh_name(graph: ir.Graph, base: str) -> str:
    """``base``, or ``base_1``, ``base_2`` ...: the first name no value of ``graph`` uses."""
    taken = _taken_names(graph)
    name, index = base, 0
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    return name


def int64_constant(
    op, graph: ir.Graph | ir.Function, values: list[int], *, as_node: bool = False
) -> ir.Value:
    """An int64 1-D constant: a shared initializer of the main ``graph``, or a ``Constant``.

    Pass ``as_node`` for a subgraph (its names must be unique across the whole model, which
    only the main graph can tell); a function cannot hold initializers either. An
    initializer with the same values that an earlier rewrite made is reused; one that is
    also a graph input is not (a caller may override it), and a new name never collides
    with a graph input, an initializer or any other value.
    """
    tensor = ir.tensor(np.array(values, dtype=np.int64))
    if as_node or not isinstance(graph, ir.Graph):
        return op.Constant(value=tensor)
    base = "rnn_rewrite_rules_" + "_".join(str(v) for v in values).replace("-", "m")
    name, index = base, 0
    while name in graph.initializers:
        value = graph.initializers[name]
        if (
            not value.is_graph_input()
            and value.const_value is not None
            and value.const_value.dtype == ir.DataType.INT64
            and value.const_value.numpy().tolist() == values
        ):
            return value
        index += 1
        name = f"{base}_{index}"
    return op.initializer(tensor, fresh_name(graph, name))


def cached_ints(
    op,
    graph: ir.Graph | ir.Function,
    cache: dict[tuple[int, ...], ir.Value],
    values: list[int],
    *,
    as_node: bool = False,
) -> ir.Value:
    """:func:`int64_constant`, once per value list and rewrite (``cache``): the rewriter adds
    a rewrite's initializers after it, so a second lookup would not find the first."""
    key = tuple(values)
    if key not in cache:
        cache[key] = int64_constant(op, graph, values, as_node=as_node)
    return cache[key]
