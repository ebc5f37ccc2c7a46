"""What the normalisation passes share: element types proven from the graph alone, and
replacing a node's output by an equal value while keeping graph outputs' names."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array, replace_node, subgraph_owners
from rnn_rewrite_rules.normalize._journal import Bypassed, Journal, Replaced

__all__ = ["ElementTypes", "bypass", "model_graphs", "names_an_output"]

#: Ops whose outputs have the element type of their first input.
_SAME_AS_FIRST = frozenset(
    {"Abs", "Add", "Clip", "Concat", "Div", "Exp", "Expand", "Flatten", "Gather", "Gemm"}
    | {"GRU", "Identity", "LeakyRelu", "Log", "LSTM", "MatMul", "Max", "Min", "Mul", "Neg"}
    | {"Pow", "Relu", "Reshape", "RNN", "Sigmoid", "Slice", "Softmax", "Split", "Sqrt"}
    | {"Squeeze", "Sub", "Tanh", "Tile", "Transpose", "Unsqueeze"}
)
_BOOLEAN = frozenset(
    {"And", "Equal", "Greater", "GreaterOrEqual", "IsInf", "IsNaN", "Less", "LessOrEqual"}
    | {"Not", "Or", "Xor"}
)
_INT64 = frozenset(("Shape", "Size", "NonZero", "ArgMax", "ArgMin"))


class ElementTypes:
    """Element types from the graph alone: constants' tensors, graph-input declarations
    (a body's included) and op semantics (``Cast``'s ``to``, ``Shape`` is int64, ``Add``
    keeps its input's type, ...), never from value_info. None where not proven."""

    def __init__(self) -> None:
        self._known: dict[ir.Value, ir.DataType | None] = {}

    def __call__(self, value: ir.Value | None) -> ir.DataType | None:
        if value is None:
            return None
        pending = [value]
        while pending:  # iterative: unrolled graphs are deeper than Python's stack
            top = pending[-1]
            if top in self._known:
                pending.pop()
                continue
            needed = [v for v in self._operands(top) if v is not None and v not in self._known]
            if needed:
                pending.extend(needed)
                continue
            self._known[top] = self._infer(top)
            pending.pop()
        return self._known[value]

    @staticmethod
    def _operands(value: ir.Value) -> list[ir.Value | None]:
        node = value.producer()
        if node is None or const_array(value) is not None:
            return []
        if node.op_type in _SAME_AS_FIRST and node.domain == "":
            return [node.inputs[0]] if node.inputs else []
        if node.op_type == "Where":
            return [node.inputs[1]]
        if node.op_type == "CastLike":
            return [node.inputs[1]]
        return []

    def _infer(self, value: ir.Value) -> ir.DataType | None:
        tensor = ir.convenience.get_const_tensor(value) if not value.is_graph_input() else None
        if tensor is not None:
            return tensor.dtype
        node = value.producer()
        if node is None:  # a graph input: its declaration
            return value.dtype if value.is_graph_input() else None
        if node.domain != "":
            return None
        if node.op_type == "Cast":
            return ir.DataType(node.attributes.get_int("to", 0))
        if node.op_type in _INT64:
            return ir.DataType.INT64
        if node.op_type in _BOOLEAN:
            return ir.DataType.BOOL
        operands = self._operands(value)
        return self._known.get(operands[0]) if operands and operands[0] is not None else None


#: Ops whose outputs' declared shapes ONNX Runtime reads at run time: a Loop of zero
#: iterations shapes its empty scan outputs by them, so one must not take a graph
#: output's declaration.
_SHAPED_BY_DECLARATION = frozenset(("Loop", "Scan", "If"))


def _own(value: ir.Value, graph: ir.Graph | ir.Function | None) -> bool:
    """``value`` is computed by a node of ``graph`` (not a control-flow node), is none of
    its outputs and is read only by the node bypassed: taking a graph output's declared
    shape must not change what ONNX Runtime infers for other readers (a zero-iteration
    Loop's empty stack is shaped by its body output's inferred shape)."""
    node = value.producer()
    return (
        node is not None
        and node.graph is graph
        and not value.is_graph_output()
        and not (node.op_type in _SHAPED_BY_DECLARATION and node.domain == "")
        and len(value.uses()) == 1
    )


def bypass(
    node: ir.Node,
    value: ir.Value,
    journal: Journal | None = None,
    chain: Sequence[ir.Node] = (),
) -> bool:
    """Let the readers of ``node``'s one output read ``value`` (equal to it) instead and
    remove ``node``; True when the graph changed. ``journal`` records the edit, to undo it
    where no rule used it; ``chain``: nodes between ``value`` and ``node`` (a round
    trip's first Cast) to put back with it.

    A graph output keeps its name: ``value`` takes it when computed in the same graph and
    not itself an output; otherwise an ``Identity`` (kept as it is, or put in the node's
    place) stays between them, as ONNX Runtime needs where a body passes an input or an
    outer value through.
    """
    graph = node.graph
    out = node.outputs[0]
    if graph is None:
        return False
    was_output = out.is_graph_output()
    if not was_output or _own(value, graph):
        readers = list(out.uses())
        outputs = [i for i, o in enumerate(graph.outputs) if o is out]
        declaration = (value.name, value.type, value.shape) if was_output else None
        name = out.name
        ir.convenience.replace_all_uses_with(out, value, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        if was_output:  # the output's declaration (name, type, shape) stays as it was
            value.name, value.type, value.shape = name, out.type, out.shape
        if journal is not None:
            edit = Bypassed(graph, [*chain, node], value, readers, outputs, declaration)
            journal.record(edit)
        return True
    if node.op_type == "Identity":
        return False
    inputs = list(node.inputs)
    identity = ir.Node("", "Identity", [value], name=node.name)
    graph.insert_after(node, identity)
    replace_node(node, identity.outputs[0])
    if journal is not None:
        journal.record(Replaced(graph, node, inputs, identity))
    return True


def names_an_output(node: ir.Node, model: ir.Model) -> bool:
    """``node``'s output is an output of the model's graph or of a function: there the
    node stays, so the output keeps its producer's name and declaration (a rule that
    rewrites what it reads leaves it, as it would without normalisation). Bodies' outputs
    are bypassed: the Loop and Scan rules read the recurrence there."""
    graph = node.graph
    tops = (model.graph, *model.functions.values())
    return any(graph is top for top in tops) and any(o.is_graph_output() for o in node.outputs)


def model_graphs(model: ir.Model) -> list[ir.Graph | ir.Function]:
    """The model's graph, functions and every subgraph in them."""
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for top in list(graphs):
        graphs.extend(subgraph_owners(top))
    return graphs
