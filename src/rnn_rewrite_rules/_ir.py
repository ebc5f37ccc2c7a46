"""IR helpers that are not about recurrent ops: constant values, dtypes, opset versions,
value names no value of a graph or model uses."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal

__all__ = [
    "NUMPY_DTYPES",
    "const_array",
    "free_name",
    "fresh_name",
    "input_at",
    "opset_version",
    "replace_node",
    "same_bits",
    "subgraph_owners",
    "taken_names",
]

#: Element types with a native numpy dtype (what runs, casts and random feeds use).
NUMPY_DTYPES = frozenset(
    {
        ir.DataType.FLOAT,
        ir.DataType.DOUBLE,
        ir.DataType.FLOAT16,
        ir.DataType.INT8,
        ir.DataType.INT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.UINT8,
        ir.DataType.UINT16,
        ir.DataType.UINT32,
        ir.DataType.UINT64,
        ir.DataType.BOOL,
    }
)


def opset_version(
    model: ir.Model, graph_or_function: ir.Graph | ir.Function, domain: str = ""
) -> int | Refusal:
    """The opset of ``domain`` that nodes emitted into ``graph_or_function`` will use, or
    why no emitted form is safe there.

    Subgraphs of If/Loop/Scan use the imports of what holds them, the model's or a
    function's (a GraphProto has none; the rewriter even writes ``"": 1`` into a
    subgraph's ``ir`` imports after a rewrite there, which must not be read as the
    opset). A function may import its own version, but ONNX Runtime inlines it at the
    model's version (and the onnx checker rejects the mismatch), so an op whose form
    differs between the two (``Squeeze`` axes) is valid in only one.
    """
    version = model.graph.opset_imports.get(domain, 0)
    function: ir.Graph | ir.Function | None = graph_or_function
    if isinstance(graph_or_function, ir.Graph) and graph_or_function is not model.graph:
        function = _enclosing_function(model, graph_or_function)  # a subgraph in a function
    if isinstance(function, ir.Function):
        own = function.opset_imports.get(domain)
        if own is not None and own != version:
            return Refusal(
                f"function {function.name!r} imports opset {own} of "
                f"{domain or 'ai.onnx'!r} but the model {version}: "
                "an emitted op would be invalid in one of them"
            )
    return version


def _enclosing_function(model: ir.Model, subgraph: ir.Graph) -> ir.Function | None:
    """The function of ``model`` whose nodes hold ``subgraph`` (at any depth), if any."""
    for function in model.functions.values():
        if subgraph in subgraph_owners(function):
            return function
    return None


def subgraph_owners(graph: ir.Graph | ir.Function) -> dict[ir.Graph, ir.Node]:
    """Every subgraph under ``graph`` (at any depth) -> the node whose attribute holds it
    (onnx-ir keeps no link from a graph to its owner)."""
    owners: dict[ir.Graph, ir.Node] = {}
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                owners[attr.as_graph()] = node
            elif attr.type == ir.AttributeType.GRAPHS:
                owners.update(dict.fromkeys(attr.as_graphs(), node))
    return owners


def input_at(node: ir.Node, index: int) -> ir.Value | None:
    """Input ``index`` of ``node``; None when it is empty or past the last input."""
    return node.inputs[index] if index < len(node.inputs) else None


def const_array(value: ir.Value | None):
    """The numpy value of a constant (initializer or Constant output), else None.

    An initializer that is also a graph input is not a constant: a caller can override it.
    """
    if value is None or value.is_graph_input():  # an initializer listed as input can be fed
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def same_bits(a, b) -> bool:
    """``a`` and ``b`` are one constant: the same dtype, shape and bits.

    The one equality for constants and attribute values. ``np.array_equal`` takes
    ``+0.0`` and ``-0.0`` for one value (``1 / x`` tells them apart) and no NaN for
    itself; here two floats are the same only when their bits are (NaN payloads
    included). Python floats compare as float64 (an ONNX float attribute is a float32,
    which float64 holds exactly); strings and other object arrays compare by value.
    """
    x, y = np.asarray(a), np.asarray(b)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if x.dtype.kind in "OUS":
        return bool(np.array_equal(x, y))
    return np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()


def taken_names(scope: ir.Graph | ir.Model) -> set[str]:
    """Every value name of a graph and the subgraphs in it (ONNX forbids shadowing), or of
    a model's graph and its functions: inputs, outputs, initializers and node values."""
    scopes: list[ir.Graph | ir.Function] = (
        [scope.graph, *scope.functions.values()] if isinstance(scope, ir.Model) else [scope]
    )
    names: set[str] = set()
    for graph_like in scopes:
        names.update(v.name for v in (*graph_like.inputs, *graph_like.outputs) if v.name)
        if isinstance(graph_like, ir.Graph):
            names.update(name for name in graph_like.initializers if name)
        for node in ir.traversal.RecursiveGraphIterator(graph_like):
            names.update(v.name for v in node.outputs if v is not None and v.name)
            names.update(v.name for v in node.inputs if v is not None and v.name)
    return names


def fresh_name(scope: ir.Graph | ir.Model, base: str) -> str:
    """``base``, or ``base_1``, ``base_2`` ...: the first name no value of ``scope`` (a
    graph and its subgraphs, or a whole model with its functions) uses."""
    return free_name(taken_names(scope), base)


def free_name(taken: set[str], base: str) -> str:
    """``base``, or ``base_1``, ``base_2`` ...: the first name not in ``taken``."""
    name, index = base, 0
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    return name


def name_values(nodes: list[ir.Node], model: ir.Model, base: str) -> None:
    """Name the unnamed outputs of ``nodes``, new in a subgraph, with names no value of
    ``model`` has (the rewriter names the values of the graph it rewrites only)."""
    taken = taken_names(model)
    index = 0
    for node in nodes:
        for value in node.outputs:
            while value.name is None or value.name in taken:
                value.name = f"{base}_{index}"
                index += 1
            taken.add(value.name)


def replace_node(node: ir.Node, result: ir.Value) -> None:
    """Remove ``node`` (in a graph, one output) and let every reader of its output (graph
    outputs too) read ``result`` (computed in the same graph, equal to it), which takes the
    output's name, type and shape."""
    graph = node.graph
    if graph is None:
        raise ValueError(f"{node.name}: not in a graph")
    out = node.outputs[0]
    result.type, result.shape = out.type, out.shape
    name = out.name
    ir.convenience.replace_all_uses_with(out, result, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    result.name = name
