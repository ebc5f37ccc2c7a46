"""ONNX's own shape function for every op with no hand-written transfer function.

:mod:`.ops` holds the transfer functions that track what ONNX's inference cannot: the
elements of shape tensors as polynomials, and sizes as exact symbols. For every other op
(``Einsum``, ``Conv``, ``Pad``, ``Resize``, ...) :func:`infer` asks the op schema's own
shape function (``onnx.shape_inference.infer_node_outputs``) at the opset the node runs
at: each proven size goes in as a ``dim_value`` or as a ``dim_param`` naming its
:class:`~.dim.Dim`, so rank, static sizes and sizes passed through unchanged (Conv's
batch, Einsum's labels) come back, mapped to the same :class:`~.dim.Dim`. A
``dim_param`` ONNX invents is unknown. Small constant inputs (initializers, ``Constant``
outputs, and int tensors whose elements the prover knows: pads, axes, sizes) go in as
``input_data``, which the shape functions of Pad, Resize, Reduce* and others read.

Only the node, its attributes and the input facts are read: never value_info or a
declared output shape. Element types are chosen to satisfy the schema's type
constraints (a constant's own type first); shape functions do not depend on them.
A sequence value's fact is what every tensor in it is known to be (``Fact.sequence``),
so ``SplitToSequence`` -> ``SequenceAt`` keeps the rank and the sizes not split. Optional
and map values, nodes carrying subgraphs or referring to function attributes, and ops
without a schema at that opset are unknown. Any failure of ONNX's
inference (an inconsistent node, a missing input) is unknown, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import defs, shape_inference

from rnn_rewrite_rules.shape import semantics
from rnn_rewrite_rules.shape.dim import Dim
from rnn_rewrite_rules.shape.fact import UNKNOWN, Fact

__all__ = ["infer"]

#: ONNX Runtime loads models from opset 7; a lower ``ai.onnx`` import on a subgraph is
#: the placeholder ("": 1) onnxscript's rewriter writes there, not the opset it runs at.
_MIN_OPSET = 7
#: Constant inputs larger than this are not passed as ``input_data`` (no shape function
#: reads a large tensor's content; serialising weights per query would be slow).
_MAX_DATA = 4096
_PREFIX = "rnnrw_dim_"
_PREFERRED = ("tensor(float)", "tensor(int64)", "seq(tensor(float))")

#: Attributes with which an op's ONNX shape function is wrong (found by the property
#: tests): ConvTranspose's ``output_shape`` ``[1]`` gives rank 2 for a rank-3 output.
_UNTRUSTED = {("", "ConvTranspose"): frozenset({"output_shape"})}

_INPUT_PREFIX, _OUTPUT_PREFIX = "rnnrw_in_", "rnnrw_out_"
_VARIADIC = defs.OpSchema.FormalParameterOption.Variadic


def infer(
    node: ir.Node, ins: Sequence[Fact | None], main_graph: ir.Graph | None = None
) -> list[Fact]:
    """The output facts ONNX's shape function for ``node`` proves from ``ins``; ``[]``
    (every output unknown) when it cannot run. ``main_graph``: the model's, whose
    imports a subgraph's node runs at."""
    try:
        return _infer(node, ins, main_graph)
    except Exception:
        return []


def _opset(node: ir.Node, domain: str, main_graph: ir.Graph | None) -> int | None:
    """The opset of ``domain`` the node runs at: its own version, else its graph's (or
    function's) import, else, in a subgraph (which has none, or onnxscript's
    placeholder), the main graph's."""
    if node.version is not None:
        return node.version
    for graph in (node.graph, main_graph):
        imports = {} if graph is None else graph.opset_imports
        version = imports.get(domain, imports.get("ai.onnx") if domain == "" else None)
        if version is not None and (domain != "" or version >= _MIN_OPSET):
            return version
    return None


def _schema(node: ir.Node, main_graph: ir.Graph | None) -> tuple[defs.OpSchema, int] | None:
    """The op's schema at the opset the node runs at, if ONNX has a shape function for it
    that is trusted with the node's attributes."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = _opset(node, domain, main_graph)
    if version is None or not defs.has(node.op_type, version, domain):
        return None
    schema = defs.get_schema(node.op_type, version, domain)
    if not schema.has_type_and_shape_inference_function:
        return None
    if _UNTRUSTED.get((domain, node.op_type), frozenset()).intersection(node.attributes):
        return None
    return schema, version


def _infer(node: ir.Node, ins: Sequence[Fact | None], main_graph: ir.Graph | None) -> list[Fact]:
    if any(
        attr.is_ref() or attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for attr in node.attributes.values()
    ):
        return []
    found = _schema(node, main_graph)
    if found is None:
        return []
    schema, version = found
    names = _Names()
    proto = ir.serde.serialize_node(node)
    del proto.input[:], proto.output[:]
    proto.input.extend(
        "" if value is None else f"{_INPUT_PREFIX}{i}" for i, value in enumerate(node.inputs)
    )
    proto.output.extend(f"{_OUTPUT_PREFIX}{i}" for i in range(len(node.outputs)))
    constants = [_constant(value) for value in node.inputs]
    types = _element_types(schema, node.inputs, constants)
    if types is None:
        return []
    input_types: dict[str, onnx.TypeProto] = {}
    input_data: dict[str, onnx.TensorProto] = {}
    for i, value in enumerate(node.inputs):
        if value is None:
            continue
        name = proto.input[i]
        given = ins[i] if i < len(ins) else None
        fact = UNKNOWN if given is None else given
        type_str = types[i]
        if type_str.startswith("seq(") and type_str[4:-1] in _DTYPES:
            sequence = onnx.TypeProto()
            element = fact.sequence or UNKNOWN
            sequence.sequence_type.elem_type.CopyFrom(
                _tensor_type(_DTYPES[type_str[4:-1]], element, names)
            )
            input_types[name] = sequence
            continue
        if type_str not in _DTYPES:
            return []  # an optional or map value: nothing to say
        dtype = _DTYPES[type_str]
        input_types[name] = _tensor_type(dtype, fact, names)
        data = _data(constants[i], fact, dtype)
        if data is not None:
            data.name = name
            input_data[name] = data
    opsets = [onnx.helper.make_opsetid(schema.domain, version)]
    outputs = shape_inference.infer_node_outputs(
        schema, proto, input_types, input_data, opset_imports=opsets
    )
    facts = [_fact(outputs.get(name), names) for name in proto.output]
    correct = _CORRECTIONS.get((schema.domain, node.op_type))
    return facts if correct is None else correct(node, ins, facts)


class _Names:
    """One ``dim_param`` per distinct :class:`Dim`, and back."""

    def __init__(self) -> None:
        self.by_dim: dict[Dim, str] = {}
        self.by_name: dict[str, Dim] = {}

    def name(self, dim: Dim) -> str:
        if dim not in self.by_dim:
            name = f"{_PREFIX}{len(self.by_dim)}"
            self.by_dim[dim] = name
            self.by_name[name] = dim
        return self.by_dim[dim]


def _tensor_type(dtype: int, fact: Fact, names: _Names) -> onnx.TypeProto:
    type_proto = onnx.TypeProto()
    tensor = type_proto.tensor_type
    tensor.elem_type = dtype
    if fact.dims is not None:
        shape = tensor.shape
        shape.SetInParent()  # rank 0 is a shape too
        for dim in fact.dims:
            entry = shape.dim.add()
            if dim is None:
                continue
            if dim.value is not None:
                entry.dim_value = dim.value
            else:
                entry.dim_param = names.name(dim)
    return type_proto


def _fact(type_proto: onnx.TypeProto | None, names: _Names) -> Fact:
    if type_proto is None:
        return UNKNOWN
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        element = _fact(type_proto.sequence_type.elem_type, names)
        return UNKNOWN if element.dims is None else Fact(sequence=element)
    if kind != "tensor_type":
        return UNKNOWN
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        return UNKNOWN
    dims: list[Dim | None] = []
    for entry in tensor.shape.dim:
        kind = entry.WhichOneof("value")
        if kind == "dim_value" and entry.dim_value >= 0:
            dims.append(Dim.const(entry.dim_value))
        elif kind == "dim_param":
            dims.append(names.by_name.get(entry.dim_param))  # one ONNX invented: unknown
        else:
            dims.append(None)
    return Fact(tuple(dims))


def _constant(value: ir.Value | None) -> ir.TensorProtocol | None:
    """A small constant input's tensor (an initializer that is a graph input can be fed)."""
    if value is None or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None or tensor.size > _MAX_DATA:
        return None
    return tensor


def _data(tensor: ir.TensorProtocol | None, fact: Fact, dtype: int) -> onnx.TensorProto | None:
    """The input's content for the shape function: the constant, or the int elements the
    prover knows (as the element type chosen for the input)."""
    if tensor is not None:
        return ir.serde.serialize_tensor(tensor) if tensor.dtype == dtype else None
    ints = fact.ints()
    if ints is None or fact.rank not in (0, 1) or dtype not in _INT_DTYPES:
        return None
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    limits = np.iinfo(np_type)
    if not all(limits.min <= v <= limits.max for v in ints):
        return None  # does not fit the chosen type
    return onnx.numpy_helper.from_array(
        np.array(ints, np_type).reshape(() if fact.rank == 0 else -1)
    )


def _element_types(
    schema: defs.OpSchema,
    inputs: Sequence[ir.Value | None],
    constants: Sequence[ir.TensorProtocol | None],
) -> list[str] | None:
    """A type string per input satisfying the schema: each type parameter bound once,
    to a constant input's own type when one has it, else a tensor type it allows."""
    formals = list(schema.inputs)
    if not formals and any(v is not None for v in inputs):
        return None
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    params: list[str] = []
    for i in range(len(inputs)):
        if i < len(formals):
            params.append(formals[i].type_str)
        elif formals and formals[-1].option == _VARIADIC:
            params.append(formals[-1].type_str)
        else:
            return None  # more inputs than the schema takes
    bound: dict[str, str] = {}
    for param, tensor in zip(params, constants, strict=True):
        if tensor is not None and param in allowed:
            type_str = f"tensor({_TYPE_NAMES.get(int(tensor.dtype), '?')})"
            if type_str in allowed[param]:
                bound.setdefault(param, type_str)
    for param in params:
        if param in allowed and param not in bound:
            choices = allowed[param]
            preferred = [t for t in _PREFERRED if t in choices]
            known = [t for t in choices if t in _DTYPES or t[4:-1] in _DTYPES]
            bound[param] = (preferred or known or choices or ["?"])[0]
    return [bound.get(param, param) for param in params]


_DTYPES: dict[str, int] = {
    f"tensor({name})": dtype
    for name, dtype in (
        (onnx.helper.tensor_dtype_to_string(t).removeprefix("TensorProto.").lower(), t)
        for t in onnx.TensorProto.DataType.values()
        if t != onnx.TensorProto.UNDEFINED
    )
}
_DTYPES["tensor(float)"] = onnx.TensorProto.FLOAT
_DTYPES["tensor(double)"] = onnx.TensorProto.DOUBLE
_TYPE_NAMES = {dtype: name[len("tensor(") : -1] for name, dtype in _DTYPES.items()}
_INT_DTYPES = frozenset(
    {
        onnx.TensorProto.INT64,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT64,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT8,
    }
)


# ---------------------------------------------------------------- where ONNX's inference is wrong
# Each correction was found by tests/test_shape_schema.py: ONNX's shape function states
# a size that ONNX Runtime or onnx.reference contradicts. It keeps what stays true.


def _known_dims(dims: Sequence[Dim | None]) -> tuple[Dim, ...] | None:
    """``dims`` when every size is known, else None."""
    known = tuple(dim for dim in dims if dim is not None)
    return known if len(known) == len(dims) else None


def _einsum(node: ir.Node, ins: Sequence[Fact | None], facts: list[Fact]) -> list[Fact]:
    """ONNX takes a label's size from one operand, but ONNX Runtime and numpy broadcast a
    size 1 against the others (``btgi,gih`` with ``g`` 1 in one and 0 in the other is
    0): a label's size is its broadcast over every operand, and so is the ellipsis."""
    if len(facts) != 1 or facts[0].dims is None:
        return facts
    attr = node.attributes.get("equation")
    equation = "" if attr is None else attr.as_string().replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    unknown = [Fact((None,) * len(facts[0].dims))]
    operands = [ins[i] if i < len(ins) else None for i in range(len(terms))]
    if len(terms) != len(node.inputs):
        return unknown
    labels: dict[str, list[Dim]] = {}
    ellipses: list[tuple[Dim, ...]] = []
    for term, fact in zip(terms, operands, strict=True):
        known = None if fact is None or fact.dims is None else _known_dims(fact.dims)
        if known is None:
            return unknown
        head, dots, tail = term.partition("...")
        middle = len(known) - len(head) - len(tail)
        if middle < 0 or (middle and not dots):
            return unknown
        ellipses.append(known[len(head) : len(head) + middle])
        for label, dim in zip(
            head + tail, known[: len(head)] + known[len(head) + middle :], strict=True
        ):
            labels.setdefault(label, []).append(dim)
    if not arrow:  # implicit output: the ellipsis, then the labels used once, sorted
        counts = {label: lhs.count(label) for label in labels}
        rhs = ("..." if "..." in lhs else "") + "".join(
            sorted(k for k, c in counts.items() if c == 1)
        )
    head, _, tail = rhs.partition("...")
    if any(k not in labels for k in head + tail):
        return [UNKNOWN]  # an output label no operand has: ONNX's inference raises first
    out: list[Dim | None] = [semantics.broadcast(*[(d,) for d in labels[k]])[0] for k in head]
    if "..." in rhs:
        out.extend(semantics.broadcast(*ellipses))
    out.extend(semantics.broadcast(*[(d,) for d in labels[k]])[0] for k in tail)
    return [Fact(tuple(out))] if len(out) == len(facts[0].dims) else [UNKNOWN]


def _windows(node: ir.Node, ins: Sequence[Fact | None], facts: list[Fact]) -> list[Fact]:
    """Convolution and pooling sizes along a spatial axis agree between ONNX, ONNX
    Runtime and onnx.reference only when the axis is not empty, ``ceil_mode`` is 0 and
    the padded axis holds one window (else ONNX says 1 where the spec's floor gives 0,
    ONNX Runtime fails or agrees with ONNX, and ceil_mode differs too), and, for
    ConvTranspose, without both SAME padding and output_padding: elsewhere the spatial
    sizes are unknown; the batch and channels stay."""
    x = ins[0] if ins else None
    if x is None or x.dims is None or not facts or facts[0].dims is None:
        return facts
    spatial = len(x.dims) - 2
    if spatial < 1 or len(facts[0].dims) != len(x.dims):
        return [Fact((None,) * len(f.dims)) if f.dims is not None else f for f in facts]
    auto_pad = node.attributes.get("auto_pad")
    mode = "NOTSET" if auto_pad is None else auto_pad.as_string()
    given = _int_list(node, "kernel_shape")
    kernel: list[int | None] | None = None if given is None else [*given]
    weight_index = 3 if node.op_type == "QLinearConv" else 1
    weight = ins[weight_index] if len(ins) > weight_index else None
    if kernel is None and weight is not None:
        w = weight.dims
        if w is not None and len(w) == len(x.dims):
            kernel = [None if d is None else d.value for d in w[2:]]
    pads = _int_list(node, "pads") or [0] * (2 * spatial)
    dilations = _int_list(node, "dilations") or [1] * spatial
    ceil = node.attributes.get("ceil_mode")
    # ConvTranspose with SAME padding: ONNX adds output_padding, ONNX Runtime does not
    padded_same = mode.startswith("SAME") and any(_int_list(node, "output_padding") or [])
    dims = list(facts[0].dims)
    for i in range(spatial):
        size = x.dims[2 + i]
        n = None if size is None else size.value
        fits = (ceil is None or ceil.as_int() == 0) and n is not None and n > 0 and not padded_same
        if fits and node.op_type != "ConvTranspose" and mode in ("NOTSET", "VALID"):
            k = kernel[i] if kernel is not None and i < len(kernel) else None
            padding = (
                pads[i] + pads[i + spatial] if mode == "NOTSET" and len(pads) == 2 * spatial else 0
            )
            fits = k is not None and n is not None and n + padding >= (k - 1) * dilations[i] + 1
        if not fits:
            dims[2 + i] = None
    corrected = Fact(tuple(dims))
    return [corrected if f.dims is not None and len(f.dims) == len(dims) else f for f in facts]


def _int_list(node: ir.Node, name: str) -> list[int] | None:
    attr = node.attributes.get(name)
    return None if attr is None else list(attr.as_ints())


_Correction = Callable[[ir.Node, Sequence[Fact | None], list[Fact]], list[Fact]]
_CORRECTIONS: dict[tuple[str, str], _Correction] = {("", "Einsum"): _einsum}
_WINDOW_OPS = "Conv ConvInteger ConvTranspose QLinearConv DeformConv MaxPool AveragePool LpPool"
for _op in _WINDOW_OPS.split():
    _CORRECTIONS[("", _op)] = _windows
