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
* the computed tensor has the shape the node needs: ``[D, G*H, I]`` for ``W``,
  ``[D, G*H, H]`` for ``R``, ``[D, 2*G*H]`` for ``B`` (``G`` = 4 LSTM, 3 GRU, 1 RNN;
  ``DynamicQuantizeLSTM``: ``[D, I, 4H]``, ``[D, H, 4H]``, ``[D, 8H]``), its declared
  dtype and shape (if any) and ``I`` = the static last dim of ``X`` (if known).

Replacement: the same node, attributes copied, with that input replaced by one new
initializer (in the graph the node lives in) holding the computed tensor. One input is
folded per rewrite; the new node matches again until ``W``, ``R`` and ``B`` are all
initializers, after which the condition fails (no self-loop). Two inputs that compute
identical tensors share one initializer.

The sub-graph is found and evaluated by :mod:`rnn_rewrite_rules.shape.constant`
(lazy, memory-bounded; see ``docs/weight-folding.md``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleSet

from rnn_rewrite_rules._rnn import DIRECTIONS, RNN_OPS
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._rnn_node import RnnNodeRule, copy_rnn_node, rnn_node_rules
from rnn_rewrite_rules.shape.constant import (
    FOLDABLE_OPS,
    data_inputs,
    fold_value,
    is_constant_node,
    preparation_nodes,
)

__all__ = ["FAMILY", "FoldRnnWeights", "rules"]


#: RNN input index -> name.
_WEIGHT_INPUTS = {1: "W", 2: "R", 3: "B"}
#: Key of ``ir.Value.meta`` (in memory only) holding a folded initializer's digest.
_DIGEST_KEY = "rnn_rewrite_rules.weight_folding.digest"


def _stays_alive(leaf: ir.Value) -> str | None:
    """Why ``leaf`` would still be needed after folding every RNN weight it feeds, or None."""
    stack = [leaf]
    seen: set[ir.Value] = set()
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        if value.is_graph_output():
            return f"{leaf.name} feeds graph output {value.name}: folding would store it twice"
        for user, index in value.uses():
            if (user.domain, user.op_type) in RNN_OPS and index in _WEIGHT_INPUTS:
                continue
            if user.domain == "" and user.op_type in FOLDABLE_OPS and index in data_inputs(user):
                stack.extend(user.outputs)
                continue
            return (
                f"{leaf.name} is also read by {user.op_type} {user.name!r} (input {index}): "
                "folding would store it twice"
            )
    return None


# ---------------------------------------------------------------- the rule


def _static_dims(value: ir.Value | None) -> tuple[int | None, ...] | None:
    if value is None:
        return None
    tensor = None if value.is_graph_input() else ir.convenience.get_const_tensor(value)
    if tensor is not None:
        return tuple(int(d) for d in tensor.shape.dims)
    if value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in value.shape.dims)


def _expected_shape(
    node: ir.Node, index: int, hidden: int, directions: int, gates: int
) -> tuple[int | None, ...]:
    x_dims = _static_dims(node.inputs[0]) if node.inputs else None
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


def _hidden_size(node: ir.Node, gates: int) -> int | None:
    attr = node.attributes.get("hidden_size")
    if attr is not None:
        return attr.as_int()
    r_dims = _static_dims(node.inputs[2]) if len(node.inputs) > 2 else None
    if r_dims is None or len(r_dims) != 3:
        return None
    return r_dims[1] if node.domain == "com.microsoft" else r_dims[2]


def _shape_mismatch(
    actual: tuple[int, ...], expected: Sequence[int | None], declared: Sequence[int | None] | None
) -> str | None:
    for wanted, what in ((expected, "needs"), (declared, "declares")):
        if wanted is None:
            continue
        if len(wanted) != len(actual) or any(
            w is not None and w != a for w, a in zip(wanted, actual, strict=True)
        ):
            return f"computed shape {actual}, but the node {what} {tuple(wanted)}"
    return None


def _digest(array: np.ndarray) -> str:
    return hashlib.blake2b(memoryview(array).cast("B"), digest_size=32).hexdigest()


def _same_folded(graph: ir.Graph, array: np.ndarray, digest: str) -> ir.Value | None:
    """An initializer this rule created earlier in ``graph`` with the same contents."""
    for initializer in graph.initializers.values():
        if initializer.meta.get(_DIGEST_KEY) != digest or initializer.is_graph_input():
            continue
        tensor = initializer.const_value
        if (
            tensor is not None
            and tuple(tensor.shape.dims) == array.shape
            and tensor.dtype.numpy() == array.dtype
        ):
            return initializer
    return None


def _unique_name(model: ir.Model, graph: ir.Graph, base: str) -> str:
    taken: set[str] = set(graph.initializers) | set(model.graph.initializers)
    for graph_like in (model.graph, graph):
        taken.update(v.name for v in graph_like.inputs if v.name)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        taken.update(v.name for v in node.outputs if v.name)
    name, suffix = base, 1
    while name in taken:
        name, suffix = f"{base}_{suffix}", suffix + 1
    return name


class FoldRnnWeights(RnnNodeRule):
    """RNN(X, <computed W>, <computed R>, <computed B>, ...) -> RNN(X, W', R', B', ...)."""

    #: Set by a successful check for the rewrite: (input index, tensor or reused value, name).
    _fold: tuple[int, ir.Value | np.ndarray, str] | None = None
    _new_digest = ""

    def check_node(self, context, node: ir.Node) -> MatchResult:
        check_result = MatchResult()
        self._fold = None
        graph = context.graph_or_function
        if not isinstance(graph, ir.Graph):
            return check_result.fail("initializers cannot be added to a function", node)
        gates = RNN_OPS[(node.domain, node.op_type)]
        direction_attr = node.attributes.get("direction")
        direction = direction_attr.as_string() if direction_attr is not None else "forward"
        if direction not in DIRECTIONS:
            return check_result.fail(f"unknown direction {direction!r}", node)
        hidden = _hidden_size(node, gates)
        reasons = []
        for index, label in _WEIGHT_INPUTS.items():
            value = node.inputs[index] if len(node.inputs) > index else None
            if value is None:
                continue
            producer = value.producer()
            if producer is None or is_constant_node(producer):
                continue  # already a constant (or a graph input): nothing to fold
            found = preparation_nodes(value)
            if isinstance(found, str):
                reasons.append(f"{label}: {found}")
                continue
            nodes, leaves = found
            alive = next((r for r in map(_stays_alive, leaves) if r is not None), None)
            if alive is not None:
                reasons.append(f"{label}: {alive}")
                continue
            if hidden is None and index != 2:
                reasons.append(f"{label}: hidden_size is unknown (no attribute, R not constant)")
                continue
            array = fold_value(value, nodes)
            if isinstance(array, str):
                reasons.append(f"{label}: {array}")
                continue
            if hidden is None:  # R itself tells H: [D, G*H, H] (transposed for the contrib op)
                h = array.shape[1] if node.domain == "com.microsoft" else array.shape[-1]
            else:
                h = hidden
            expected = _expected_shape(node, index, h, DIRECTIONS[direction], gates)
            mismatch = _shape_mismatch(array.shape, expected, _static_dims(value))
            if value.dtype is not None and value.dtype.numpy() != array.dtype:
                mismatch = f"computed dtype {array.dtype}, declared {value.dtype}"
            if mismatch is not None:
                reasons.append(f"{label}: {mismatch}")
                continue
            digest = _digest(array)
            existing = _same_folded(graph, array, digest)
            if existing is not None:
                self._fold = (index, existing, digest)
            else:
                named = [leaf.name for leaf in leaves if leaf.name]
                base = f"{named[0] if named else node.name or node.op_type}_{label}"
                self._fold = (index, array, _unique_name(context.model, graph, base))
                self._new_digest = digest
            return check_result
        if not reasons:
            return check_result.fail("W, R and B are constants already", node)
        return check_result.fail("; ".join(reasons), node)

    def rewrite(self, op, out0: ir.Value, **_):
        node = self.node(out0)
        assert self._fold is not None
        index, folded, name = self._fold
        self._fold = None
        if isinstance(folded, np.ndarray):
            folded = op.initializer(ir.tensor(folded, name=name), name=name)
            folded.meta[_DIGEST_KEY] = self._new_digest
        return copy_rnn_node(op, node, self.num_outputs, {index: folded})

    def cleanup(self) -> None:
        self._fold = None  # never keep a folded tensor alive past the pass


rules = RewriteRuleSet(rnn_node_rules(FoldRnnWeights))

FAMILY = RuleFamily(
    name="weight_folding",
    description=(__doc__ or "").partition("\n")[0],
    rule_set=rules,
    install_by_default=True,
    portable=True,
    fixes=("runtime-weight-prep",),
)
