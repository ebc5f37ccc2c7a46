"""Walking and renaming over an ONNX model's graphs and subgraphs."""

from __future__ import annotations

from collections.abc import Iterator

import onnx

__all__ = [
    "all_graphs",
    "all_nodes",
    "has_recurrent_op",
    "main_opset",
    "rename_reads",
    "value_types",
]

RECURRENT_OPS = {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"}


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph in it, outermost first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_graphs(attr.g)
            for sub in attr.graphs:
                yield from all_graphs(sub)


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and its subgraphs."""
    for g in all_graphs(graph):
        yield from g.node


def has_recurrent_op(model: onnx.ModelProto) -> bool:
    """Whether a node (in subgraphs and functions too) is an RNN op: ONNX Runtime may
    abort the process at size 0."""
    nodes = [*all_nodes(model.graph)]
    for function in model.functions:
        for node in function.node:
            nodes.append(node)
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    nodes += all_nodes(sub)
    return any(node.op_type in RECURRENT_OPS for node in nodes)


def main_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset."""
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every read of ``old`` in ``graph`` and its subgraphs (outer-scope reads) becomes
    ``new``; graph outputs named ``old`` are left alone."""
    for g in all_graphs(graph):
        for node in g.node:
            node.input[:] = [new if name == old else name for name in node.input]
        if g is not graph:
            for out in g.output:
                if out.name == old:
                    out.name = new


def value_types(model: onnx.ModelProto) -> dict[str, tuple[int, int | None]]:
    """Element type and rank (None: unknown) of the main graph's values, from ONNX shape
    inference (empty where it fails)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return {}
    result = {}
    graph = inferred.graph
    for info in [*graph.value_info, *graph.input, *graph.output]:
        tensor = info.type.tensor_type
        if tensor.elem_type:
            rank = len(tensor.shape.dim) if tensor.HasField("shape") else None
            result[info.name] = (tensor.elem_type, rank)
    return result
