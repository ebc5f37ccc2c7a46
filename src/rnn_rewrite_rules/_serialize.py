"""Serialize a model in memory without a second copy of its big weights.

:func:`serialize_with_placeholders` stands each big main-graph initializer in for an
external placeholder (``_save.save_embedded`` streams the bytes in afterwards);
:func:`serialize_releasing` moves the weights into the proto one at a time, dropping each
from the model; :func:`structure` is what two models must share to differ at most in
those weights' bytes.
"""

from __future__ import annotations

import contextlib

import onnx
import onnx_ir as ir

__all__ = [
    "STREAM_MIN_BYTES",
    "release",
    "serialize_releasing",
    "serialize_with_placeholders",
    "stream_index",
    "structure",
]

#: Tensors with at least this many bytes are left in the file (loading) or streamed (saving).
STREAM_MIN_BYTES = 1024


def release(tensor: object) -> None:
    """Unmap an external tensor's bytes (it maps them again if read later)."""
    if isinstance(tensor, ir.ExternalTensor):
        with contextlib.suppress(BufferError):  # someone still holds a view of the mapping
            tensor.release()


def _streamable(tensor: ir.TensorProtocol | None) -> bool:
    return (
        tensor is not None
        and tensor.dtype != ir.DataType.STRING
        and tensor.nbytes >= STREAM_MIN_BYTES
    )


def serialize_with_placeholders(
    model: ir.Model, *, restore: bool = True
) -> tuple[onnx.ModelProto, list[ir.TensorProtocol]]:
    """``model`` serialized with each big initializer of the main graph an external
    placeholder at location ``"\0stream/<index>"``, and those tensors by index.
    ``restore=False`` leaves the placeholders in ``model`` (which then no longer holds the
    tensors)."""
    streamed = [v for v in model.graph.initializers.values() if _streamable(v.const_value)]
    sources = [t for v in streamed if (t := v.const_value) is not None]  # all, by _streamable
    try:
        for index, (value, tensor) in enumerate(zip(streamed, sources, strict=True)):
            value.const_value = ir.ExternalTensor(
                f"\0stream/{index}",
                0,
                tensor.nbytes,
                tensor.dtype,
                shape=ir.Shape(tensor.shape.numpy()),  # a tensor's shape is static
                name=value.name or "",
                doc_string=tensor.doc_string,
                metadata_props=dict(tensor.metadata_props),
            )
        proto = ir.serde.serialize_model(model)
    finally:
        if restore:
            for value, tensor in zip(streamed, sources, strict=True):
                value.const_value = tensor
    return proto, sources


def stream_index(tensor_proto: onnx.TensorProto) -> int | None:
    location = next((e.value for e in tensor_proto.external_data if e.key == "location"), "")
    return int(location.split("/")[1]) if location.startswith("\0stream/") else None


def serialize_releasing(model: ir.Model) -> onnx.ModelProto:
    """``ir.serde.serialize_model(model)``, but each big initializer of the main graph is
    dropped from ``model`` once copied into the proto, so that the two hold one copy of
    the weights between them, not two. ``model`` is not usable afterwards."""
    proto, streamed = serialize_with_placeholders(model, restore=False)
    sources: list[ir.TensorProtocol | None] = [*streamed]  # each dropped once copied
    del streamed  # sources holds the only references, so that dropping one frees it
    for tensor_proto in proto.graph.initializer:
        index = stream_index(tensor_proto)
        if index is None:
            continue
        del tensor_proto.external_data[:]
        tensor_proto.ClearField("data_location")
        source = sources[index]
        if source is None:
            raise ValueError(f"stream placeholder {index} appears twice in the proto")
        tensor_proto.raw_data = source.tobytes()
        release(source)
        sources[index] = None
    return proto


def structure(model: ir.Model) -> onnx.ModelProto:
    """``model`` serialized without the bytes of its big main-graph initializers (their
    name, type and shape stay): equal for two models that differ at most in those bytes."""
    return serialize_with_placeholders(model)[0]
