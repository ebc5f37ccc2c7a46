"""Load and save big embedded models without holding their tensors in memory twice.

Loading: the tensors' bytes (``raw_data``) of a model stored in one ``.onnx`` file are
left in that file. The file is scanned at the protobuf wire level, and a copy of
everything but those bytes is parsed, in which each big main-graph initializer points at
its bytes as *external data of the model file itself* (location, offset, length). onnx-ir
then maps them lazily (``ir.ExternalTensor``), so only what is read becomes resident,
and :func:`release` drops it again.

Saving: :func:`save_embedded` writes the same protobuf ``ir.save`` writes, streaming the
big main-graph initializers one at a time into the file instead of serializing a second
copy of every tensor (plus the bytes of that copy) first.

Both work at the wire level only on the fields they touch (``ModelProto.graph``,
``GraphProto.initializer``, ``TensorProto.raw_data``) and give up (``None``) on anything
unusual, so the caller falls back to the plain path with its own error reporting.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx
import onnx_ir as ir

from rnn_rewrite_rules._ir import NUMPY_DTYPES

__all__ = [
    "LAZY_MIN_BYTES",
    "STREAM_MIN_BYTES",
    "check_model_file",
    "lazy_model_proto",
    "progress_callback",
    "release",
    "save_embedded",
]

#: Tensors with at least this many bytes are left in the file (loading) or streamed (saving).
STREAM_MIN_BYTES = 1024
#: Files smaller than this are parsed whole (the plain path, which reports every defect).
LAZY_MIN_BYTES = 16 * 1024 * 1024

_LEN = 2
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_TENSOR_SEGMENT, _TENSOR_RAW_DATA, _TENSOR_EXTERNAL, _TENSOR_LOCATION = 3, 9, 13, 14
#: Text formats ``ir.save`` infers from the suffix: never streamed as protobuf.
_TEXT_SUFFIXES = frozenset({".textproto", ".prototxt", ".txtpb", ".json", ".onnxtxt"})


class _Unusual(Exception):
    """The file is not the plain protobuf this module rewrites: use the plain path."""


def _varint(data, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unusual
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(data, start: int, end: int):
    """``(field number, wire type, field start, payload start, payload end)`` of a message."""
    pos = start
    while pos < end:
        field_start = pos
        tag, pos = _varint(data, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise _Unusual
        if wire == 0:
            _, pos = _varint(data, pos, end)
            yield number, wire, field_start, pos, pos
            continue
        if wire == 1:
            payload, pos = pos, pos + 8
        elif wire == 5:
            payload, pos = pos, pos + 4
        elif wire == _LEN:
            length, payload = _varint(data, pos, end)
            pos = payload + length
        else:  # groups: never in ONNX
            raise _Unusual
        if pos > end:
            raise _Unusual
        yield number, wire, field_start, payload, pos


def _field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(payload)) + payload


def _external_entry(key: str, value: str) -> bytes:
    return _field(_TENSOR_EXTERNAL, _field(1, key.encode()) + _field(2, value.encode()))


def _tensor(data, start: int, end: int, location: str) -> tuple[bytes, int]:
    """The TensorProto at ``data[start:end]``, its raw bytes replaced by a file reference."""
    raw = None
    kept = bytearray()
    for number, wire, field_start, payload, field_end in _fields(data, start, end):
        if number in (_TENSOR_LOCATION, _TENSOR_EXTERNAL, _TENSOR_SEGMENT):
            return bytes(data[start:end]), 0  # already external, or a segment: as it is
        if number == _TENSOR_RAW_DATA and wire == _LEN:
            if raw is not None:
                raise _Unusual
            raw = (payload, field_end - payload)
        else:
            kept += data[field_start:field_end]
    if raw is None or raw[1] < STREAM_MIN_BYTES:
        return bytes(data[start:end]), 0
    offset, length = raw
    kept += _external_entry("location", location)
    kept += _external_entry("offset", str(offset))
    kept += _external_entry("length", str(length))
    kept += _encode_varint(_TENSOR_LOCATION << 3) + _encode_varint(1)  # EXTERNAL
    return bytes(kept), length


def lazy_model_proto(
    path: str | os.PathLike, min_bytes: int | None = None
) -> onnx.ModelProto | None:
    """The model at ``path`` with its big initializers' bytes left in the file, or None.

    None when the file is small, has no embedded initializer worth leaving, or is not
    a plain protobuf this scanner follows (the caller then parses it whole).
    """
    path = Path(path)
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size < (LAZY_MIN_BYTES if min_bytes is None else min_bytes):
                return None
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                skeleton, left = _skeleton(data, size, path.name)
    except (OSError, ValueError, _Unusual):
        return None
    if not left:
        return None
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(skeleton)
    except Exception:  # protobuf raises DecodeError and others
        return None
    return proto


def _skeleton(data, size: int, location: str) -> tuple[bytes, int]:
    out = bytearray()
    left = 0
    graphs = 0
    for number, wire, field_start, payload, field_end in _fields(data, 0, size):
        if number != _MODEL_GRAPH or wire != _LEN:
            out += data[field_start:field_end]
            continue
        graphs += 1
        if graphs > 1:
            raise _Unusual  # merged graph fields: leave it to protobuf
        graph = bytearray()
        for g_number, g_wire, g_start, g_payload, g_end in _fields(data, payload, field_end):
            if g_number == _GRAPH_INITIALIZER and g_wire == _LEN:
                tensor, moved = _tensor(data, g_payload, g_end, location)
                left += moved
                graph += _field(_GRAPH_INITIALIZER, tensor)
            else:
                graph += data[g_start:g_end]
        out += _field(_MODEL_GRAPH, bytes(graph))
    return bytes(out), left


def check_model_file(path: str | os.PathLike) -> None:
    """``onnx.checker.check_model`` on the file at ``path``, its big tensors left on disk.

    The checker parses the whole file into memory (twice the tensors, at its peak). Here
    the file is scanned (every field but the tensors' bytes, which the checker does not
    read either) and the checker runs on what :func:`lazy_model_proto` makes of it,
    written next to the file so that its references to the file resolve.

    Raises:
        onnx.checker.ValidationError: as the checker does.
    """
    path = Path(path)
    proto = lazy_model_proto(path, min_bytes=0)
    if proto is None:
        onnx.checker.check_model(str(path))
        return
    descriptor, skeleton = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(proto.SerializeToString())
        del proto
        onnx.checker.check_model(skeleton)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(skeleton)


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


def _serialize_placeholders(
    model: ir.Model, *, restore: bool = True
) -> tuple[onnx.ModelProto, list[ir.TensorProtocol]]:
    """``model`` serialized with each big initializer of the main graph an external
    placeholder at location ``"\0stream/<index>"``, and those tensors by index.
    ``restore=False`` leaves the placeholders in ``model`` (which then no longer holds the
    tensors)."""
    streamed = [v for v in model.graph.initializers.values() if _streamable(v.const_value)]
    sources = [v.const_value for v in streamed]
    try:
        for index, (value, tensor) in enumerate(zip(streamed, sources, strict=True)):
            assert tensor is not None
            value.const_value = ir.ExternalTensor(
                f"\0stream/{index}",
                0,
                tensor.nbytes,
                tensor.dtype,
                shape=tensor.shape,
                name=value.name or "",
                doc_string=tensor.doc_string,
                metadata_props=dict(tensor.metadata_props),
            )
        proto = ir.serde.serialize_model(model)
    finally:
        if restore:
            for value, tensor in zip(streamed, sources, strict=True):
                value.const_value = tensor
    return proto, sources  # type: ignore[return-value]


def _stream_index(tensor_proto: onnx.TensorProto) -> int | None:
    location = next((e.value for e in tensor_proto.external_data if e.key == "location"), "")
    return int(location.split("/")[1]) if location.startswith("\0stream/") else None


def serialize_releasing(model: ir.Model) -> onnx.ModelProto:
    """``ir.serde.serialize_model(model)``, but each big initializer of the main graph is
    dropped from ``model`` once copied into the proto, so that the two hold one copy of
    the weights between them, not two. ``model`` is not usable afterwards."""
    proto, sources = _serialize_placeholders(model, restore=False)
    for tensor_proto in proto.graph.initializer:
        index = _stream_index(tensor_proto)
        if index is None:
            continue
        del tensor_proto.external_data[:]
        tensor_proto.ClearField("data_location")
        tensor_proto.raw_data = sources[index].tobytes()
        release(sources[index])
        sources[index] = None  # type: ignore[call-overload]
    return proto


def structure(model: ir.Model) -> onnx.ModelProto:
    """``model`` serialized without the bytes of its big main-graph initializers (their
    name, type and shape stay): equal for two models that differ at most in those bytes."""
    return _serialize_placeholders(model)[0]


def save_embedded(
    model: ir.Model,
    path: str | os.PathLike,
    on_tensor: Callable[[int, int], None] | None = None,
) -> None:
    """Write ``model`` as one ``.onnx`` file, the big initializers streamed one at a time.

    The file holds the same ``ModelProto`` ``ir.save(model, path)`` writes (the main
    graph's initializers are encoded after its other fields). External tensors read for
    it are unmapped once written. ``on_tensor(tensors written, total)`` reports progress.

    Raises:
        OSError: the write failed.
    """
    path = Path(path)
    if path.suffix.lower() in _TEXT_SUFFIXES:
        ir.external_data.load_to_model(model)
        ir.save(model, path)
        return
    proto, sources = _serialize_placeholders(model)
    entries: list[bytes | tuple[bytes, ir.TensorProtocol]] = []
    for tensor_proto in proto.graph.initializer:
        index = _stream_index(tensor_proto)
        if index is None:
            entries.append(tensor_proto.SerializeToString())
            continue
        source = sources[index]
        del tensor_proto.external_data[:]
        tensor_proto.ClearField("data_location")
        entries.append((tensor_proto.SerializeToString(), source))
    proto.graph.ClearField("initializer")
    graph_rest = proto.graph.SerializeToString()
    proto.ClearField("graph")
    model_rest = proto.SerializeToString()
    del proto

    def message_length(entry) -> int:
        if isinstance(entry, bytes):
            return len(entry)
        header, tensor = entry
        return (
            len(header) + len(_encode_varint(_TENSOR_RAW_DATA << 3 | _LEN)) + _len_of(tensor.nbytes)
        )

    def field_length(entry) -> int:
        return len(_encode_varint(_GRAPH_INITIALIZER << 3 | _LEN)) + _len_of(message_length(entry))

    total = len(sources)
    graph_length = len(graph_rest) + sum(field_length(e) for e in entries)
    written = 0
    with open(path, "wb") as file:
        file.write(model_rest)
        file.write(_encode_varint(_MODEL_GRAPH << 3 | _LEN) + _encode_varint(graph_length))
        file.write(graph_rest)
        for entry in entries:
            file.write(_encode_varint(_GRAPH_INITIALIZER << 3 | _LEN))
            file.write(_encode_varint(message_length(entry)))
            if isinstance(entry, bytes):
                file.write(entry)
                continue
            header, tensor = entry
            file.write(header)
            file.write(_encode_varint(_TENSOR_RAW_DATA << 3 | _LEN))
            file.write(_encode_varint(tensor.nbytes))
            _write_bytes(file, tensor)
            release(tensor)
            written += 1
            if on_tensor is not None:
                on_tensor(written, total)


def progress_callback(on_tensor: Callable[[int, int], None] | None):
    """``on_tensor(tensors written, total)`` as the ``callback`` ``ir.save`` takes (or None)."""
    if on_tensor is None:
        return None
    written = [0]

    def callback(tensor: ir.TensorProtocol, info: ir.external_data.CallbackInfo) -> None:
        written[0] += 1
        on_tensor(written[0], info.total)

    return callback


def _len_of(length: int) -> int:
    """Bytes of a length-delimited payload of ``length`` bytes, its length prefix included."""
    return len(_encode_varint(length)) + length


def _write_bytes(file, tensor: ir.TensorProtocol) -> None:
    """The tensor's ONNX raw bytes, without a copy when numpy's layout already is that."""
    if tensor.dtype not in NUMPY_DTYPES:
        file.write(tensor.tobytes())
        return
    array = tensor.numpy()
    if array.dtype.byteorder == ">" or not array.flags.c_contiguous:
        file.write(tensor.tobytes())
    else:
        file.write(memoryview(array.reshape(-1)).cast("B"))
    del array  # before the mapping, if any, is released
