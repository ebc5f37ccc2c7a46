"""Fold the weight preparation in front of RNN nodes (W, R, B) into single initializers.

Pattern: an ``LSTM``/``GRU``/``RNN`` or ``com.microsoft`` ``DynamicQuantizeLSTM`` node
whose ``W``, ``R`` or ``B`` input (1, 2, 3) is computed, as torchlib exports it: ``Slice``
per gate, ``Concat`` in ONNX gate order, ``Unsqueeze`` of the direction axis, ``Concat``
across directions. onnxscript's constant folder leaves these alone above 8192 elements,
so the runtime redoes them on every call (or at every session creation).

Condition, for the input folded:

* every node of its producing sub-graph is one of :data:`FOLDABLE_OPS` (ONNX domain,
  deterministic, no data-dependent shapes), and every leaf is a constant initializer
  that is not a graph input (an initializer listed as a graph input can be overridden)
  or a ``Constant`` node's output;
* every tensor-data leaf (not a Slice bound, axes, shape or index) is read only by such
  nodes on the way to RNN weight inputs, and is not a graph output, so once folded the
  original is unused and removed: the model never stores the weights twice;
* when those originals feed other RNN weight inputs too (raw, or prepared again here, in
  another graph or an ``If`` branch), all of them fold and their distinct tensors take
  no more bytes than the originals;
* the computed tensor has the shape the node needs: ``[D, G*H, I]`` for ``W``,
  ``[D, G*H, H]`` for ``R``, ``[D, 2*G*H]`` for ``B`` (``G`` = 4 LSTM, 3 GRU, 1 RNN;
  ``DynamicQuantizeLSTM``: ``[D, I, 4H]``, ``[D, H, 4H]``, ``[D, 8H]``), its declared
  dtype and shape (if any) and ``I`` = the static last dim of ``X`` (if known).

Replacement: the same node, attributes copied, with that input replaced by one new
initializer holding the computed tensor, stored once in the outermost graph that needs
it (the graph holding the originals; subgraphs read outer-scope values) under a name no
value of the model has; below IR version 4 a ``Constant`` node instead (an initializer
would have to be an overridable graph input). One input is folded per rewrite; the new
node matches again until ``W``, ``R`` and ``B`` are all constants, after which the
condition fails (no self-loop). Inputs that compute identical tensors, in any graph,
share one tensor, and one equal to an original read raw is that original.

The sub-graph is found and evaluated by :mod:`rnn_rewrite_rules.shape.constant`
(lazy, memory-bounded; see ``docs/weight-folding.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRule

from rnn_rewrite_rules._ir import fresh_name, subgraph_owners
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn_ops import DIRECTIONS, RnnOp, rnn_op
from rnn_rewrite_rules.exporter_bugs import onnxscript_gru_bug
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._initializers import digest, holds, stored_values, tag
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, copy_rnn_node, rnn_node_rules
from rnn_rewrite_rules.shape import ShapeProver
from rnn_rewrite_rules.shape.constant import (
    FOLDABLE_OPS,
    data_inputs,
    fold_value,
    is_constant_node,
    preparation_nodes,
)

__all__ = ["FAMILY", "FoldRnnWeights", "make_rules"]


def _is_weight_read(user: ir.Node, index: int) -> bool:
    spec = rnn_op(user)
    return spec is not None and index in _folded_inputs(spec)


def _folded_inputs(spec: RnnOp) -> dict[int, str]:
    """The inputs this family folds: ``W``, ``R`` and ``B`` (not the peepholes)."""
    return {i: n for i, n in spec.weight_inputs.items() if n != "P"}


def _sinks_of(leaf: ir.Value) -> list[ir.Value] | Refusal:
    """The RNN weight inputs ``leaf``'s data reaches, or why it would stay needed."""
    stack = [leaf]
    seen: set[ir.Value] = set()
    sinks: dict[ir.Value, None] = {}
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        if value.is_graph_output():
            return Refusal(
                f"{leaf.name} feeds graph output {value.name}: folding would store it twice"
            )
        for user, index in value.uses():
            if _is_weight_read(user, index):
                sinks[value] = None
                continue
            if user.domain == "" and user.op_type in FOLDABLE_OPS and index in data_inputs(user):
                stack.extend(user.outputs)
                continue
            return Refusal(
                f"{leaf.name} is also read by {user.op_type} {user.name!r} (input {index}): "
                "folding would store it twice"
            )
    return list(sinks)


def _is_leaf(value: ir.Value) -> bool:
    return value.producer() is None or is_constant_node(value.producer())


def _tensor_of(value: ir.Value) -> ir.TensorProtocol | None:
    return ir.convenience.get_const_tensor(value)


def _component(value: ir.Value, leaves: Sequence[ir.Value]) -> tuple[list, list] | Refusal:
    """Every RNN weight input sharing data with ``value`` (itself first), and their leaves.

    Folding ``value`` stores its tensor once; the originals go only when every weight
    input they feed is folded too (or is the original itself, read raw).
    """
    sinks: dict[ir.Value, None] = {value: None}
    all_leaves: dict[ir.Value, None] = {}
    todo = list(leaves)
    while todo:
        leaf = todo.pop()
        if leaf in all_leaves:
            continue
        all_leaves[leaf] = None
        found = _sinks_of(leaf)
        if isinstance(found, Refusal):
            return found
        for sink in found:
            if sink in sinks:
                continue
            sinks[sink] = None
            if _is_leaf(sink):
                continue
            more = preparation_nodes(sink)
            if isinstance(more, Refusal):
                return Refusal(f"{sink.name} shares {leaf.name} but is not foldable: {more}")
            todo.extend(more[1])
    return list(sinks), list(all_leaves)


def _stored_bytes(sinks: Sequence[ir.Value], first: tuple[str, int]) -> int | Refusal:
    """Bytes the distinct tensors of ``sinks`` take once all are folded (``first`` given)."""
    stored = dict([first])
    for sink in sinks[1:]:
        if _is_leaf(sink):
            tensor = _tensor_of(sink)
            if tensor is None:
                return Refusal(f"{sink.name} has no constant value")
            array = tensor.numpy()
        else:
            folded = fold_value(sink)
            if isinstance(folded, Refusal):
                return Refusal(f"{sink.name} shares its weights but cannot be folded: {folded}")
            array = folded
        stored[digest(array)] = array.nbytes
        del array
    return sum(stored.values())


# ---------------------------------------------------------------- the rule


def _static_dims(value: ir.Value | None, prover: ShapeProver) -> tuple[int | None, ...] | None:
    """The sizes the shape prover fixes (None where symbolic); never a value_info."""
    dims = prover.dims(value)
    return None if dims is None else tuple(d.value for d in dims)


def _expected_shape(
    node: ir.Node, index: int, hidden: int, directions: int, gates: int, prover: ShapeProver
) -> tuple[int | None, ...]:
    x_dims = _static_dims(node.inputs[0], prover) if node.inputs else None
    input_size = x_dims[-1] if x_dims else None
    if node.domain == "com.microsoft":  # DynamicQuantizeLSTM: W, R transposed
        shapes = {
            1: (directions, input_size, gates * hidden),
            2: (directions, hidden, gates * hidden),
            3: (directions, 2 * gates * hidden),
        }
    else:
        shapes = {
            1: (directions, gates * hidden, input_size),
            2: (directions, gates * hidden, hidden),
            3: (directions, 2 * gates * hidden),
        }
    return shapes[index]


def _hidden_size(node: ir.Node, prover: ShapeProver) -> int | None:
    attr = node.attributes.get("hidden_size")
    if attr is not None:
        return attr.as_int()
    r_dims = _static_dims(node.inputs[2], prover) if len(node.inputs) > 2 else None
    if r_dims is None or len(r_dims) != 3:
        return None
    return r_dims[1] if node.domain == "com.microsoft" else r_dims[2]


def _shape_mismatch(
    actual: tuple[int, ...], expected: Sequence[int | None], declared: Sequence[int | None] | None
) -> Refusal | None:
    for wanted, what in ((expected, "needs"), (declared, "declares")):
        if wanted is None:
            continue
        if len(wanted) != len(actual) or any(
            w is not None and w != a for w, a in zip(wanted, actual, strict=True)
        ):
            return Refusal(f"computed shape {actual}, but the node {what} {tuple(wanted)}")
    return None


def _store(graph: ir.Graph, value: ir.Value) -> None:
    """Add ``value`` (an initializer, or a ``Constant`` node's output) to ``graph``."""
    producer = value.producer()
    if producer is None:
        graph.register_initializer(value)
        return
    first = next(iter(graph), None)
    if first is None:
        graph.append(producer)
    else:
        graph.insert_before(first, producer)


def _parents(model: ir.Model) -> dict[ir.Graph, ir.Graph]:
    """Each subgraph of ``model`` -> the graph of the node holding it."""
    owners = subgraph_owners(model.graph)
    return {graph: node.graph for graph, node in owners.items() if node.graph is not None}


def _scope(parents: dict[ir.Graph, ir.Graph], graph: ir.Graph) -> list[ir.Graph]:
    """``graph`` and the graphs enclosing it, innermost first."""
    chain = [graph]
    while chain[-1] in parents:
        chain.append(parents[chain[-1]])
    return chain


class FoldRnnWeights(RnnNodeRule):
    """RNN(X, <computed W>, <computed R>, <computed B>, ...) -> RNN(X, W', R', B', ...)."""

    #: Set by a successful check for the rewrite: (input index, placement).
    _fold: tuple[int, tuple] | None = None

    def check_node(self, context: MatchContext, node: ir.Node) -> MatchResult:
        check_result = MatchResult()
        self._fold = None
        graph = context.graph_or_function
        if not isinstance(graph, ir.Graph):
            return check_result.fail("initializers cannot be added to a function", node)
        bug = onnxscript_gru_bug(node)
        if bug is not None:  # folded, the weights would no longer show who wrote them
            return check_result.fail(bug, node)
        spec = rnn_op(node)
        assert spec is not None  # the pattern matched an RNN op
        gates = spec.gates
        direction_attr = node.attributes.get("direction")
        direction = direction_attr.as_string() if direction_attr is not None else "forward"
        if direction not in DIRECTIONS:
            return check_result.fail(f"unknown direction {direction!r}", node)
        prover = ShapeProver(context.model.graph)
        hidden = _hidden_size(node, prover)
        reasons = []
        for index, label in _folded_inputs(spec).items():
            value = node.inputs[index] if len(node.inputs) > index else None
            if value is None:
                continue
            producer = value.producer()
            if producer is None or is_constant_node(producer):
                continue  # already a constant (or a graph input): nothing to fold
            found = preparation_nodes(value)
            if isinstance(found, Refusal):
                reasons.append(f"{label}: {found}")
                continue
            nodes, leaves = found
            component = _component(value, leaves)
            if isinstance(component, Refusal):
                reasons.append(f"{label}: {component}")
                continue
            if hidden is None and index != 2:
                reasons.append(f"{label}: hidden_size is unknown (no attribute, R not constant)")
                continue
            array = fold_value(value, nodes)
            if isinstance(array, Refusal):
                reasons.append(f"{label}: {array}")
                continue
            if hidden is None:  # R itself tells H: [D, G*H, H] (transposed for the contrib op)
                h = array.shape[1] if node.domain == "com.microsoft" else array.shape[-1]
            else:
                h = hidden
            expected = _expected_shape(node, index, h, DIRECTIONS[direction], gates, prover)
            mismatch = _shape_mismatch(array.shape, expected, _static_dims(value, prover))
            if value.dtype is not None and value.dtype.numpy() != array.dtype:
                mismatch = Refusal(f"computed dtype {array.dtype}, declared {value.dtype}")
            if mismatch is not None:
                reasons.append(f"{label}: {mismatch}")
                continue
            array_digest = digest(array)
            sinks, all_leaves = component
            if len(sinks) > 1:
                before = sum(t.nbytes for t in map(_tensor_of, all_leaves) if t is not None)
                after = _stored_bytes(sinks, (array_digest, array.nbytes))
                if isinstance(after, Refusal):
                    reasons.append(f"{label}: {after}")
                    continue
                if after > before:
                    others = ", ".join(repr(s.name) for s in sinks[1:])
                    reasons.append(
                        f"{label}: its weights also feed {others}: folded, they would take "
                        f"{after} bytes where the originals take {before}"
                    )
                    continue
            self._fold = (
                index,
                self._placement(
                    context.model, graph, node, label, array, array_digest, sinks, leaves
                ),
            )
            return check_result
        if not reasons:
            return check_result.fail("W, R and B are constants already", node)
        return check_result.fail("; ".join(reasons), node)

    def _placement(
        self,
        model: ir.Model,
        graph: ir.Graph,
        node: ir.Node,
        label: str,
        array: np.ndarray,
        array_digest: str,
        sinks: Sequence[ir.Value],
        leaves: Sequence[ir.Value],
    ) -> tuple:
        """Where the folded tensor is stored: once, in the outermost graph that needs it.

        An equal tensor already visible from ``graph`` (folded earlier, or an original
        read raw) is reused; one folded in a sibling subgraph moves to the innermost graph
        enclosing both; a new one goes to the graph holding the originals (subgraphs
        read outer-scope values), so other subgraphs folding the same weights find it.
        Below IR version 4 every initializer must be a graph input (and could be fed at
        run time): the tensor is then a ``Constant`` node at the top of that graph.
        """
        parents = _parents(model)
        scope = _scope(parents, graph)
        for candidate_graph in scope:
            for value in stored_values(candidate_graph):
                if holds(value, array, array_digest, raw=False):
                    return ("reuse", value)
        for sink in sinks:
            in_scope = _is_leaf(sink) and sink.graph in scope
            if in_scope and holds(sink, array, array_digest, raw=True):
                return ("reuse", sink)
        for other in model.graphs():
            if other in scope:
                continue
            for value in stored_values(other):
                if holds(value, array, array_digest, raw=False):
                    outer = set(_scope(parents, other))
                    common = next(g for g in scope if g in outer)
                    return ("hoist", value, other, common)
        owners = {leaf.graph for leaf in leaves}
        target = next((g for g in scope if g in owners), graph)
        named = [leaf.name for leaf in leaves if leaf.name]
        name = fresh_name(model, f"{named[0] if named else node.name or node.op_type}_{label}")
        # IR < 4: every initializer is a graph input, so overridable; a Constant is not.
        return ("new", array, name, target, array_digest, model.ir_version < 4)

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        assert self._fold is not None
        index, placement = self._fold
        self._fold = None
        match placement:
            case ("reuse", value):
                pass
            case ("hoist", value, source, target):
                if value.producer() is None:
                    del source.initializers[value.name]
                else:
                    source.remove(value.producer())
                _store(target, value)
            case ("new", array, name, target, array_digest, as_constant):
                tensor = ir.tensor(array, name=name)
                if as_constant:
                    constant = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)])
                    value = constant.outputs[0]
                    value.name = name
                else:
                    value = ir.Value(name=name)
                value.const_value = tensor
                value.shape = ir.Shape(array.shape)
                value.type = ir.TensorType(ir.DataType.from_numpy(array.dtype))
                tag(value, array_digest)
                _store(target, value)
            case _:
                raise AssertionError(f"unknown placement {placement[0]!r}")
        return copy_rnn_node(op, node, self.num_outputs, {index: value})

    def cleanup(self) -> None:
        self._fold = None  # never keep a folded tensor alive past the pass


def make_rules() -> list[RewriteRule]:
    return rnn_node_rules(FoldRnnWeights)


FAMILY = RuleFamily(
    name="weight_folding",
    description=(__doc__ or "").partition("\n")[0],
    make_rules=make_rules,
    install_by_default=True,
    fixes=("runtime-weight-prep",),
)
