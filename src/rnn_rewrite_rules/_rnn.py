"""Static facts about ONNX recurrent nodes that the rule conditions rely on.

Everything here is read from attributes and what the shape prover proves, never from
value-info annotations, so a fact returned is a fact the runtime must honour.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import onnx_ir as ir

if TYPE_CHECKING:
    from rnn_rewrite_rules.shape import ShapeProver

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


def rnn_facts(node: ir.Node | None, prover: ShapeProver | None = None) -> RnnFacts | str:
    """The static facts of an RNN node, or a reason why they cannot be proven.

    ``num_directions`` and ``hidden_size`` come from the attributes and the sizes of
    ``W``/``R`` that ``prover`` proves (pass the check's own to share its work), never
    from value_info.
    """
    if node is None:
        return "value is not produced by a node"
    key = (node.domain, node.op_type)
    if key not in RNN_OPS:
        return f"producer is {node.op_type}, not an RNN op"
    from rnn_rewrite_rules.shape import ShapeProver  # the prover's RNN ops import this module

    sizes = (prover or ShapeProver()).rnn_sizes(node)
    if isinstance(sizes, str):
        return sizes
    return RnnFacts(node, *sizes)


def opset_version(
    model: ir.Model, graph_or_function: ir.Graph | ir.Function, domain: str = ""
) -> int | str:
    """The opset of ``domain`` that nodes emitted into ``graph_or_function`` will use, or
    why no emitted form is safe there.

    Subgraphs of If/Loop/Scan use the model's imports (a GraphProto has none; the
    rewriter even writes ``"": 1`` into a subgraph's ``ir`` imports after a rewrite there,
    which must not be read as the opset). A function may import its own version, but ONNX
    Runtime inlines it at the model's version (and the onnx checker rejects the mismatch),
    so an op whose form differs between the two (``Squeeze`` axes) is valid in only one.
    """
    version = model.graph.opset_imports.get(domain, 0)
    if isinstance(graph_or_function, ir.Function):
        own = graph_or_function.opset_imports.get(domain)
        if own is not None and own != version:
            return (
                f"function {graph_or_function.name!r} imports opset {own} of "
                f"{domain or 'ai.onnx'!r} but the model {version}: "
                "an emitted op would be invalid in one of them"
            )
    return version


def const_array(value: ir.Value | None):
    """The numpy value of a constant (initializer or Constant output), else None.

    An initializer that is also a graph input is not a constant: a caller can override it.
    """
    if value is None or value.is_graph_input():  # an initializer listed as input can be fed
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()
