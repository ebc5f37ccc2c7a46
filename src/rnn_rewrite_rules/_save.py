"""Write a model file safely: external data, models over 2 GB, atomic replacement.

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

An embedded model is written by :func:`save_embedded`, which writes the protobuf
``ir.save`` writes, streaming the big main-graph initializers one at a time into the
file instead of serializing a second copy of every tensor (plus the bytes of that copy).
"""

from __future__ import annotations

import contextlib
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

import onnx_ir as ir

from rnn_rewrite_rules._ir import NUMPY_DTYPES
from rnn_rewrite_rules._load import LoadedModel, file_kind, referenced_data_files
from rnn_rewrite_rules._protobuf import (
    GRAPH_INITIALIZER,
    MODEL_GRAPH,
    TENSOR_RAW_DATA,
    encode_varint,
    length_delimited_size,
    tag,
)
from rnn_rewrite_rules._serialize import release, serialize_with_placeholders, stream_index
from rnn_rewrite_rules.errors import OutputNotWritable, SameAsInput

__all__ = [
    "EMBED_LIMIT_BYTES",
    "Staging",
    "check_output_path",
    "output_staging",
    "progress_callback",
    "save_embedded",
    "save_model",
    "signals_deferred",
    "tensor_bytes",
]

#: Above this many tensor bytes a model is saved with external data (protobuf stops at 2 GiB).
EMBED_LIMIT_BYTES = 1_800_000_000

#: Tensors at least this large go to the external data file when one is used.
EXTERNAL_THRESHOLD_BYTES = 1024

#: Text formats ``ir.save`` infers from the suffix: never streamed as protobuf.
_TEXT_SUFFIXES = frozenset({".textproto", ".prototxt", ".txtpb", ".json", ".onnxtxt"})


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
            f"{given}: is {file_kind(mode)}; give a regular file name for the output"
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

    @property
    def directory(self) -> Path:
        """The staging directory (removed with everything in it when closed)."""
        return self._dir

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
        name = self._choose_data_name() if external_data else None
        try:
            self._data_name = save_model(model, self.model_path, name, on_tensor)
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
        old_data = referenced_data_files(self.target) if self.target.is_file() else frozenset()
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


def save_model(
    model: ir.Model,
    path: Path,
    data_name: str | None,
    on_tensor: Callable[[int, int], None] | None = None,
) -> str | None:
    """Write ``model`` to ``path``: with ``data_name``, its tensors of at least
    :data:`EXTERNAL_THRESHOLD_BYTES` to that file next to it; else one file, streamed.

    Returns the data file's name, or None when there is none (every tensor was small).

    Raises:
        OSError: the write failed.
    """
    if data_name is None:
        save_embedded(model, path, on_tensor)  # never a second copy of every tensor
        return None
    ir.save(
        model,
        path,
        external_data=data_name,
        size_threshold_bytes=EXTERNAL_THRESHOLD_BYTES,
        callback=progress_callback(on_tensor),
    )
    data = path.parent / data_name
    if data.exists() and data.stat().st_size == 0:  # every tensor was small
        data.unlink()
        return None
    return data_name


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
    proto, sources = serialize_with_placeholders(model)
    entries: list[bytes | tuple[bytes, ir.TensorProtocol]] = []
    for tensor_proto in proto.graph.initializer:
        index = stream_index(tensor_proto)
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
        return len(header) + len(tag(TENSOR_RAW_DATA)) + length_delimited_size(tensor.nbytes)

    def field_length(entry) -> int:
        return len(tag(GRAPH_INITIALIZER)) + length_delimited_size(message_length(entry))

    total = len(sources)
    graph_length = len(graph_rest) + sum(field_length(e) for e in entries)
    written = 0
    with open(path, "wb") as file:
        file.write(model_rest)
        file.write(tag(MODEL_GRAPH) + encode_varint(graph_length))
        file.write(graph_rest)
        for entry in entries:
            file.write(tag(GRAPH_INITIALIZER))
            file.write(encode_varint(message_length(entry)))
            if isinstance(entry, bytes):
                file.write(entry)
                continue
            header, tensor = entry
            file.write(header)
            file.write(tag(TENSOR_RAW_DATA))
            file.write(encode_varint(tensor.nbytes))
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


def _write_bytes(file, tensor: ir.TensorProtocol) -> None:
    """The tensor's ONNX raw bytes, without a copy when numpy's layout already is that."""
    if tensor.dtype not in NUMPY_DTYPES:
        file.write(tensor.tobytes())
        return
    array = tensor.numpy()
    if array.dtype.byteorder == ">" or not array.flags.c_contiguous:
        file.write(tensor.tobytes())
    else:
        file.write(array.reshape(-1).data.cast("B"))
    del array  # before the mapping, if any, is released
