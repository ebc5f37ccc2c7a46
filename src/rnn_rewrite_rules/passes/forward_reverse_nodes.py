"""Run the reverse LSTM/GRU/RNN nodes the rules emitted forward over the reversed sequence,
where a runtime of the target computes ``direction="reverse"`` wrongly.

tract 0.23.9 runs ``direction="reverse"`` as ``"forward"`` (``rules._kernels
.WRONG_DIRECTIONS``) and ``"bidirectional"`` right. The rules emit reverse nodes (loop_scan
for a Keras ``go_backwards`` Loop, reroll for a reversed unrolled chain) and do not refuse
them: a forward + reverse pair is merged into one bidirectional node afterwards. Only a
reverse node left alone at the end is wrong there, so this pass runs after the rules
(:func:`rnn_rewrite_rules._api.cleanup`).

Pattern: an LSTM/GRU/RNN node a rule built (marked ``_rnn_ops.RULE_MADE`` in memory by
the builder, and carried to a node re-emitted in its place; a model's own node a rule
re-emits is not marked: the original runs it so in tract too), in any graph, subgraph or
function, with ``direction="reverse"``, no ``sequence_lens`` input, in a graph importing
opset 10 or later of the ONNX domain (a negative-step ``Slice``). The mark lives in the
``ir`` model of one rewrite: a model read back from a file has none, so a second rewrite
converts nothing more.

Condition: ``wrong_direction("reverse", targets)`` names a runtime.

Replacement: the node made ``direction="forward"``, reading
``X' = Slice(X, starts=[-1], ends=[INT64_MIN], axes=[t], steps=[-1])`` (``t`` the time
axis: 0, or 1 with ``layout=1``); ``Y``'s readers (and the graph output it is) read the
same reversal of the forward node's ``Y``, under ``Y``'s name.

Equality: a reverse node's step ``k`` reads ``x[T-1-k]`` from the initial states and writes
``Y[T-1-k]``; the forward node over ``X'`` reads ``X'[k] = x[T-1-k]`` from the same initial
states and writes ``Y_fwd[k]``, so ``Y = reversed(Y_fwd)``, and both end on ``x[0]``:
``Y_h`` and ``Y_c`` are equal. At ``T = 0`` both slices are empty and so are both ``Y``.
A node with ``sequence_lens`` reverses each batch row within its own length, which one
``Slice`` does not: it is left.
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._rnn_ops import is_rnn, is_rule_made
from rnn_rewrite_rules.passes._placer import Placer
from rnn_rewrite_rules.passes.unique_rewritten_node_names import model_nodes
from rnn_rewrite_rules.rules._initializers import int64_constant
from rnn_rewrite_rules.rules._kernels import wrong_direction
from rnn_rewrite_rules.shape.semantics import INT64_MIN

__all__ = ["ForwardReverseNodesPass"]

#: The lowest opset whose ``Slice`` takes ``steps`` (a negative step reverses).
_NEGATIVE_STEP_SLICE = 10


class ForwardReverseNodesPass(ir.passes.InPlacePass):
    """Rule-built reverse recurrent nodes made forward over the reversed sequence, for
    ``targets`` on which a runtime runs ``direction="reverse"`` wrongly (see module docs)."""

    def __init__(self, targets: tuple[str, ...]):
        super().__init__()
        self._targets = targets

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if wrong_direction("reverse", self._targets) is None:
            return ir.passes.PassResult(model, modified=False)
        functions = {id(g): f for f in model.functions.values() for g in _graphs(f)}
        modified = False
        for node in model_nodes(model):
            if not (is_rule_made(node) and _lone_reverse(node)) or node.graph is None:
                continue
            owner = functions.get(id(node.graph))
            imports = model.opset_imports if owner is None else owner.opset_imports
            if imports.get("", imports.get("ai.onnx", 0)) < _NEGATIVE_STEP_SLICE:
                continue
            _run_forward(node, node.graph, node.graph is model.graph)
            modified = True
        return ir.passes.PassResult(model, modified=modified)


def _graphs(function: ir.Function) -> list[ir.Graph]:
    """The function's graph and every subgraph in it."""
    graphs = [function.graph]
    for node in ir.traversal.RecursiveGraphIterator(function):
        if node.graph is not None and node.graph not in graphs:
            graphs.append(node.graph)
    return graphs


def _lone_reverse(node: ir.Node) -> bool:
    """An LSTM/GRU/RNN of the ONNX domain, ``direction="reverse"``, no ``sequence_lens``."""
    if not is_rnn(node) or node.domain not in ("", "ai.onnx"):
        return False
    if node.attributes.get_string("direction", "forward") != "reverse":
        return False
    return not (len(node.inputs) > 4 and node.inputs[4] is not None)


def _run_forward(node: ir.Node, graph: ir.Graph, in_main_graph: bool) -> None:
    """``node`` made forward over its reversed ``X``; ``Y``'s readers read it reversed."""
    axis = 1 if node.attributes.get_int("layout", 0) else 0
    name = node.name or node.op_type
    placer = Placer(graph, node, f"{name}/reverse_constant")
    operands = [
        int64_constant(placer, graph, [value], as_node=not in_main_graph)
        for value in (-1, INT64_MIN, axis, -1)
    ]
    x = node.inputs[0]
    assert x is not None  # X is a required input
    slice_x = ir.node("Slice", [x, *operands], name=f"{name}/reverse_X")
    slice_x.outputs[0].name = f"{name}/X_reversed"
    slice_x.outputs[0].type, slice_x.outputs[0].shape = x.type, x.shape
    graph.insert_before(node, slice_x)
    node.replace_input_with(0, slice_x.outputs[0])
    node.attributes["direction"] = ir.AttrString("direction", "forward")
    y = node.outputs[0]
    if not y.uses() and not y.is_graph_output():
        return
    readers = list(y.uses())
    slice_y = ir.node("Slice", [y, *operands], name=f"{name}/reverse_Y")
    reversed_y = slice_y.outputs[0]
    reversed_y.type, reversed_y.shape = y.type, y.shape
    graph.insert_after(node, slice_y)
    for reader, index in readers:
        reader.replace_input_with(index, reversed_y)
    for index, output in enumerate(graph.outputs):
        if output is y:
            graph.outputs[index] = reversed_y
    y_name = y.name
    y.name = f"{y_name}_forward" if y_name else None
    reversed_y.name = y_name
