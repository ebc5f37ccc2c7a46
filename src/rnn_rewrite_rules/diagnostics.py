"""RNN hazards in a model, found statically (``rnn-rewrite --check``).

* ``runtime-shape-chain``: ``Y``'s shape is recomputed at run time (``Shape`` -> ``Slice``
  -> ... -> ``Reshape``) after an RNN node.
* ``runtime-weight-prep``: ``W``/``R``/``B`` are computed at run time from initializers;
  ONNX Runtime folds them at session creation (slow load) or recomputes them every call.
* ``layout-1``: ``layout=1`` RNNs, which ONNX Runtime's CPU kernels reject.
* ``frozen-axis``: an axis declared dynamic at a graph input but frozen to a constant
  inside, e.g. ``Reshape(Transpose(Y), [3, -1, 32])`` while the input declares ``seq``
  (torch's exporter does this silently): other sizes fail or give wrong shapes.

Frozen axes are found with ONNX shape inference on a copy that has no value-info
annotations (the exporter's annotations may already carry the frozen size).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Iterator

import onnx
import onnx_ir as ir

from rnn_rewrite_rules import _compat
from rnn_rewrite_rules._rnn import RNN_OPS, const_array

__all__ = ["KINDS", "Hazard", "describe_node", "find_hazards", "is_rnn", "rnn_hazards"]

KINDS = ("runtime-shape-chain", "runtime-weight-prep", "layout-1", "frozen-axis")

#: Ops that move a tensor's data without changing what its axes mean to a shape reader.
_PASS_THROUGH = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten", "Cast"}
#: Ops that compute on shape tensors.
_SHAPE_ARITHMETIC = {
    "Shape", "Slice", "Gather", "Concat", "Mul", "Add", "Sub", "Div", "Reshape", "Squeeze",
    "Unsqueeze", "Cast", "Identity", "ReduceProd", "Max", "Min", "Range", "Equal", "Where",
}  # fmt: skip
_WEIGHT_INPUTS = {"LSTM": {1: "W", 2: "R", 3: "B", 7: "P"}, "GRU": {1: "W", 2: "R", 3: "B"}}


@dataclasses.dataclass(frozen=True)
class Hazard:
    kind: str
    #: The node at fault, as :func:`describe_node` names it.
    node: str
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.node}: {self.message}"


def is_rnn(node: ir.Node) -> bool:
    domain = "" if node.domain == "ai.onnx" else node.domain
    return (domain, node.op_type) in RNN_OPS


def describe_node(node: ir.Node) -> str:
    """``LSTM 'name'``, or ``LSTM (-> 'first output')`` for an unnamed node."""
    if node.name:
        return f"{node.op_type} {node.name!r}"
    outputs = [v.name for v in node.outputs if v is not None and v.name]
    return f"{node.op_type} (-> {outputs[0]!r})" if outputs else node.op_type


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
    return Hazard(
        "runtime-shape-chain",
        describe_node(rnn),
        f"its output shape is recomputed at run time by {len(chain)} nodes "
        f"({_summary(chain)}){feeds}",
    )


def _preparation(value: ir.Value) -> set[ir.Node] | None:
    """The nodes computing ``value`` from constants only, or None if it needs a graph input."""
    cone: set[ir.Node] = set()
    stack = [value]
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
    names = _WEIGHT_INPUTS.get(rnn.op_type, {1: "W", 2: "R", 3: "B"})
    prepared: list[str] = []
    cone: set[ir.Node] = set()
    for index, name in names.items():
        value = rnn.inputs[index] if index < len(rnn.inputs) else None
        if value is None or _is_constant(value):
            continue
        nodes = _preparation(value)
        if nodes:
            prepared.append(name)
            cone |= nodes
    if not prepared:
        return None
    nodes = [n for n in cone if n.op_type != "Constant"]
    return Hazard(
        "runtime-weight-prep",
        describe_node(rnn),
        f"{', '.join(prepared)} computed at run time from initializers by {len(nodes)} nodes "
        f"({_summary(nodes)}); ONNX Runtime folds them at load or recomputes them per call",
    )


def _layout(rnn: ir.Node) -> Hazard | None:
    if rnn.domain not in ("", "ai.onnx") or rnn.attributes.get_int("layout", 0) != 1:
        return None
    return Hazard(
        "layout-1",
        describe_node(rnn),
        "layout=1 (batch-major): ONNX Runtime's CPU kernels reject it "
        "('Batchwise recurrent operations (layout == 1) are not supported')",
    )


Dim = int | str | None


def _dims(value_info: onnx.ValueInfoProto) -> list[Dim] | None:
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
        for d in tensor_type.shape.dim
    ]


def _infer(model: ir.Model) -> dict[str, list[Dim]]:
    """Shapes of main-graph values from ONNX shape inference, ignoring stored annotations."""

    def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
        proto.graph.ClearField("value_info")
        for output in proto.graph.output:
            output.type.tensor_type.ClearField("shape")
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)

    inferred = _compat.call_onnx_api(infer, model)  # drops big tensors
    graph = inferred.graph
    shapes = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        dims = _dims(info)
        if dims is not None:
            shapes[info.name] = dims
    return shapes


def _after_rnn(value: ir.Value, hops: int = 6) -> ir.Node | None:
    for _ in range(hops):
        producer = value.producer()
        if producer is None:
            return None
        if is_rnn(producer):
            return producer
        if producer.op_type not in _PASS_THROUGH or not producer.inputs:
            return None
        value = producer.inputs[0]
    return None


def _frozen_reshape(
    node: ir.Node, shapes: dict[str, list[Dim]], symbols: dict[str, tuple[str, int]]
) -> Hazard | None:
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    target = const_array(node.inputs[1])
    data = shapes.get(node.inputs[0].name or "")
    if target is None or data is None or target.ndim != 1:
        return None
    target = [int(t) for t in target]
    copies = node.attributes.get_int("allowzero", 0) == 0
    free: list[tuple[int, str]] = []
    data_const = 1
    for axis, dim in enumerate(data):
        if copies and axis < len(target) and target[axis] == 0:
            continue  # copied through unchanged
        if isinstance(dim, int):
            data_const *= dim
        elif isinstance(dim, str) and dim in symbols:
            free.append((axis, dim))
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
    if not definite and not positional:
        return None
    if positional:
        frozen = ", ".join(f"{dim!r} to {size}" for _, dim, size in positional)
        axes = [dim for _, dim, _ in positional]
    else:
        frozen = " x ".join(repr(dim) for _, dim in free)
        frozen += f" to a multiple of {factor}" if factor else " to a constant"
        axes = [dim for _, dim in free]
    declared = "; ".join(
        f"{dim!r} is axis {symbols[dim][1]} of input {symbols[dim][0]!r}"
        for dim in dict.fromkeys(axes)
    )
    rnn = _after_rnn(node.inputs[0])
    after = f" after {describe_node(rnn)}" if rnn is not None else ""
    consequence = "other sizes fail" if definite else "other sizes give wrong shapes"
    return Hazard(
        "frozen-axis",
        describe_node(node),
        f"constant target {target}{after} freezes {frozen} ({declared}, declared dynamic): "
        f"{consequence}",
    )


def _frozen_initial_state(
    rnn: ir.Node, shapes: dict[str, list[Dim]], symbols: dict[str, tuple[str, int]]
) -> Iterator[Hazard]:
    batch_axis = 0 if rnn.attributes.get_int("layout", 0) == 1 else 1
    x = rnn.inputs[0] if rnn.inputs else None
    x_dims = shapes.get(x.name or "") if x is not None else None
    if not x_dims or len(x_dims) <= batch_axis or x_dims[batch_axis] not in symbols:
        return
    symbol = x_dims[batch_axis]
    for index, name in ((5, "initial_h"), (6, "initial_c")):
        state = rnn.inputs[index] if index < len(rnn.inputs) else None
        dims = shapes.get(state.name or "") if state is not None else None
        if dims and len(dims) > batch_axis and isinstance(dims[batch_axis], int):
            input_name, axis = symbols[symbol]
            yield Hazard(
                "frozen-axis",
                describe_node(rnn),
                f"{name} has constant batch {dims[batch_axis]} while X's batch is {symbol!r} "
                f"(axis {axis} of input {input_name!r}, declared dynamic): other sizes fail",
            )


def _input_symbols(model: ir.Model) -> dict[str, tuple[str, int]]:
    symbols: dict[str, tuple[str, int]] = {}
    for value in model.graph.inputs:
        if value.is_initializer() or value.shape is None:
            continue
        for axis, dim in enumerate(value.shape):
            name = getattr(dim, "value", None)
            if isinstance(name, str) and name and name not in symbols:
                symbols[name] = (value.name or "", axis)
    return symbols


def rnn_hazards(node: ir.Node) -> list[Hazard]:
    """The hazards of one RNN node that need no shape inference (all but frozen axes)."""
    hazards = (check(node) for check in (_layout, _weight_preparation, _shape_chain))
    return [hazard for hazard in hazards if hazard is not None]


def find_hazards(model: ir.Model) -> list[Hazard]:
    """Every hazard of ``model``; frozen axes are looked for in the main graph only."""
    hazards = [h for n in model.graph.all_nodes() if is_rnn(n) for h in rnn_hazards(n)]
    symbols = _input_symbols(model)
    if symbols:
        try:
            shapes = _infer(model)
        except Exception as error:  # shape inference rejects some valid models
            message = " ".join(str(error).split())[:200]
            hazards.append(
                Hazard("frozen-axis", "model", f"not checked: shape inference failed ({message})")
            )
            return hazards
        for node in model.graph:
            if node.op_type == "Reshape" and node.domain in ("", "ai.onnx"):
                hazard = _frozen_reshape(node, shapes, symbols)
                if hazard is not None:
                    hazards.append(hazard)
            elif is_rnn(node):
                hazards.extend(_frozen_initial_state(node, shapes, symbols))
    order = {kind: index for index, kind in enumerate(KINDS)}
    return sorted(hazards, key=lambda h: order[h.kind])
