"""Mutators that put random surroundings and attributes around a core model.

Each mutator is ``mutator(draw, case) -> bool``: it changes ``case`` in place (and notes
what it did in ``case.steps``) or returns False when it does not apply to the model.
Every result is a valid model; :data:`MUTATORS` names them, and the comment on each says
which class of defect it exists to reach.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from rnn_rewrite_rules.testing.fuzz import subgraphs
from rnn_rewrite_rules.testing.fuzz.case import Case, Graph, fresh_names
from rnn_rewrite_rules.testing.fuzz.walk import (
    all_graphs,
    all_nodes,
    main_opset,
    rename_reads,
    value_types,
)

__all__ = ["MUTATORS", "Mutator", "convert_element_type"]

Mutator = Callable[[Callable, Case], bool]

_FLOATS: dict[int, type[np.floating]] = {
    TensorProto.FLOAT16: np.float16,
    TensorProto.FLOAT: np.float32,
    TensorProto.DOUBLE: np.float64,
}
_RNN_OPS = {"LSTM": 3, "GRU": 2, "RNN": 1}
#: ONNX Runtime's RNN activations and how many of (alpha, beta) each reads.
_ACTIVATIONS = {
    "Relu": 0,
    "Tanh": 0,
    "Sigmoid": 0,
    "Affine": 2,
    "LeakyRelu": 1,
    "ThresholdedRelu": 1,
    "ScaledTanh": 2,
    "HardSigmoid": 2,
    "Elu": 1,
    "Softsign": 0,
    "Softplus": 0,
}
_UNARY = ["Identity", "Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Softsign"]


def convert_element_type(model: onnx.ModelProto, target: int) -> None:
    """Every float32 tensor, type and Cast target of ``model`` becomes ``target``."""
    dtype = _FLOATS[target]

    def convert(tensor: onnx.TensorProto) -> None:
        if tensor.data_type == TensorProto.FLOAT:
            array = numpy_helper.to_array(tensor).astype(dtype)
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))

    for graph in all_graphs(model.graph):
        for tensor in graph.initializer:
            convert(tensor)
        for info in [*graph.input, *graph.output, *graph.value_info]:
            if info.type.tensor_type.elem_type == TensorProto.FLOAT:
                info.type.tensor_type.elem_type = target
    for node in all_nodes(model.graph):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                convert(attr.t)
            if node.op_type in ("Cast", "EyeLike") and attr.name in ("to", "dtype"):
                attr.i = target if attr.i == TensorProto.FLOAT else attr.i
        if node.op_type == "ConstantOfShape" and not node.attribute:
            value = numpy_helper.from_array(np.zeros(1, dtype), "value")
            node.attribute.append(helper.make_attribute("value", value))


def _element_type(draw, case: Case) -> bool:
    """float16 / float64 models (defects 1, 3, 10): see :func:`convert_element_type`."""
    if any(o.domain == "com.microsoft" for o in case.model.opset_import):
        return False  # DynamicQuantizeLSTM is float32 only
    target = draw(st.sampled_from([TensorProto.FLOAT16, TensorProto.DOUBLE]))
    convert_element_type(case.model, target)
    case.note(f"element_type({TensorProto.DataType.Name(target)})")
    return True


def _rnn_attributes(draw, case: Case) -> bool:
    """Random activations with alpha/beta, clip and linear_before_reset on each ONNX RNN
    node (defect 2: a bidirectional merge must keep each half's values on its activation)."""
    nodes = [n for n in all_nodes(case.model.graph) if n.op_type in _RNN_OPS and not n.domain]
    if not nodes:
        return False
    for index, node in enumerate(nodes):
        if not draw(st.booleans()):
            continue
        attrs = {a.name: a for a in node.attribute}
        direction = attrs["direction"].s.decode() if "direction" in attrs else "forward"
        count = _RNN_OPS[node.op_type] * (2 if direction == "bidirectional" else 1)
        names = draw(
            st.lists(st.sampled_from(sorted(_ACTIVATIONS)), min_size=count, max_size=count)
        )
        values = st.sampled_from([0.25, 0.5, 1.5, 2.0, -0.75])
        # "used": a value per activation that reads one; "each": one per activation (the
        # runtimes consume them in order, so trailing ones go unused); "none": defaults
        style = draw(st.sampled_from(["used", "each", "none"]))
        alphas = [draw(values) for n in names if style == "each" or _ACTIVATIONS[n] >= 1]
        betas = [draw(values) for n in names if style == "each" or _ACTIVATIONS[n] == 2]
        new = {"activations": [n.encode() for n in names]}
        if alphas and style != "none":
            new["activation_alpha"] = alphas
        if betas and style != "none":
            new["activation_beta"] = betas
        if draw(st.booleans()):
            new["clip"] = draw(st.sampled_from([0.5, 1.0, 3.0]))
        if node.op_type == "GRU":
            new["linear_before_reset"] = draw(st.integers(0, 1))
        kept = [a for a in node.attribute if a.name not in new]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in new.items()])
        case.note(f"rnn_attributes(node {index}: {new})")
    return True


def _bias(draw, case: Case) -> bool:
    """One RNN node's bias dropped, or made a graph input holding inf or finite values
    (defect 3: a merged bias filled as ``Mul(B_other, 0)``)."""
    graph = case.model.graph
    nodes = [n for n in graph.node if n.op_type in _RNN_OPS and len(n.input) > 3 and n.input[3]]
    inits = {t.name: t for t in graph.initializer}
    nodes = [n for n in nodes if n.input[3] in inits]
    if not nodes:
        return False
    node = draw(st.sampled_from(nodes))
    if draw(st.booleans()):
        node.input[3] = ""
        while node.input and not node.input[-1]:
            node.input.pop()
        case.note("bias(dropped)")
        return True
    tensor = inits[node.input[3]]
    array = numpy_helper.to_array(tensor).copy()
    if not any(n.input[3:4] == [tensor.name] for n in graph.node if n is not node):
        graph.initializer.remove(tensor)
    name = next(fresh_names(case.model, "bias_in_"))
    node.input[3] = name
    if draw(st.booleans()):
        array.flat[draw(st.integers(0, array.size - 1))] = np.inf
    graph.input.append(helper.make_tensor_value_info(name, tensor.data_type, list(array.shape)))
    case.fixed[name] = array
    case.note(f"bias(graph input, inf={bool(np.isinf(array).any())})")
    return True


def _info(tensor: onnx.TensorProto) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))


def _float_constants(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """Float initializers that are not graph inputs."""
    inputs = {i.name for i in graph.input}
    return [t for t in graph.initializer if t.data_type in _FLOATS and t.name not in inputs]


def _overridable(draw, case: Case) -> bool:
    """A float initializer that is also a graph input: a value, not a constant."""
    graph = case.model.graph
    tensors = _float_constants(graph)
    if not tensors or case.model.ir_version < 4:
        return False
    tensor = draw(st.sampled_from(tensors))
    graph.input.append(_info(tensor))
    case.note(f"overridable({tensor.name})")
    return True


def _as_constants(draw, case: Case) -> bool:
    """Initializers (not graph inputs) as ``Constant`` nodes at the graph's start."""
    graph = case.model.graph
    inputs = {i.name for i in graph.input}
    moved = [t for t in graph.initializer if t.name not in inputs and draw(st.booleans())]
    if not moved:
        return False
    constants = [helper.make_node("Constant", [], [t.name], value=t) for t in moved]
    for tensor in moved:
        graph.initializer.remove(tensor)
    nodes = constants + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    case.note(f"as_constants({len(moved)})")
    return True


def _computed_weight(draw, case: Case) -> bool:
    """A float initializer read through ``Identity`` or ``Cast`` from float64 (defect 10:
    a double -> float16 Cast folded where the runtimes round differently)."""
    graph = case.model.graph
    tensors = _float_constants(graph)
    if not tensors:
        return False
    tensor = draw(st.sampled_from(tensors))
    array = numpy_helper.to_array(tensor)
    g = Graph(case.model)
    if draw(st.booleans()):
        source = g.const(array)
        op = "Identity"
        node = helper.make_node("Identity", [source], [tensor.name], name=g.fresh())
    else:
        wide = array.astype(np.float64)
        if tensor.data_type == TensorProto.FLOAT16:
            wide = _double_rounding(draw, array)
        source = g.const(wide)
        op = "Cast"
        node = helper.make_node(
            "Cast", [source], [tensor.name], name=g.fresh(), to=tensor.data_type
        )
    graph.initializer.remove(tensor)
    nodes = [node, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    case.note(f"computed_weight({tensor.name} by {op})")
    return True


def _double_rounding(draw, array: np.ndarray) -> np.ndarray:
    """float64 values whose float16 differs when rounded once (numpy, ``onnx.reference``)
    or via float32 (ONNX Runtime): half an ulp above a float16 value plus less than
    float32 keeps, or one element just under float16's overflow threshold (65520)."""
    wide = array.astype(np.float64)
    if draw(st.booleans()):
        ulp = np.spacing(np.abs(array).astype(np.float16)).astype(np.float64)
        return wide + ulp / 2 + ulp * 2.0**-20
    wide.flat[draw(st.integers(0, max(0, wide.size - 1)))] = 65519.9999
    return wide


def _unary_around(draw, case: Case) -> bool:
    """An op the rules do not read on a float graph input or before a float graph output."""
    graph = case.model.graph
    g = Graph(case.model)
    op = draw(st.sampled_from(_UNARY))
    if draw(st.booleans()):
        inputs = [
            i
            for i in graph.input
            if i.type.tensor_type.elem_type in _FLOATS and i.name not in case.fixed
        ]
        inits = {t.name for t in graph.initializer}
        inputs = [i for i in inputs if i.name not in inits]
        if not inputs:
            return False
        name = draw(st.sampled_from(inputs)).name
        new = g.fresh()
        rename_reads(graph, name, new)
        nodes = [helper.make_node(op, [name], [new], name=g.fresh()), *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
        case.note(f"unary_around(input {name}: {op})")
        return True
    outputs = [o for o in graph.output if o.type.tensor_type.elem_type in _FLOATS]
    producers = {o for n in graph.node for o in n.output}
    outputs = [o for o in outputs if o.name in producers]
    if not outputs:
        return False
    name = draw(st.sampled_from(outputs)).name
    new = g.fresh()
    for node in graph.node:
        node.output[:] = [new if o == name else o for o in node.output]
    rename_reads(graph, name, new)
    graph.node.append(helper.make_node(op, [new], [name], name=g.fresh()))
    case.note(f"unary_around(output {name}: {op})")
    return True


def _extra_output(draw, case: Case) -> bool:
    """An intermediate value, or an initializer (defect 8), as another graph output."""
    graph = case.model.graph
    outputs = {o.name for o in graph.output} | {i.name for i in graph.input}
    if draw(st.booleans()):
        tensors = [t for t in graph.initializer if t.name not in outputs]
        if not tensors:
            return False
        tensor = draw(st.sampled_from(tensors))
        graph.output.append(_info(tensor))
        case.note(f"extra_output(initializer {tensor.name})")
        return True
    types = value_types(case.model)
    values = [
        v
        for n in graph.node
        for v in n.output
        if v and v not in outputs and types.get(v, (0, None))[1] is not None
    ]
    if not values:
        return False
    value = draw(st.sampled_from(values))
    elem, rank = types[value]
    assert rank is not None  # values of an unknown rank were left out above
    Graph(case.model).output(value, elem, rank)
    case.note(f"extra_output({value})")
    return True


def _float_outputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph outputs of a float type and a declared rank."""
    return [
        o
        for o in graph.output
        if o.type.tensor_type.elem_type in _FLOATS and o.type.tensor_type.HasField("shape")
    ]


def _rank(info: onnx.ValueInfoProto) -> int:
    return len(info.type.tensor_type.shape.dim)


def _elem(info: onnx.ValueInfoProto) -> int:
    return info.type.tensor_type.elem_type


def _runtime_condition(draw, case: Case) -> bool:
    """An ``If`` whose condition depends on an optional input present at run time: Slice
    axes, Squeeze axes, Split sizes as graph inputs, or a narrowing Cast (defect 4)."""
    floats = _float_outputs(case.model.graph)
    if not floats:
        return False
    opset = main_opset(case.model)
    kinds = ["narrow_cast"] + (["slice_axes"] if opset >= 10 else [])
    kinds += ["squeeze_axes", "split_sizes"] if opset >= 13 else []
    kind = draw(st.sampled_from(kinds))
    g = Graph(case.model)
    if kind == "narrow_cast":
        cond, fixed = subgraphs.narrow_cast_condition(g, draw(st.integers(0, 3)))
    elif kind == "slice_axes":
        dims = draw(st.lists(st.integers(1, 5), min_size=2, max_size=3))
        axis = draw(st.integers(1, len(dims) - 1))
        cond, fixed = subgraphs.slice_axes_condition(g, dims, axis)
    elif kind == "squeeze_axes":
        dims = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
        cond, fixed = subgraphs.squeeze_axes_condition(g, dims)
    else:
        cond, fixed = subgraphs.split_sizes_condition(g, draw(st.sampled_from([4, 6])))
    case.fixed.update(fixed)
    value = draw(st.sampled_from(floats))
    subgraphs.add_if(case.model, cond, value.name, _elem(value), _rank(value))
    case.note(f"runtime_condition({kind}) on {value.name}")
    return True


def _rank_if_two_outputs(draw, case: Case) -> bool:
    """A provable rank check whose taken branch returns one value for two outputs
    (defect 6)."""
    graph = case.model.graph
    ranked = [i for i in graph.input if i.type.tensor_type.HasField("shape")]
    floats = _float_outputs(graph)
    if not ranked or not floats:
        return False
    source = draw(st.sampled_from(ranked))
    value = draw(st.sampled_from(floats))
    subgraphs.add_rank_if_two_outputs(
        case.model, source.name, _rank(source), value.name, _elem(value), _rank(value)
    )
    case.note(f"rank_if_two_outputs(rank of {source.name}, value {value.name})")
    return True


def _loop_rank(draw, case: Case) -> bool:
    """A one-trip ``Loop`` carrying a float graph output whose body input declares a rank
    the value need not have, and checks the rank inside (defect 5)."""
    floats = _float_outputs(case.model.graph)
    if not floats or main_opset(case.model) < 11:
        return False
    value = draw(st.sampled_from(floats))
    declared = draw(st.integers(1, 4))
    subgraphs.add_loop_rank_check(case.model, value.name, _elem(value), _rank(value), declared)
    case.note(f"loop_rank(declared {declared}, value {value.name})")
    return True


def _subgraph_reader(draw, case: Case) -> bool:
    """An ``If`` right after a value's producer that reads the value from the outer scope
    (defect 9: a rewrite must not redirect it to a value defined later)."""
    graph = case.model.graph
    types = value_types(case.model)
    candidates = [
        (i, v)
        for i, n in enumerate(graph.node)
        for v in n.output
        if v in types and types[v][0] in _FLOATS and types[v][1] is not None
    ]
    if not candidates:
        return False
    index, value = draw(st.sampled_from(candidates))
    g = Graph(case.model)
    flag = g.input(g.fresh(), TensorProto.BOOL, [])
    case.fixed[flag] = np.array(draw(st.booleans()))
    elem, rank = types[value]
    assert rank is not None  # values of an unknown rank were left out above
    subgraphs.add_if(case.model, flag, value, elem, rank, ops=("Abs", "Neg"), at=index + 1)
    case.note(f"subgraph_reader({value})")
    return True


def _symbolic_dims(draw, case: Case) -> bool:
    """Static sizes of float graph inputs declared symbolic (at least the static size)."""
    graph = case.model.graph
    dims = [
        (i, d)
        for i in graph.input
        if i.type.tensor_type.elem_type in _FLOATS
        for d in i.type.tensor_type.shape.dim
        if d.HasField("dim_value")
    ]
    inits = {t.name for t in graph.initializer}
    dims = [(i, d) for i, d in dims if i.name not in inits]
    if not dims:
        return False
    info, dim = draw(st.sampled_from(dims))
    size = dim.dim_value
    name = next(fresh_names(case.model, "sym_"))
    dim.dim_param = name
    case.min_sizes[name] = size
    case.note(f"symbolic_dims({info.name}: {size} -> {name})")
    return True


def _collide_names(draw, case: Case) -> bool:
    """Inner values renamed to names the rules generate on this model."""
    import rnn_rewrite_rules

    try:
        once = rnn_rewrite_rules.rewrite(case.model)
    except Exception:
        return False
    before = {v for n in all_nodes(case.model.graph) for v in [*n.input, *n.output]}
    before |= {t.name for g in all_graphs(case.model.graph) for t in g.initializer}
    made = sorted(
        {v for n in once.graph.node for v in n.output if v and v not in before}
        | {t.name for t in once.graph.initializer if t.name not in before}
    )
    graph = case.model.graph
    io = {i.name for i in graph.input} | {o.name for o in graph.output}
    inner = [v for n in graph.node for v in n.output if v and v not in io]
    if not made or not inner:
        return False
    for new in draw(st.lists(st.sampled_from(made), min_size=1, max_size=3, unique=True)):
        old = draw(st.sampled_from(inner))
        for node in graph.node:
            node.output[:] = [new if o == old else o for o in node.output]
        rename_reads(graph, old, new)
        inner = [new if v == old else v for v in inner]
        case.note(f"collide_names({old} -> {new})")
    return True


def _signed_zeros(draw, case: Case) -> bool:
    """Constants ``+0.0`` and ``-0.0`` that make two otherwise equal computations differ
    (``Div(1, +0.0)`` is ``+inf``, ``Div(1, -0.0)`` ``-inf``): two guards
    ``If(Less(Div(1, z), 0))`` concatenated (``MergeGuards``), or two readers of one
    graph input (the halves of a bidirectional pair) reading
    ``Where(Less(Div(1, z), 0), x, -x)`` (defect class S: ``same_value`` on bits)."""
    zeros = st.sampled_from([0.0, -0.0])
    graph = case.model.graph
    inits = {t.name for t in graph.initializer}
    readers = {
        i.name: [n for n in graph.node if i.name in n.input]
        for i in graph.input
        if _elem(i) == TensorProto.FLOAT and i.name not in case.fixed and i.name not in inits
    }
    readers = {k: v for k, v in readers.items() if len(v) >= 2}
    floats = [o for o in _float_outputs(graph) if _elem(o) == TensorProto.FLOAT]
    forms = (["guards"] if floats and main_opset(case.model) >= 11 else []) + (
        ["halves"] if readers and main_opset(case.model) >= 9 else []
    )
    if not forms:
        return False
    signs = (draw(zeros), draw(zeros))
    if draw(st.sampled_from(forms)) == "guards":
        value = draw(st.sampled_from(floats))
        subgraphs.add_signed_zero_guards(case.model, value.name, _elem(value), _rank(value), signs)
        case.note(f"signed_zeros(guards {signs} on {value.name})")
        return True
    name = draw(st.sampled_from(sorted(readers)))
    nodes = readers[name]
    picked = sorted(
        draw(st.lists(st.integers(0, len(nodes) - 1), min_size=2, max_size=2, unique=True))
    )
    for index, zero in zip(picked, signs, strict=True):
        subgraphs.signed_zero_read(case.model, nodes[index], name, zero)
    case.note(f"signed_zeros(readers {picked} of {name}: {signs})")
    return True


#: A Loop body's stacked output as declared: nothing, ``[?, ?]``, ``[?, H]``, as built.
_DECLARATIONS = ("none", "unknown_2d", "batch_h", "kept")


def _zero_step_loop(draw, case: Case) -> bool:
    """A ``Loop`` with a stacked (scan) output redeclared in its body (nothing,
    ``[?, ?]``, ``[?, H]``), the graph then inside an ``If`` branch or another ``Loop``,
    its inputs' first axes at 0 compared on ONNX Runtime too (defect class Z: what a Loop over
    ``len(X)`` gives after no step depends on that declaration)."""
    graph = case.model.graph
    loops = [n for n in graph.node if n.op_type == "Loop" and n.attribute]
    bodies = []
    for node in loops:
        body = next(a.g for a in node.attribute if a.name == "body")
        carried = len(node.input) - 2
        stacked = range(1 + carried, len(body.output))
        bodies += [(body, k) for k in stacked if body.output[k].type.tensor_type.HasField("shape")]
    if not bodies:
        return False
    body, index = draw(st.sampled_from(bodies))
    declared = draw(st.sampled_from(_DECLARATIONS))
    dims = [d.dim_value or None for d in body.output[index].type.tensor_type.shape.dim]
    if declared != "kept":
        shapes = {
            "none": None,
            "unknown_2d": [None, None],
            "batch_h": [None, dims[-1] if dims else None],
        }
        subgraphs.declare_scan_output(body, index, shapes[declared])
    where = draw(st.sampled_from(["main", "if", "loop"]))
    if where == "if":
        pick = next(fresh_names(case.model, "pick_"))
        subgraphs.wrap_in_if(case.model, pick)
        case.fixed[pick] = np.array(True)
    elif where == "loop":
        subgraphs.wrap_in_loop(case.model)
    case.zero_dims |= {  # the time axes: each float input's first, where symbolic
        dims[0].dim_param
        for i in graph.input
        if _elem(i) in _FLOATS and (dims := i.type.tensor_type.shape.dim) and dims[0].dim_param
    }
    case.note(f"zero_step_loop(body output {index} declared {declared}, in {where})")
    return True


#: Mutator name -> function.
MUTATORS: dict[str, Mutator] = {
    "element_type": _element_type,
    "rnn_attributes": _rnn_attributes,
    "bias": _bias,
    "overridable": _overridable,
    "as_constants": _as_constants,
    "computed_weight": _computed_weight,
    "unary_around": _unary_around,
    "extra_output": _extra_output,
    "runtime_condition": _runtime_condition,
    "rank_if_two_outputs": _rank_if_two_outputs,
    "loop_rank": _loop_rank,
    "subgraph_reader": _subgraph_reader,
    "symbolic_dims": _symbolic_dims,
    "collide_names": _collide_names,
    "signed_zeros": _signed_zeros,
    "zero_step_loop": _zero_step_loop,
}
