"""Static facts about ONNX recurrent nodes that the rule conditions rely on.

Everything here is read from attributes and constant shapes only, never from
value-info annotations, so a fact returned is a fact the runtime must honour.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

__all__ = [
    "DIRECTIONS",
    "NUMPY_DTYPES",
    "RNN_OPS",
    "RnnFacts",
    "const_array",
    "opset_version",
    "rnn_facts",
]

#: (domain, op_type) -> number of gates per direction in W/R.
RNN_OPS: dict[tuple[str, str], int] = {
    ("", "LSTM"): 4,
    ("", "GRU"): 3,
    ("", "RNN"): 1,
    ("com.microsoft", "DynamicQuantizeLSTM"): 4,
}

#: direction attribute -> number of directions.
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


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


@dataclasses.dataclass(frozen=True)
class RnnFacts:
    """What an RNN node fixes statically about its ``Y`` output."""

    node: ir.Node
    num_directions: int
    hidden_size: int
    layout: int

    @property
    def op_type(self) -> str:
        return self.node.op_type


def _static_dim(value: ir.Value | None, axis: int) -> int | None:
    if value is None:
        return None
    # An initializer that is also a graph input can be overridden: only its declared shape holds.
    tensor = None if value.is_graph_input() else ir.convenience.get_const_tensor(value)
    if tensor is not None:
        dims = tensor.shape.dims
        return int(dims[axis]) if len(dims) > axis else None
    shape = value.shape
    if shape is not None and len(shape) > axis and isinstance(shape[axis], int):
        # A graph input or computed weight with a declared static shape: the
        # runtime rejects a tensor that disagrees, so the dim is a fact.
        return shape[axis]
    return None


def rnn_facts(node: ir.Node | None) -> RnnFacts | str:
    """The static facts of an RNN node, or a reason why they cannot be proven."""
    if node is None:
        return "value is not produced by a node"
    key = (node.domain, node.op_type)
    if key not in RNN_OPS:
        return f"producer is {node.op_type}, not an RNN op"
    direction_attr = node.attributes.get("direction")
    direction = direction_attr.as_string() if direction_attr is not None else "forward"
    if direction not in DIRECTIONS:
        return f"unknown direction {direction!r}"
    num_directions = DIRECTIONS[direction]
    layout = node.attributes.get_int("layout", 0)

    # W: [D, G*H, I] and R: [D, G*H, H]; DynamicQuantizeLSTM stores them transposed.
    r = node.inputs[2] if len(node.inputs) > 2 else None
    w = node.inputs[1] if len(node.inputs) > 1 else None
    r_directions = _static_dim(r, 0)
    w_directions = _static_dim(w, 0)
    for found in (r_directions, w_directions):
        if found is not None and found != num_directions:
            return f"direction {direction!r} disagrees with a weight of {found} directions"

    hidden_attr = node.attributes.get("hidden_size")
    hidden = hidden_attr.as_int() if hidden_attr is not None else None
    r_hidden = _static_dim(r, 2) if node.domain == "" else _static_dim(r, 1)
    if hidden is None:
        hidden = r_hidden
    elif r_hidden is not None and r_hidden != hidden:
        return f"hidden_size={hidden} disagrees with R's hidden dim {r_hidden}"
    if hidden is None or hidden <= 0:
        return "hidden_size is not static (no attribute, R has no static shape)"
    return RnnFacts(node, num_directions, hidden, layout)


def opset_version(
    model: ir.Model, graph_or_function: ir.Graph | ir.Function, domain: str = ""
) -> int:
    """The opset of ``domain`` that nodes emitted into ``graph_or_function`` will use.

    Subgraphs of If/Loop/Scan use the model's imports (a GraphProto has none; the
    rewriter even writes ``"": 1`` into a subgraph's ``ir`` imports after a rewrite there,
    which must not be read as the opset). Only a function has imports of its own.
    """
    if isinstance(graph_or_function, ir.Function):
        version = graph_or_function.opset_imports.get(domain)
        if version is not None:
            return version
    return model.graph.opset_imports.get(domain, 0)


def const_array(value: ir.Value | None):
    """The numpy value of a constant (initializer or Constant output), else None.

    An initializer that is also a graph input is not a constant: a caller can override it.
    """
    if value is None or value.is_graph_input():  # an initializer listed as input can be fed
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()
