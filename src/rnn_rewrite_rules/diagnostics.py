"""RNN hazards in a model, found statically (``rnn-rewrite --check``).

* ``runtime-shape-chain``: ``Y``'s shape is recomputed at run time (``Shape`` -> ``Slice``
  -> ... -> ``Reshape``) after an RNN node.
* ``runtime-weight-prep``: ``W``/``R``/``B`` are computed at run time from initializers;
  ONNX Runtime folds them at session creation (slow load) or recomputes them every call.
* ``layout-1``: ``layout=1`` RNNs, which ONNX Runtime's CPU kernels reject.
* ``unproven-zero-state``, ``hand-built-direction``, ``runtime-rank-check``: exporter
  forms the rules rewrite where they can prove them (see :func:`exporter_form_hazards`).
* ``exporter-bug``: a node an exporter is known to write wrongly (see
  :mod:`rnn_rewrite_rules.exporter_bugs`): the model differs from its source, which no
  rule can repair.
* ``frozen-axis``: an axis declared dynamic at a graph input but frozen to a constant
  inside, e.g. ``Reshape(Transpose(Y), [3, -1, 32])`` while the input declares ``seq``
  (torch's exporter does this silently): other sizes fail or give wrong shapes.
  Also an axis unrolled to the traced length (torch dynamo's ``nn.RNN`` and cell loops:
  per-step ``Gather``/``Slice``/``Split``/``SequenceAt`` reads at constant indices, see
  :mod:`rnn_rewrite_rules._unrolled_axes`): longer inputs silently give the traced steps.
* ``declared-output-shape``: a graph output declared with a size the prover refutes
  (torch's dynamo exporter declares the traced length): the rewrite writes the proven
  size (:mod:`rnn_rewrite_rules.passes.declared_output_shapes`).

Frozen axes are found with the shape prover (``rnn_rewrite_rules.shape``), which never
reads value-info annotations (the exporter's annotations may carry the frozen size).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Iterator

import onnx_ir as ir

from rnn_rewrite_rules._ir import input_at
from rnn_rewrite_rules._rnn_ops import describe_node, is_rnn, rnn_op
from rnn_rewrite_rules._unrolled_axes import describe_readers, fixed_windows, unrolled_axes
from rnn_rewrite_rules.exporter_bugs import onnxscript_gru_bug
from rnn_rewrite_rules.passes.declared_output_shapes import output_shape_fixes
from rnn_rewrite_rules.shape import Dim, ShapeProver

__all__ = ["KINDS", "Hazard", "describe_node", "find_hazards", "is_rnn", "rnn_hazards"]

KINDS = (
    "exporter-bug",
    "runtime-shape-chain",
    "runtime-weight-prep",
    "layout-1",
    "frozen-axis",
    "unproven-zero-state",
    "hand-built-direction",
    "runtime-rank-check",
    "declared-output-shape",
    "loop-recurrence",
)

#: Ops a recurrent cell's body computes its gates with.
_CELL_ACTIVATIONS = frozenset({"Sigmoid", "Tanh", "Relu", "HardSigmoid"})
_CELL_PRODUCTS = frozenset({"MatMul", "Gemm", "Einsum"})

#: Ops that move a tensor's data without changing what its axes mean to a shape reader.
_PASS_THROUGH = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten", "Cast"}
#: Ops that compute on shape tensors.
_SHAPE_ARITHMETIC = {
    "Shape", "Slice", "Gather", "Concat", "Mul", "Add", "Sub", "Div", "Reshape", "Squeeze",
    "Unsqueeze", "Cast", "Identity", "ReduceProd", "Max", "Min", "Range", "Equal", "Where",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Hazard:
    kind: str
    #: The node at fault, as :func:`describe_node` names it.
    node: str
    message: str
    #: For an unrolled axis: the declared name of the axis it freezes.
    unrolled: str | None = None

    @classmethod
    def at(cls, kind: str, node: ir.Node, message: str) -> Hazard:
        """A hazard of ``kind`` at ``node`` (named by :func:`describe_node`)."""
        return cls(kind, describe_node(node), message)

    def __str__(self) -> str:
        return f"[{self.kind}] {self.node}: {self.message}"


def _summary(nodes: Iterable[ir.Node]) -> str:
    counts = collections.Counter(n.op_type for n in nodes)
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(op if c == 1 else f"{op} x{c}" for op, c in ordered)


def _is_constant(value: ir.Value) -> bool:
    if value.is_graph_input():
        return False
    return ir.convenience.get_const_tensor(value) is not None


def _derived_values(node: ir.Node) -> Iterator[tuple[ir.Value, ir.Node]]:
    """Values computed from ``node``'s outputs by pass-through ops (data input only)."""
    stack = [v for v in node.outputs if v is not None]
    seen = set(stack)
    while stack:
        value = stack.pop()
        for use in value.uses():
            consumer = use.node
            yield value, consumer
            if consumer.op_type in _PASS_THROUGH and use.idx == 0:
                for out in consumer.outputs:
                    if out not in seen:
                        seen.add(out)
                        stack.append(out)


def _shape_chain(rnn: ir.Node) -> Hazard | None:
    shapes = {consumer for _, consumer in _derived_values(rnn) if consumer.op_type == "Shape"}
    if not shapes:
        return None
    chain: list[ir.Node] = []
    sinks: list[ir.Node] = []
    stack = sorted(shapes, key=describe_node)
    seen = set(stack)
    while stack:
        node = stack.pop()
        chain.append(node)
        for value in node.outputs:
            for use in value.uses():
                consumer = use.node
                if consumer in seen:
                    continue
                shape_input = consumer.op_type in {"Reshape", "Expand"} and use.idx == 1
                if shape_input or consumer.op_type not in _SHAPE_ARITHMETIC:
                    if consumer not in sinks:
                        sinks.append(consumer)
                    continue
                seen.add(consumer)
                stack.append(consumer)
    feeds = f" feeding {', '.join(describe_node(s) for s in sinks[:3])}" if sinks else ""
    return Hazard.at(
        "runtime-shape-chain",
        rnn,
        f"its output shape is recomputed at run time by {len(chain)} nodes "
        f"({_summary(chain)}){feeds}",
    )


def _preparation(value: ir.Value) -> set[ir.Node] | None:
    """The nodes computing ``value`` from constants only, or None if it needs a graph input."""
    cone: set[ir.Node] = set()
    stack: list[ir.Value | None] = [value]
    while stack:
        current = stack.pop()
        if current is None or _is_constant(current):
            continue
        producer = current.producer()
        if producer is None:
            return None  # a graph input or an outer-scope value: real data
        if producer in cone:
            continue
        cone.add(producer)
        stack.extend(producer.inputs)
    return cone


def _weight_preparation(rnn: ir.Node) -> Hazard | None:
    spec = rnn_op(rnn)
    if spec is None:
        return None
    names = spec.weight_inputs
    prepared: list[str] = []
    cone: set[ir.Node] = set()
    for index, name in names.items():
        value = input_at(rnn, index)
        if value is None or _is_constant(value):
            continue
        nodes = _preparation(value)
        if nodes:
            prepared.append(name)
            cone |= nodes
    if not prepared:
        return None
    preparers = [n for n in cone if n.op_type != "Constant"]
    return Hazard.at(
        "runtime-weight-prep",
        rnn,
        f"{', '.join(prepared)} computed at run time from initializers by {len(preparers)} nodes "
        f"({_summary(preparers)}); ONNX Runtime folds them at load or recomputes them per call",
    )


def _layout(rnn: ir.Node) -> Hazard | None:
    if rnn.domain not in ("", "ai.onnx") or rnn.attributes.get_int("layout", 0) != 1:
        return None
    return Hazard.at(
        "layout-1",
        rnn,
        "layout=1 (batch-major): ONNX Runtime's CPU kernels reject it "
        "('Batchwise recurrent operations (layout == 1) are not supported')",
    )


#: A graph input's symbolic axis: the symbol's key -> (its name, input name, axis).
Symbols = dict[tuple[int, int], tuple[str, str, int]]


def _input_symbols(model: ir.Model) -> Symbols:
    symbols: Symbols = {}
    names: set[str] = set()
    for value in model.graph.inputs:
        if value.is_initializer() or value.shape is None:
            continue
        for axis, dim in enumerate(value.shape):
            name = getattr(dim, "value", None)
            if isinstance(name, str) and name and name not in names:
                names.add(name)
                symbols[Dim.sym(value, axis).terms[0][0][0].key] = (name, value.name or "", axis)
    return symbols


def _symbol(dim: Dim, symbols: Symbols) -> str | None:
    """The declared name when ``dim`` is exactly one symbolic axis of a graph input."""
    if len(dim.terms) != 1 or dim.terms[0][1] != 1 or len(dim.terms[0][0]) != 1:
        return None
    entry = symbols.get(dim.terms[0][0][0].key)
    return None if entry is None else entry[0]


def _declared(names: Iterable[str], symbols: Symbols) -> str:
    by_name = {name: (source, axis) for name, source, axis in symbols.values()}
    return "; ".join(
        f"{name!r} is axis {by_name[name][1]} of input {by_name[name][0]!r}"
        for name in dict.fromkeys(names)
    )


def _after_rnn(value: ir.Value, hops: int = 6) -> ir.Node | None:
    for _ in range(hops):
        producer = value.producer()
        if producer is None:
            return None
        if is_rnn(producer):
            return producer
        if producer.op_type not in _PASS_THROUGH or not producer.inputs:
            return None
        first = producer.inputs[0]
        if first is None:
            return None
        value = first
    return None


def _frozen_reshape(node: ir.Node, prover: ShapeProver, symbols: Symbols) -> Hazard | None:
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    target = prover.ints(node.inputs[1]) if prover.rank(node.inputs[1]) == 1 else None
    data = prover.dims(node.inputs[0])
    if target is None or data is None:
        return None
    copies = node.attributes.get_int("allowzero", 0) == 0
    free: list[tuple[int, str]] = []
    data_const = 1
    for axis, dim in enumerate(data):
        if copies and axis < len(target) and target[axis] == 0:
            continue  # copied through unchanged
        name = _symbol(dim, symbols)
        if dim.value is not None:
            data_const *= dim.value
        elif name is not None:
            free.append((axis, name))
        else:
            return None  # an unknown size: nothing can be proven
    if not free:
        return None
    if not copies and 0 in target:
        return None  # an empty output: nothing to freeze
    target_const = math.prod(t for t in target if t > 0)
    if -1 not in target:
        definite, factor = True, None
    elif data_const % target_const:
        definite, factor = True, target_const // math.gcd(target_const, data_const)
    else:
        definite, factor = False, None
    positional = [
        (axis, dim, target[axis])
        for axis, dim in free
        if axis < len(target) and target[axis] > (0 if definite else 1)
    ]
    if not definite and (not positional or _merges_around(data, target)):
        return None
    if positional:
        frozen = ", ".join(f"{dim!r} to {size}" for _, dim, size in positional)
        axes = [dim for _, dim, _ in positional]
    else:
        frozen = " x ".join(repr(dim) for _, dim in free)
        frozen += f" to a multiple of {factor}" if factor else " to a constant"
        axes = [dim for _, dim in free]
    rnn = _after_rnn(node.inputs[0])
    after = f" after {describe_node(rnn)}" if rnn is not None else ""
    consequence = "other sizes fail" if definite else "other sizes give wrong shapes"
    return Hazard.at(
        "frozen-axis",
        node,
        f"constant target {target}{after} freezes {frozen} "
        f"({_declared(axes, symbols)}, declared dynamic): {consequence}",
    )


def _merges_around(data: tuple[Dim, ...], target: list[int]) -> bool:
    """Whether ``target``'s one ``-1`` stands for a run of ``data``'s axes that holds every
    symbolic one, the constant axes around it kept in order (size-1 axes ignored): e.g.
    Keras Tensordot's ``[b, s, 8] -> [-1, 8]`` or a step's ``[1, 1, b, 8] -> [-1, 1, 8]``."""
    if 0 in target:
        return False
    sizes = [dim.value for dim in data if dim.value != 1]
    wanted = [size for size in target if size != 1]
    head = 0
    while head < min(len(wanted), len(sizes)) and wanted[head] != -1:
        if sizes[head] != wanted[head]:
            return False
        head += 1
    tail = 0
    while tail < len(wanted) - head - 1 and tail < len(sizes) - head:
        if sizes[-1 - tail] != wanted[-1 - tail]:
            return False
        tail += 1
    return len(wanted) - head - tail == 1 and wanted[head] == -1


def _unrolled(graph: ir.Graph, prover: ShapeProver, symbols: Symbols) -> Iterator[Hazard]:
    """A symbolic axis read one constant step at a time (see :mod:`._unrolled_axes`)."""
    for name, length, value, readers in unrolled_axes(graph, prover, lambda d: _symbol(d, symbols)):
        message = (
            f"{value!r} is read one step at a time at constant indices 0..{length - 1} by "
            f"{len(readers)} node(s): {name!r} ({_declared([name], symbols)}, declared "
            f"dynamic) is unrolled to the traced length {length}: a longer input silently "
            f"gives only {length} steps, a shorter one fails"
        )
        yield Hazard("frozen-axis", describe_readers(readers), message, unrolled=name)
    for name, length, value, node in fixed_windows(graph, prover, lambda d: _symbol(d, symbols)):
        message = (
            f"{value!r} is read as the constant window 0..{length - 1}: {name!r} "
            f"({_declared([name], symbols)}, declared dynamic) is frozen at the traced length "
            f"{length}: a longer input silently gives only {length} steps"
        )
        yield Hazard("frozen-axis", describe_readers([node]), message, unrolled=name)


def _frozen_initial_state(rnn: ir.Node, prover: ShapeProver, symbols: Symbols) -> Iterator[Hazard]:
    batch_axis = 0 if rnn.attributes.get_int("layout", 0) == 1 else 1
    x = rnn.inputs[0] if rnn.inputs else None
    batch = prover.dim(x, batch_axis)
    symbol = None if batch is None else _symbol(batch, symbols)
    spec = rnn_op(rnn)
    if symbol is None or spec is None:
        return
    for index in spec.state_inputs:
        name = spec.inputs[index]
        state = input_at(rnn, index)
        dims = prover.dims(state)
        size = dims[batch_axis].value if dims is not None and len(dims) == 3 else None
        if size is not None:
            yield Hazard.at(
                "frozen-axis",
                rnn,
                f"{name} has constant batch {size} while X's batch is {symbol!r} "
                f"({_declared([symbol], symbols)}, declared dynamic): other sizes fail",
            )


def _exporter_bug(rnn: ir.Node) -> Hazard | None:
    bug = onnxscript_gru_bug(rnn)
    return None if bug is None else Hazard.at("exporter-bug", rnn, bug)


def is_recurrent_loop(node: ir.Node) -> bool:
    """A ``Loop`` or ``Scan`` that carries a state and whose body multiplies by weights and
    applies a gate activation: a recurrent cell computed one step per body call."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Loop", "Scan"):
        return False
    body = node.attributes.get("body")
    if body is None:
        return False
    graph = body.as_graph()
    if node.op_type == "Loop":
        carried = len(node.inputs) - 2  # trip count and condition come first
    else:
        carried = len(node.inputs) - node.attributes.get_int("num_scan_inputs", 0)
    ops = {n.op_type for n in graph.all_nodes() if n.domain in ("", "ai.onnx")}
    return carried > 0 and bool(ops & _CELL_ACTIVATIONS) and bool(ops & _CELL_PRODUCTS)


def loop_hazards(node: ir.Node) -> list[Hazard]:
    """``loop-recurrence`` for a :func:`is_recurrent_loop` node."""
    if not is_recurrent_loop(node):
        return []
    kind = "loop" if node.op_type == "Loop" else "scan"
    message = (
        f"a recurrent cell computed in a {node.op_type} body, one subgraph call per step "
        f"(a single RNN/LSTM/GRU node where the {kind} is proven one)"
    )
    return [Hazard.at("loop-recurrence", node, message)]


def subject_hazards(node: ir.Node, main_graph: ir.Graph | None = None) -> list[Hazard]:
    """The hazards of an RNN node or of a recurrent Loop/Scan (see :func:`rnn_hazards`)."""
    if is_rnn(node):
        return rnn_hazards(node, main_graph)
    return loop_hazards(node)


def rnn_hazards(node: ir.Node, main_graph: ir.Graph | None = None) -> list[Hazard]:
    """The hazards of one RNN node that need no shape inference (all but frozen axes).

    ``main_graph``: the model's main graph, whose inputs' declared shapes are facts."""
    checks = (_exporter_bug, _layout, _weight_preparation, _shape_chain)
    hazards = (check(node) for check in checks)
    found = [hazard for hazard in hazards if hazard is not None]
    return found + exporter_form_hazards(node, main_graph)


def find_hazards(model: ir.Model) -> list[Hazard]:
    """Every hazard of ``model``; frozen axes are looked for in the main graph only."""
    hazards = [h for n in model.graph.all_nodes() for h in subject_hazards(n, model.graph)]
    symbols = _input_symbols(model)
    if symbols:
        prover = ShapeProver(model.graph)
        for node in model.graph:
            if node.op_type == "Reshape" and node.domain in ("", "ai.onnx"):
                hazard = _frozen_reshape(node, prover, symbols)
                if hazard is not None:
                    hazards.append(hazard)
            elif is_rnn(node):
                hazards.extend(_frozen_initial_state(node, prover, symbols))
        hazards.extend(_unrolled(model.graph, prover, symbols))
    for fix in output_shape_fixes(model):
        message = f"{fix}: other input sizes contradict it"
        hazards.append(Hazard("declared-output-shape", f"output {fix.value.name!r}", message))
    order = {kind: index for index, kind in enumerate(KINDS)}
    return sorted(hazards, key=lambda h: order[h.kind])


# ---------------------------------------------------------------------- exporter forms
# Forms third-party exporters write that a family rewrites when the shape prover proves
# it equivalent; the hazard names each one whether or not that proof succeeds, so a form
# left alone is still reported (with the family's reason in the report).


def exporter_form_hazards(rnn: ir.Node, main_graph: ir.Graph | None = None) -> list[Hazard]:
    """Zero-looking states, hand-built directions and If rank checks around ``rnn``."""
    zero_state = _unproven_zero_state(rnn, main_graph)
    found = [zero_state, _hand_built_direction(rnn), *_rank_checks(rnn)]
    return [hazard for hazard in found if hazard is not None]


#: Producers of a state tensor filled at run time (zeros_like, Expand(0), Tile, x * 0).
_STATE_FILLS = {"ConstantOfShape", "Expand", "Tile", "Mul"}


def _unproven_zero_state(rnn: ir.Node, main_graph: ir.Graph | None) -> Hazard | None:
    """A state computed at run time that looks zero-filled but is not proven zeros of
    shape ``[D, batch of X, H]`` (batch from an unrelated input, ``x * 0`` of a tensor
    that may be inf/NaN): the runtime computes it every call."""
    from rnn_rewrite_rules.rules.initial_state import state_reason  # rules import us lazily
    from rnn_rewrite_rules.shape.values import is_all_zeros

    spec = rnn_op(rnn)
    indices = spec.state_inputs if spec else ()
    prover = ShapeProver(main_graph)
    for index in indices:
        state = input_at(rnn, index)
        if state is None or state.is_graph_input() or _is_constant(state):
            continue  # a constant of the wrong batch is a frozen axis, reported as such
        fills = _fill_nodes(state)
        if not fills:
            continue
        name = "initial_c" if index == 6 else "initial_h"
        why: str | None
        if not is_all_zeros(state):
            why = "it is not provably zeros (x * 0 is NaN where x is inf or NaN)"
        else:
            why = state_reason(rnn, state, prover)
            if why is None or not _batch_known(rnn, prover):
                continue  # proven (dropped), or X's own batch is unknown (a frozen axis?)
        return Hazard.at(
            "unproven-zero-state",
            rnn,
            f"{name} is filled at run time by {_summary(fills)} but cannot be dropped: {why}",
        )
    return None


def _batch_known(rnn: ir.Node, prover: ShapeProver) -> bool:
    """X's batch is a number or a graph input's size (not lost in an unproven Reshape)."""
    layout = rnn.attributes.get_int("layout", 0)
    batch = prover.dim(rnn.inputs[0] if rnn.inputs else None, 0 if layout == 1 else 1)
    if batch is None:
        return False
    return all(s.value.is_graph_input() for monomial, _ in batch.terms for s in monomial)


def _fill_nodes(value: ir.Value, depth: int = 6) -> list[ir.Node]:
    """The fill ops among the pass-through/Slice/Concat producers of ``value``."""
    found: list[ir.Node] = []
    stack = [(value, 0)]
    while stack:
        current, hops = stack.pop()
        node = current.producer()
        if node is None or hops > depth:
            continue
        if node.op_type in _STATE_FILLS:
            found.append(node)
        elif node.op_type in _PASS_THROUGH | {"Slice", "Concat"}:
            stack.extend((v, hops + 1) for v in node.inputs[:1] if v is not None)
            if node.op_type == "Concat":
                stack.extend((v, hops + 1) for v in node.inputs[1:] if v is not None)
    return found


def _reversed_input(value: ir.Value | None) -> ir.Node | None:
    """The Slice with a negative step on axis 0 that produces ``value``, if any."""
    node = None if value is None else value.producer()
    if node is None or node.op_type != "Slice" or len(node.inputs) < 5:
        return None
    steps = node.inputs[4]
    array = None if steps is None else ir.convenience.get_const_tensor(steps)
    if array is None or not (array.numpy() < 0).any():
        return None
    return node


def _hand_built_direction(rnn: ir.Node) -> Hazard | None:
    """An RNN reading its input reversed by a Slice (a hand-built reverse half), or the
    forward RNN whose input another such half reverses (its partner)."""
    x = rnn.inputs[0] if rnn.inputs else None
    reverse = _reversed_input(x)
    if reverse is None:
        partner = reverse_partner(rnn)
        if partner is None:
            return None
        return Hazard.at(
            "hand-built-direction",
            rnn,
            f"the forward half of a hand-built bidirectional pair: {describe_node(partner)} "
            "reads the same input reversed (one node with direction='bidirectional' does both)",
        )
    return Hazard.at(
        "hand-built-direction",
        rnn,
        f"reads its input reversed by {describe_node(reverse)}: a hand-built reverse or "
        "bidirectional half (one node with direction='reverse'/'bidirectional' does both "
        "reversals in the kernel)",
    )


def reverse_partner(rnn: ir.Node) -> ir.Node | None:
    """Another RNN of the same op whose input is a reversing Slice of ``rnn``'s input."""
    x = rnn.inputs[0] if rnn.inputs else None
    if x is None or rnn.attributes.get_string("direction", "forward") != "forward":
        return None
    for use in x.uses():
        if (
            use.node.op_type != "Slice"
            or use.idx != 0
            or _reversed_input(use.node.outputs[0]) is None
        ):
            continue
        for reader in use.node.outputs[0].uses():
            other = reader.node
            if other is not rnn and reader.idx == 0 and other.op_type == rnn.op_type:
                return other
    return None


def _rank_checks(rnn: ir.Node) -> Iterator[Hazard]:
    """If nodes choosing on a shape around ``rnn``: one producing X (through pass-through
    ops), or one whose condition reads the shape of an output."""
    value = rnn.inputs[0] if rnn.inputs else None
    for _ in range(8):
        node = None if value is None else value.producer()
        if node is None:
            break
        if node.op_type == "If":
            if not _emptiness_test(node):
                yield Hazard.at(
                    "runtime-rank-check",
                    rnn,
                    f"its input is chosen at run time by {describe_node(node)} (a rank check)",
                )
            break
        if node.op_type not in _PASS_THROUGH:
            break
        value = node.inputs[0]
    for _, consumer in _derived_values(rnn):
        if consumer.op_type != "Shape":
            continue
        for node in _shape_readers(consumer):
            if node.op_type == "If":
                yield Hazard.at(
                    "runtime-rank-check",
                    rnn,
                    f"{describe_node(node)} branches on its output's shape at run time",
                )


def _emptiness_test(node: ir.Node) -> bool:
    """``node`` (an ``If``) tests ``Equal(n, 0)``, or an ``Or`` of two such: whether a
    length, a count or a size is 0 (a zero-step guard ``loop_scan`` writes), not a rank."""
    from rnn_rewrite_rules.rules.loop_scan.zero_step import zero_tests  # rules import us

    condition = node.inputs[0] if node.inputs else None
    return None not in zero_tests(condition, ShapeProver())


def _shape_readers(shape: ir.Node) -> Iterator[ir.Node]:
    """Nodes reached from a Shape node through shape arithmetic (and Size, Not)."""
    stack = [shape]
    seen = {shape}
    while stack:
        node = stack.pop()
        for value in node.outputs:
            for use in value.uses():
                consumer = use.node
                if consumer in seen:
                    continue
                seen.add(consumer)
                yield consumer
                if consumer.op_type in _SHAPE_ARITHMETIC | {"Size", "Not", "Greater", "Less"}:
                    stack.append(consumer)
