"""Load a model file, checking it thoroughly, its big tensors left on disk.

:func:`load_model` classifies every way a file can be unusable (missing, a directory, not
ONNX, truncated or damaged, unsupported opset, external data missing or short, refused by
the ONNX checker) as a distinct :class:`~rnn_rewrite_rules.errors.ModelIOError`.

A model stored in one ``.onnx`` file of at least :data:`LAZY_MIN_BYTES` keeps its tensors'
bytes (``raw_data``) in that file: the file is scanned at the protobuf wire level, and a
copy of everything but those bytes is parsed, in which each big main-graph initializer
points at its bytes as *external data of the model file itself* (location, offset,
length). onnx-ir then maps them lazily (``ir.ExternalTensor``), so only what is read
becomes resident, and ``_serialize.release`` drops it again. The scan touches only the
fields it rewrites and gives up (``None``) on anything unusual, so the caller falls back
to the plain parse with its own error reporting.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from rnn_rewrite_rules._protobuf import (
    GRAPH_INITIALIZER,
    LEN,
    MODEL_FIELD_WIRE_TYPES,
    MODEL_GRAPH,
    TENSOR_DATA_LOCATION,
    TENSOR_EXTERNAL_DATA,
    TENSOR_RAW_DATA,
    TENSOR_SEGMENT,
    WireError,
    encode_varint,
    fields,
    length_delimited,
    read_varint,
    tag,
)
from rnn_rewrite_rules._serialize import STREAM_MIN_BYTES
from rnn_rewrite_rules.errors import (
    DamagedModel,
    InvalidModel,
    ModelIsDirectory,
    ModelNotFound,
    NotOnnx,
    UnsupportedModel,
)

__all__ = [
    "LAZY_MIN_BYTES",
    "MIN_OPSET",
    "LoadedModel",
    "check_model_file",
    "external_files",
    "file_kind",
    "lazy_model_proto",
    "load_model",
    "referenced_data_files",
]

#: Files smaller than this are parsed whole (the plain path, which reports every defect).
LAZY_MIN_BYTES = 16 * 1024 * 1024

MIN_OPSET = 7


@dataclasses.dataclass
class LoadedModel:
    model: ir.Model
    path: Path
    #: Whether any tensor of the file lives in an external data file.
    external_data: bool
    #: External data files the model references, relative to its directory.
    data_files: frozenset[str]


def _parse_failure_kind(data: bytes) -> str:
    """Why ``data`` failed to parse: "truncated", "damaged" (inside a field) or "garbage"."""
    pos = fields = 0
    end = len(data)
    while pos < end:
        try:
            tag, pos = read_varint(data, pos, end)
            wire = tag & 7
            if MODEL_FIELD_WIRE_TYPES.get(tag >> 3) != wire:
                return "garbage"
            value, pos = read_varint(data, pos, end)
        except WireError:
            return "truncated" if fields else "garbage"
        if wire == LEN:
            if pos + value > end:
                return "truncated" if fields else "garbage"
            pos += value
        fields += 1
    return "damaged"


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _graphs(attr.g)
            for sub in attr.graphs:
                yield from _graphs(sub)


def _tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    for graph in _graphs(proto.graph):
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors


def external_files(proto: onnx.ModelProto) -> dict[str, list[onnx.TensorProto]]:
    files: dict[str, list[onnx.TensorProto]] = {}
    for tensor in _tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            files.setdefault(info.get("location", ""), []).append(tensor)
    return files


def _check_external_data(path: Path, files: dict[str, list[onnx.TensorProto]]) -> None:
    for location, tensors in files.items():
        if not location or os.path.isabs(location) or ".." in Path(location).parts:
            raise DamagedModel(
                f"{path}: external data location {location!r} is not a relative path"
            )
        data_path = path.parent / location
        if not data_path.is_file():
            raise DamagedModel(f"{path}: external data file {str(data_path)!r} is missing")
        if not data_path.resolve().is_relative_to(path.parent.resolve()):
            raise InvalidModel(
                f"{path}: external data file {location!r} is a link to "
                f"{str(data_path.resolve())!r}, outside the model's folder, which onnx refuses "
                "to read: put the model and its data in one folder"
            )
        size = data_path.stat().st_size
        for tensor in tensors:
            info = {entry.key: entry.value for entry in tensor.external_data}
            offset = int(info.get("offset", 0) or 0)
            length = info.get("length")
            if length is None:
                try:
                    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
                except (KeyError, TypeError, ValueError):
                    continue
                numel = 1
                for dim in tensor.dims:
                    numel *= dim
                length = numel * itemsize
            if offset + int(length) > size:
                raise DamagedModel(
                    f"{path}: external data file {str(data_path)!r} is too short "
                    f"for tensor {tensor.name!r} (truncated?)"
                )


def _check_versions(path: Path, proto: onnx.ModelProto) -> None:
    if proto.ir_version > onnx.IR_VERSION:
        raise UnsupportedModel(
            f"{path}: IR version {proto.ir_version} is newer than this onnx {onnx.__version__} "
            f"supports ({onnx.IR_VERSION})"
        )
    newest = onnx.defs.onnx_opset_version()
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx"):
            if opset.version < MIN_OPSET:
                raise UnsupportedModel(
                    f"{path}: opset {opset.version} is not supported (need {MIN_OPSET} to {newest})"
                )
            if opset.version > newest:
                raise UnsupportedModel(
                    f"{path}: opset {opset.version} is newer than this onnx {onnx.__version__} "
                    f"knows ({newest}); upgrade onnx"
                )


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Read a model file, checking it thoroughly; external tensors stay on disk (mmap).

    Raises:
        ModelIOError: a subclass naming what is wrong with the file.
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ModelNotFound(f"{path}: no such file") from None
    except OSError as error:
        raise ModelNotFound(f"{path}: cannot read: {error.strerror or error}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ModelIsDirectory(f"{path}: is a directory, not an ONNX file")
    if not stat.S_ISREG(info.st_mode):
        raise NotOnnx(f"{path}: is {file_kind(info.st_mode)}, not an ONNX file")
    lazy = lazy_model_proto(path)  # big embedded tensors stay in the file, mapped
    if lazy is not None:
        return _model_from_proto(path, lazy, lazy=True)
    try:
        with open(path, "rb") as handle:  # a regular file: never blocks
            data = handle.read(info.st_size + 1)
    except OSError as error:
        raise ModelNotFound(f"{path}: cannot read: {error.strerror or error}") from None
    if not data:
        raise NotOnnx(f"{path}: is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        kind = _parse_failure_kind(data)
        if kind == "garbage":
            raise NotOnnx(f"{path}: is not an ONNX model (not an ONNX protobuf)") from None
        if kind == "truncated":
            raise DamagedModel(f"{path}: is truncated (the ONNX protobuf ends early)") from None
        raise DamagedModel(f"{path}: is a damaged ONNX model (a field does not parse)") from None
    del data
    return _model_from_proto(path, proto)


def _model_from_proto(path: Path, proto: onnx.ModelProto, *, lazy: bool = False) -> LoadedModel:
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise NotOnnx(f"{path}: is not an ONNX model (no IR version or graph)")
    if proto.ir_version >= 3 and not proto.opset_import:
        raise DamagedModel(f"{path}: has no opset_import (truncated?)")
    _check_versions(path, proto)
    files = external_files(proto)
    if lazy:  # the tensors lazy_model_proto left in the model file itself: not external data
        files.pop(path.name, None)
    _check_external_data(path, files)
    _check_onnx(path, proto)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as error:  # onnx_ir raises many kinds for malformed graphs
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DamagedModel(f"{path}: cannot be read: {message}") from None
    ir.external_data.set_base_dir(model.graph, str(path.parent.resolve()))
    return LoadedModel(model, path, bool(files), frozenset(files))


def referenced_data_files(path: Path) -> frozenset[str]:
    """External data files the ONNX file at ``path`` references (empty when unreadable)."""
    lazy = lazy_model_proto(path)  # not every embedded tensor in memory
    try:
        proto = lazy or onnx.load(str(path), load_external_data=False)
    except Exception:
        return frozenset()
    return frozenset(external_files(proto)) - ({path.name} if lazy else set())


def file_kind(mode: int) -> str:
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _external_entry(key: str, value: str) -> bytes:
    return length_delimited(
        TENSOR_EXTERNAL_DATA,
        length_delimited(1, key.encode()) + length_delimited(2, value.encode()),
    )


def _tensor(data, start: int, end: int, location: str) -> tuple[bytes, int]:
    """The TensorProto at ``data[start:end]``, its raw bytes replaced by a file reference."""
    raw = None
    kept = bytearray()
    for number, wire, field_start, payload, field_end in fields(data, start, end):
        if number in (
            TENSOR_DATA_LOCATION,
            TENSOR_EXTERNAL_DATA,
            TENSOR_SEGMENT,
        ):
            return bytes(data[start:end]), 0  # already external, or a segment: as it is
        if number == TENSOR_RAW_DATA and wire == LEN:
            if raw is not None:
                raise WireError
            raw = (payload, field_end - payload)
        else:
            kept += data[field_start:field_end]
    if raw is None or raw[1] < STREAM_MIN_BYTES:
        return bytes(data[start:end]), 0
    offset, length = raw
    kept += _external_entry("location", location)
    kept += _external_entry("offset", str(offset))
    kept += _external_entry("length", str(length))
    kept += tag(TENSOR_DATA_LOCATION, 0) + encode_varint(1)  # EXTERNAL
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
    except (OSError, ValueError, WireError):
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
    for number, wire, field_start, payload, field_end in fields(data, 0, size):
        if number != MODEL_GRAPH or wire != LEN:
            out += data[field_start:field_end]
            continue
        graphs += 1
        if graphs > 1:
            raise WireError  # merged graph fields: leave it to protobuf
        graph = bytearray()
        for g_number, g_wire, g_start, g_payload, g_end in fields(data, payload, field_end):
            if g_number == GRAPH_INITIALIZER and g_wire == LEN:
                tensor, moved = _tensor(data, g_payload, g_end, location)
                left += moved
                graph += length_delimited(GRAPH_INITIALIZER, tensor)
            else:
                graph += data[g_start:g_end]
        out += length_delimited(MODEL_GRAPH, bytes(graph))
    return bytes(out), left


def check_model_file(path: str | os.PathLike, proto: onnx.ModelProto | None = None) -> None:
    """``onnx.checker.check_model`` on the file at ``path`` (``proto``: what was read of it),
    by path, without reading its tensors' bytes or writing next to it.

    The checker parses the whole file it is given and resolves external data against the
    file's folder (an in-memory model against the working directory). So it runs on a copy
    of the protobuf in a temporary folder, the big embedded tensors turned into references
    to the file (:func:`lazy_model_proto`), beside an empty stand-in for each external data
    file named: the checker checks that each is a regular file in the model's folder and
    reads none (:func:`load_model` checks the real files, their presence and sizes). It runs
    so for a model of any size, in a read-only folder, and with data files that are
    symbolic links (which the checker refuses and runtimes follow).

    Raises:
        onnx.checker.ValidationError: as the checker does.
    """
    path = Path(path)
    if proto is None:
        proto = lazy_model_proto(path, min_bytes=0) or onnx.load(path, load_external_data=False)
    with tempfile.TemporaryDirectory(prefix="rnn-rewrite-check-") as scratch:
        copy = Path(scratch) / path.name
        copy.write_bytes(_declared_shapes(proto).SerializeToString())
        for location in external_files(proto):
            if location and not os.path.isabs(location) and ".." not in Path(location).parts:
                stand_in = Path(scratch) / location
                stand_in.parent.mkdir(parents=True, exist_ok=True)
                stand_in.touch(exist_ok=True)
        onnx.checker.check_model(str(copy))


def _declared_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto``, or a copy whose main-graph inputs and outputs declared without a shape
    declare one (of rank 0): the checker requires a shape there, the IR (``TypeProto``:
    only ``elem_type`` MUST be present) and the runtimes do not, and the checker checks
    nothing about it but its presence."""
    infos = [*proto.graph.input, *proto.graph.output]
    if all(
        not i.type.HasField("tensor_type") or i.type.tensor_type.HasField("shape") for i in infos
    ):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for info in [*copy.graph.input, *copy.graph.output]:
        if info.type.HasField("tensor_type") and not info.type.tensor_type.HasField("shape"):
            info.type.tensor_type.shape.SetInParent()
    return copy


def _check_onnx(path: Path, proto: onnx.ModelProto) -> None:
    """The ONNX checker on the input: a model it refuses is not a valid ONNX model (a
    runtime refuses it too, or runs it on borrowed assumptions)."""
    try:
        check_model_file(path, proto)
    except onnx.checker.ValidationError as error:
        message = " ".join(str(error).split())
        message = message if len(message) <= 300 else message[:297] + "..."
        raise InvalidModel(f"{path}: input is not a valid ONNX model: {message}") from None
