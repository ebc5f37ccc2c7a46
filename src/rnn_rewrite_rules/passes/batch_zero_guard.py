"""Keep the LSTM/GRU nodes the rules built in place of ops that run at batch 0 from batch 0,
where ONNX Runtime aborts the process on them.

ONNX Runtime 1.32 aborts the process (``terminate called without an active exception``,
not an error a caller can catch) on an LSTM or GRU node whose ``X`` has batch 0, with or
without states and ``sequence_lens`` (its RNN runs). The unrolled steps, the streaming
step and the Loop without a zero-step guard that the rules replace run there and give
empty outputs: unguarded, the rewrite kills a process the original served.

Pattern: an LSTM/GRU node of the ONNX domain (or ``com.microsoft.DynamicQuantizeLSTM``,
what ``quantize`` makes of a guarded LSTM: it aborts there too) marked
``_rnn_ops.REPLACES_BATCH_0_RUN`` (in memory by the rule that built it: ``reroll``, a
``loop_scan`` node without its own guard, ``one_step``'s streaming node; carried to a
node re-emitted or merged in its place; by ``quantize`` on the node it re-guards), in any
graph, subgraph or function, ``layout`` 0, with an input size of at least 1 (the rules refuse a
cell reading no input: ``rules.cell.EMPTY_INPUT_REASON``), after the rules
(:func:`rnn_rewrite_rules._api.cleanup`, after ``ForwardReverseNodesPass``).

Condition: its batch is not proven a number >= 1 (the shape prover of the main graph, for
a node in it; a node elsewhere is guarded).

Replacement: ``If(Equal(Size(X), [0]))``: the ``then`` branch gives each read output at
batch 0: ``Y_h`` (``Y_c``) the node's ``initial_h`` (``initial_c``), else zeros ``[D, b,
H]``, and ``Y`` zeros ``[T, D, b, H]``, ``T`` and ``b`` read from ``Shape(X)`` (tract
unifies the branches' output shapes: a constant 0 batch would contradict the node's
symbolic one); the ``else`` branch holds the node unchanged. The If's outputs take the
read outputs' names (a graph output stays one). Two nodes run outside the If per call:
``Size`` and ``Equal``.

Equality: with input size ``I >= 1``, ``X`` is empty exactly where its length ``T`` or
its batch is 0. Where the batch is not 0 and ``T`` is not 0 the node runs as before. At
batch 0 (``T >= 1``), the node would give ``Y`` ``[T, D, 0, H]`` and ``Y_h``/``Y_c`` ``[D,
0, H]`` (its initial states have its batch: 0), what the replaced ops' outputs are read
from (at every batch the readers map them to the original's outputs): the ``then``
branch gives those shapes, with no element. At ``T = 0`` the marked nodes' originals do
not run (``reroll`` reads ``x[t]`` of each of its ``T >= 2`` steps, a Loop without a
guard has a constant trip count of steps each reading ``x[t]``, or fails at 0 steps;
``one_step``'s ``X`` is ``Unsqueeze(x_t, 0)``: ``T`` is 1).

Zeros are ``ConstantOfShape``, before opset 9 ``Tile`` of a zero, its int64 operands
initializers of the main graph (a ``Constant`` holds no int64 before opset 9): a node in
a subgraph before opset 9, or in a graph before opset 7 (``rnn-rewrite`` reads opset 7
and later), is left unguarded. ``one_step`` counts the guard in its node budget and
decides on tables measured with it: a streaming step is one call per frame, where the
``If`` costs most (1.27x a bare GRU node at hidden 8, seq 1).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import onnx
import onnx_ir as ir

from rnn_rewrite_rules._ir import free_name, opset_version, taken_names
from rnn_rewrite_rules._rnn_ops import REPLACES_BATCH_0_RUN, replaces_batch_0_run
from rnn_rewrite_rules.passes._placer import Placer
from rnn_rewrite_rules.passes.unique_rewritten_node_names import model_nodes
from rnn_rewrite_rules.rules._initializers import int64_constant
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["GUARD_BRANCHES", "BatchZeroGuardPass", "guarded_branch"]

#: The suffixes of the guard's branch names: ``then`` (batch 0), ``else`` (the node).
GUARD_BRANCHES = ("batch_0", "batch_not_0")
#: The ops guarded (ONNX Runtime aborts on each at batch 0) -> the axis of ``W`` that is
#: the input size (``DynamicQuantizeLSTM``'s ``W`` is ``[D, I, 4H]``: ``quantize``).
_GUARDED_OPS = {("", "LSTM"): 2, ("", "GRU"): 2, ("com.microsoft", "DynamicQuantizeLSTM"): 1}
#: The first opset guarded (``Tile`` of a zero, ``Equal`` of int64), the first with
#: ``ConstantOfShape``, and the first with ``Shape``'s ``start`` and ``end``.
_FIRST_OPSET = 7
_CONSTANT_OF_SHAPE = 9
_SHAPE_SLICE = 15


class BatchZeroGuardPass(ir.passes.InPlacePass):
    """Marked LSTM/GRU nodes whose batch may be 0 put in an ``If`` that gives their empty
    outputs at batch 0 (see module docs)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        marked = [node for node in model_nodes(model) if _marked(node)]
        if not marked:
            return ir.passes.PassResult(model, modified=False)
        prover = ShapeProver(model.graph)
        taken = taken_names(model)
        modified = False
        for node in marked:
            del node.meta[REPLACES_BATCH_0_RUN]  # guarded once: a second pass adds none
            graph = node.graph
            assert graph is not None  # model_nodes: a node of a graph
            in_main = graph is model.graph
            if in_main and _batch_at_least_1(prover, node):
                continue
            opset = opset_version(model, graph)
            if isinstance(opset, int) and _writable(opset, in_main):
                modified |= _guard(node, graph, in_main, opset, taken)
        return ir.passes.PassResult(model, modified=modified)


def guarded_branch(node: onnx.NodeProto) -> onnx.GraphProto | None:
    """``node``'s ``else`` branch (the guarded node's) where ``node`` is a guard this pass
    wrote (in a serialized model), else None."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
        return None
    branch = next((a.g for a in node.attribute if a.name == "else_branch"), None)
    return branch if branch is not None and branch.name.endswith(GUARD_BRANCHES[1]) else None


def _writable(opset: int, in_main: bool) -> bool:
    """Whether the guard can be written at ``opset`` (before opset 9 its int64 constants
    are the main graph's initializers: a node of the main graph only)."""
    return opset >= _CONSTANT_OF_SHAPE or (opset >= _FIRST_OPSET and in_main)


def _marked(node: ir.Node) -> bool:
    """A marked LSTM/GRU node of the ONNX domain, ``layout`` 0, reading ``X`` and a ``W``
    of input size >= 1."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    input_axis = _GUARDED_OPS.get((domain, node.op_type))
    if not replaces_batch_0_run(node) or input_axis is None:
        return False
    if node.attributes.get_int("layout", 0) != 0:
        return False
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return False
    w = node.inputs[1].shape
    size = None if w is None or len(w) != 3 else w[input_axis]
    return isinstance(size, int) and size >= 1


def _batch_at_least_1(prover: ShapeProver, node: ir.Node) -> bool:
    x = node.inputs[0]
    assert x is not None
    batch = prover.dim(x, 1)
    return batch is not None and batch.value is not None and batch.value >= 1


def _guard(node: ir.Node, graph: ir.Graph, in_main: bool, opset: int, taken: set[str]) -> bool:
    """Put ``node`` in the guard's ``else`` branch; False where no output is read."""
    read = [v for v in node.outputs if v.uses() or v.is_graph_output()]
    if not read:
        return False
    x = node.inputs[0]
    assert x is not None
    name = node.name or node.op_type
    placer = Placer(graph, node, f"{name}/batch_0_constant")
    zero = int64_constant(placer, graph, [0], as_node=not in_main)
    size = ir.node("Size", [x], name=f"{name}/batch_0_size")
    test = ir.node("Equal", [size.outputs[0], zero], name=f"{name}/batch_0_test")
    # before opset 9 a Constant holds no int64: the branch reads the main graph's
    # (_writable: a node of the main graph there)
    initializer = partial(int64_constant, placer, graph) if opset < _CONSTANT_OF_SHAPE else None
    empty_nodes, empty = _empty_outputs(node, read, opset, initializer)
    for value in (size.outputs[0], test.outputs[0], *(v for n in empty_nodes for v in n.outputs)):
        value.name = _fresh(taken, f"{name}/batch_0")
    graph.insert_before(node, [size, test])
    graph.remove(node)
    branches = (
        ir.Graph((), empty, nodes=empty_nodes, name=f"{name}_{GUARD_BRANCHES[0]}"),
        ir.Graph((), read, nodes=[node], name=f"{name}_{GUARD_BRANCHES[1]}"),
    )
    guard = ir.node(
        "If",
        [test.outputs[0]],
        {"then_branch": branches[0], "else_branch": branches[1]},
        num_outputs=len(read),
        name=f"{name}/batch_0_guard",
    )
    graph.insert_after(test, guard)
    for old, new in zip(read, guard.outputs, strict=True):
        _take_place(graph, old, new, taken)
    return True


def _empty_outputs(
    node: ir.Node, read: list[ir.Value], opset: int, initializer: Callable | None
) -> tuple[list[ir.Node], list[ir.Value]]:
    """The nodes of the ``then`` branch and its outputs: each of ``read`` at batch 0, a
    state the node's initial state (``[D, 0, H]`` there), else zeros of its shape at
    ``X``'s length and batch; int64 constants by ``initializer`` where given (the main
    graph's, before opset 9), else ``Constant`` nodes."""
    x = node.inputs[0]
    assert x is not None
    hidden = node.attributes.get_int("hidden_size", 0)
    directions = 2 if node.attributes.get_string("direction", "forward") == "bidirectional" else 1
    dtype = _dtype(node)
    nodes: list[ir.Node] = []
    made: dict[str, ir.Value] = {}

    def last(new: ir.Node) -> ir.Value:
        nodes.append(new)
        return new.outputs[0]

    def ints(values: list[int]) -> ir.Value:
        if initializer is not None:
            return initializer(values)
        return last(ir.node("Constant", [], {"value": ir.tensor(np.array(values, np.int64))}))

    def axis(index: int) -> ir.Value:  # [size of X's axis]
        if str(index) in made:
            return made[str(index)]
        if opset >= _SHAPE_SLICE:
            bounds = {"start": index, "end": index + 1}
            made[str(index)] = last(ir.node("Shape", [x], bounds))
            return made[str(index)]
        if "shape" not in made:
            made["shape"] = last(ir.node("Shape", [x]))
        made[str(index)] = last(ir.node("Gather", [made["shape"], ints([index])], {"axis": 0}))
        return made[str(index)]

    outputs = []
    states = _initial_states(node)
    for index, value in enumerate(node.outputs):
        if value not in read:
            continue
        if index and states[index - 1] is not None:
            out = last(ir.node("Identity", [states[index - 1]]))
        else:
            parts = [axis(1), ints([hidden])]
            parts.insert(0, ints([directions]))
            if index == 0:
                parts.insert(0, axis(0))
            shape = last(ir.node("Concat", parts, {"axis": 0}))
            out = last(_zeros(shape, len(parts), dtype, opset, last))
        # OpenVINO compiles an If whose branch outputs have a type and a rank
        rank = [None, directions, None, hidden] if index == 0 else [directions, None, hidden]
        for typed in (out, value):
            typed.type = value.type or ir.TensorType(ir.DataType.from_numpy(dtype))
            typed.shape = value.shape or ir.Shape(rank)
        outputs.append(out)
    return nodes, outputs


def _zeros(shape: ir.Value, rank: int, dtype: np.dtype, opset: int, last) -> ir.Node:
    """The node making zeros of ``shape`` (``rank`` sizes): ``ConstantOfShape``, or before
    opset 9 ``Tile`` of a zero of ``rank`` axes of size 1 (``last`` adds a node)."""
    if opset >= _CONSTANT_OF_SHAPE:
        return ir.node("ConstantOfShape", [shape], {"value": ir.tensor(np.zeros(1, dtype))})
    one = ir.tensor(np.zeros([1] * rank, dtype))
    return ir.node("Tile", [last(ir.node("Constant", [], {"value": one})), shape])


def _initial_states(node: ir.Node) -> tuple[ir.Value | None, ir.Value | None]:
    """The node's ``initial_h`` and ``initial_c`` (None: absent)."""
    inputs = list(node.inputs) + [None] * 7
    return inputs[5], inputs[6] if node.op_type == "LSTM" else None


def _dtype(node: ir.Node) -> np.dtype:
    """The node's element type (its ``X``'s, else its ``W``'s)."""
    for value in node.inputs[:2]:
        if value is not None and value.dtype is not None:
            return value.dtype.numpy()
    return np.dtype(np.float32)


def _take_place(graph: ir.Graph, old: ir.Value, new: ir.Value, taken: set[str]) -> None:
    """Readers of ``old`` (now the ``else`` branch's output) read ``new``, which takes its
    name, type, shape and place among the graph's outputs."""
    for reader, index in list(old.uses()):
        reader.replace_input_with(index, new)
    new.type, new.shape = old.type, old.shape
    for index, output in enumerate(graph.outputs):
        if output is old:
            graph.outputs[index] = new
    name = old.name
    old.name = _fresh(taken, f"{name or 'rnn'}_batch_not_0")
    new.name = name


def _fresh(taken: set[str], base: str) -> str:
    name = free_name(taken, base)
    taken.add(name)
    return name
