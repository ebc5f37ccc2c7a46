"""Load and save models on disk safely: external data, models over 2 GB, atomic replacement.

Loading classifies every way a file can be unusable (missing, a directory, not ONNX,
truncated or damaged, unsupported opset) as a distinct :class:`ModelIOError`.

Saving never leaves a partial file behind: the model (and its external data) is written
into a temporary directory next to the target, then moved into place with ``os.replace``.
A model that uses external data keeps using it; one whose tensors would overflow
protobuf's 2 GB limit switches to it. The external data file gets a name unique to the run
(``OUT.onnx.<run>.data``) and is moved into place before the model file that names it, so
no data file another model may reference is ever changed, and two concurrent writers never
pair one's model file with the other's data. Only data files this module wrote (that naming
scheme) are deleted, once the model file that referenced them has been replaced.

Outputs are resolved through symbolic links (the file a link points to is replaced, the
link stays); special files (devices, FIFOs) and files the input uses are refused. Signals
are deferred while files are moved into place, so an interrupt never leaves half a pair.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from rnn_rewrite_rules import _lazy_io

__all__ = [
    "DamagedModel",
    "LoadedModel",
    "ModelIOError",
    "ModelIsDirectory",
    "ModelNotFound",
    "NotOnnx",
    "OutputNotWritable",
    "SameAsInput",
    "Staging",
    "UnsupportedModel",
    "check_output_path",
    "load_model",
    "output_staging",
    "tensor_bytes",
]

#: Above this many tensor bytes a model is saved with external data (protobuf stops at 2 GiB).
EMBED_LIMIT_BYTES = 1_800_000_000
#: Tensors at least this large go to the external data file when one is used.
EXTERNAL_THRESHOLD_BYTES = 1024
MIN_OPSET = 7


class ModelIOError(Exception):
    """A model file that cannot be read or written; the message is one line for users."""


class ModelNotFound(ModelIOError):
    pass


class ModelIsDirectory(ModelIOError):
    pass


class NotOnnx(ModelIOError):
    pass


class DamagedModel(ModelIOError):
    pass


class UnsupportedModel(ModelIOError):
    pass


class OutputNotWritable(ModelIOError):
    pass


class SameAsInput(ModelIOError):
    pass


@dataclasses.dataclass
class LoadedModel:
    model: ir.Model
    path: Path
    #: Whether any tensor of the file lives in an external data file.
    external_data: bool
    #: External data files the model references, relative to its directory.
    data_files: frozenset[str]


# ModelProto field number -> protobuf wire type (0 varint, 2 length-delimited).
_MODEL_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}


def _varint(data: bytes, pos: int) -> tuple[int | None, int]:
    value = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            return None, pos
    return None, pos


def _parse_failure_kind(data: bytes) -> str:
    """Why ``data`` failed to parse: "truncated", "damaged" (inside a field) or "garbage"."""
    pos = fields = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        if tag is None:
            return "truncated" if fields else "garbage"
        wire = tag & 7
        if _MODEL_FIELDS.get(tag >> 3) != wire:
            return "garbage"
        value, pos = _varint(data, pos)
        if value is None:
            return "truncated" if fields else "garbage"
        if wire == 2:
            if pos + value > len(data):
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


def _external_files(proto: onnx.ModelProto) -> dict[str, list[onnx.TensorProto]]:
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
        raise NotOnnx(f"{path}: is {_kind(info.st_mode)}, not an ONNX file")
    lazy = _lazy_io.lazy_model_proto(path)  # big embedded tensors stay in the file, mapped
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
    files = _external_files(proto)
    if lazy:  # the tensors lazy_model_proto left in the model file itself: not external data
        files.pop(path.name, None)
    _check_external_data(path, files)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as error:  # onnx_ir raises many kinds for malformed graphs
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DamagedModel(f"{path}: cannot be read: {message}") from None
    ir.external_data.set_base_dir(model.graph, str(path.parent.resolve()))
    return LoadedModel(model, path, bool(files), frozenset(files))


def _referenced_data_files(path: Path) -> frozenset[str]:
    """External data files the ONNX file at ``path`` references (empty when unreadable)."""
    lazy = _lazy_io.lazy_model_proto(path)  # not every embedded tensor in memory
    try:
        proto = lazy or onnx.load(str(path), load_external_data=False)
    except Exception:
        return frozenset()
    return frozenset(_external_files(proto)) - ({path.name} if lazy else set())


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _data_paths(model_path: str | os.PathLike, files: frozenset[str]) -> set[str]:
    """The real paths of the external data files a model at ``model_path`` uses."""
    base = Path(os.path.realpath(model_path)).parent
    return {os.path.realpath(base / name) for name in files}


def check_output_path(
    output: str | os.PathLike,
    input_: str | os.PathLike | None,
    *,
    in_place: bool,
    input_files: frozenset[str] = frozenset(),
) -> Path:
    """Validate the target before any work is done; the path to replace (links resolved).

    Args:
        input_files: the input's external data files (relative to its directory).

    Raises:
        SameAsInput: ``output`` is ``input_`` and ``in_place`` is false, or it is a file
            the input uses.
        OutputNotWritable: the target is a directory or a special file, or its directory
            is missing.
    """
    given = Path(output)
    resolved = Path(os.path.realpath(given))  # write through symbolic links
    if input_ is not None:
        same = resolved == Path(os.path.realpath(input_))
        with contextlib.suppress(OSError):
            same = same or os.path.samefile(resolved, input_)
        if same and not in_place:
            raise SameAsInput(
                f"{given}: the output is the input; pass --in-place to replace the input"
            )
        if str(resolved) in _data_paths(input_, input_files):
            raise SameAsInput(
                f"{given}: is the input's external data file; give another output name"
            )
    try:
        mode = given.stat().st_mode  # through links: /dev/stdout is the pipe it names
    except OSError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputNotWritable(f"{given}: is a directory; give a file name for the output")
    if mode is not None and not stat.S_ISREG(mode):
        raise OutputNotWritable(
            f"{given}: is {_kind(mode)}; give a regular file name for the output"
        )
    parent = resolved.parent
    if not parent.is_dir():
        raise OutputNotWritable(f"{given}: output directory {str(parent)!r} does not exist")
    return resolved


def tensor_bytes(model: ir.Model) -> int:
    """Bytes of all initializers and Constant tensors, subgraphs included."""
    total = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            if value.const_value is not None:
                total += value.const_value.nbytes
        for node in graph:
            if node.op_type == "Constant" and node.domain == "":
                attr = node.attributes.get("value")
                if attr is not None and attr.type == ir.AttributeType.TENSOR:
                    total += attr.value.nbytes
    return total


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_DEFERRED_SIGNALS = {
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
}


@contextlib.contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """Record SIGINT, SIGTERM and SIGHUP during the block and raise them at its end.

    Yields the signals received so far. Python runs handlers in the main thread whichever
    thread the signal reached, so the handlers are swapped (main thread only; elsewhere
    signals are not deferred).
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {}
    for signum in _DEFERRED_SIGNALS:
        handler = signal.getsignal(signum)
        if handler is None or handler == signal.SIG_IGN:  # set outside Python, or ignored
            continue
        previous[signum] = signal.signal(signum, lambda number, _: received.append(number))
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)


def _write_error(target: Path, error: OSError) -> OutputNotWritable:
    """One line for a failed write; "No space left on device" also when numpy's short
    write (``65536 requested and 20480 written``) hides it."""
    reason = error.strerror or str(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT) or (
        error.errno is None and "requested and" in str(error)
    ):
        reason = os.strerror(errno.ENOSPC)
    return OutputNotWritable(f"{target}: cannot write: {reason}")


def _run_data_name(target: Path) -> str:
    return f"{target.name}.{secrets.token_hex(4)}.data"


def _ours(target: Path, name: str) -> bool:
    """Whether ``name`` is an external data file this module writes for ``target``."""
    return re.fullmatch(re.escape(target.name) + r"\.[0-9a-f]{8}\.data", name) is not None


class Staging:
    """A temporary directory next to ``target`` where the new model is written, then moved.

    Creating it probes that the target directory is writable. Use as a context manager:
    whatever was not committed is removed on exit (signals deferred while it is).

    Raises:
        OutputNotWritable: the directory cannot be written.
    """

    def __init__(
        self, target: str | os.PathLike, *, keep_away: frozenset[str] = frozenset()
    ) -> None:
        self.target = Path(target)
        #: External data names that must not be written or deleted (the input's).
        self._keep_away = keep_away
        try:
            self._dir = Path(
                tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent)
            )
        except OSError as error:
            raise OutputNotWritable(
                f"{self.target}: cannot write to {str(self.target.parent)!r}: "
                f"{error.strerror or error}"
            ) from None
        self.model_path = self._dir / self.target.name
        self._data_name: str | None = None

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        with signals_deferred():
            shutil.rmtree(self._dir, ignore_errors=True)

    def _choose_data_name(self) -> str:
        while True:
            name = _run_data_name(self.target)
            if name not in self._keep_away and not (self.target.parent / name).exists():
                return name

    def write(
        self,
        model: ir.Model,
        *,
        external_data: bool = False,
        on_tensor: Callable[[int, int], None] | None = None,
    ) -> None:
        """Write ``model`` into the staging directory.

        Without external data, external tensors of ``model`` are loaded into memory first.

        Args:
            external_data: keep tensors in a ``<target>.<run>.data`` file; forced on when
                the tensors would not fit in one protobuf.
            on_tensor: called with (tensors written, total) as big tensors are written.

        Raises:
            OutputNotWritable: the write failed (disk full, permissions).
        """
        external_data = external_data or tensor_bytes(model) > EMBED_LIMIT_BYTES
        try:
            if external_data:
                self._data_name = self._choose_data_name()
                ir.save(
                    model,
                    self.model_path,
                    external_data=self._data_name,
                    size_threshold_bytes=EXTERNAL_THRESHOLD_BYTES,
                    callback=_lazy_io.progress_callback(on_tensor),
                )
                data = self._dir / self._data_name
                if data.exists() and data.stat().st_size == 0:  # every tensor was small
                    data.unlink()
                    self._data_name = None
            else:
                self._data_name = None
                # streamed: never a second copy of every tensor in memory
                _lazy_io.save_embedded(model, self.model_path, on_tensor)
        except OSError as error:
            raise _write_error(self.target, error) from None

    def commit(self) -> None:
        """Move the staged files into place: the run's data file, then the model file in
        one atomic rename; then delete the data files of ours the old target used."""
        staged = [self._dir / self._data_name] if self._data_name else []
        staged.append(self.model_path)
        try:
            for path in staged:
                _fsync(path)
                if self.target.is_file():
                    shutil.copymode(self.target, path)
        except OSError as error:
            raise _write_error(self.target, error) from None
        with signals_deferred() as received:
            # an interrupt that came before the first rename: write nothing
            interrupted = bool(received)
            if not interrupted:
                self._move_into_place(staged)
        if interrupted:  # the deferred signal was delivered and its handler did not raise
            raise KeyboardInterrupt

    def _move_into_place(self, staged: list[Path]) -> None:
        old_data = _referenced_data_files(self.target) if self.target.is_file() else frozenset()
        moved: list[Path] = []
        try:
            for path in staged:
                destination = self.target.parent / path.name
                os.replace(path, destination)
                moved.append(destination)
        except OSError as error:
            for path in moved:  # the data file without its model file
                with contextlib.suppress(OSError):
                    path.unlink()
            raise _write_error(self.target, error) from None
        with contextlib.suppress(OSError):
            dir_fd = os.open(self.target.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        for name in old_data - self._keep_away - {self._data_name}:
            if _ours(self.target, name):
                with contextlib.suppress(OSError):
                    (self.target.parent / name).unlink()


def output_staging(target: str | os.PathLike, loaded: LoadedModel, *, in_place: bool) -> Staging:
    """The checked :class:`Staging` for writing the rewrite of ``loaded`` to ``target``.

    Raises:
        SameAsInput: ``target`` is the input (without ``in_place``) or a file it uses.
        OutputNotWritable: the target cannot be written.
    """
    resolved = check_output_path(
        target, loaded.path, in_place=in_place, input_files=loaded.data_files
    )
    # the input's external data survives unless the input itself is replaced; even then
    # only data files this module wrote are deleted (see Staging.commit)
    same_dir = resolved.parent == Path(os.path.realpath(loaded.path)).parent
    keep = loaded.data_files if same_dir and not in_place else frozenset()
    return Staging(resolved, keep_away=keep)
