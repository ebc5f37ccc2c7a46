"""OpenVINO in this process, without leaving the main thread's signal stack dangling.

OpenVINO 2026.4's CPU plugin gives the thread that compiles a model a new alternate signal
stack (``sigaltstack``) and, when the compiled model is destroyed, puts back the stack it
found. Destroyed in another order than created (two models alive at once), the thread is
left with a freed stack, and the next signal handled there (Ctrl-C, SIGTERM: CPython
installs its handlers with ``SA_ONSTACK``) is a segmentation fault. :func:`compile_model`
puts back the thread's own stack as soon as the model is compiled, so that every compiled
model later restores that same stack, whatever the order.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

__all__ = ["compile_model"]


class _StackT(ctypes.Structure):
    """``stack_t`` of Linux and the BSDs: base, flags, size."""

    _fields_ = [
        ("ss_sp", ctypes.c_void_p),
        ("ss_flags", ctypes.c_int),
        ("ss_size", ctypes.c_size_t),
    ]


def _sigaltstack() -> Any | None:
    """libc's ``sigaltstack``, or None where there is none to call."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = libc.sigaltstack
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.POINTER(_StackT), ctypes.POINTER(_StackT)]
    function.restype = ctypes.c_int
    return function


def compile_model(model: bytes | str, config: dict[str, object], core: Any = None) -> Any:
    """``core.compile_model`` (a new ``ov.Core()`` by default) of a serialized model or a
    path, on the CPU; the calling thread keeps the signal stack it had."""
    if core is None:
        import openvino as ov

        core = ov.Core()
    read = core.read_model(model, b"") if isinstance(model, bytes) else core.read_model(model)
    sigaltstack = _sigaltstack()
    before = _StackT()
    if sigaltstack is None or sigaltstack(None, ctypes.byref(before)) != 0:
        return core.compile_model(read, "CPU", config)
    try:
        return core.compile_model(read, "CPU", config)
    finally:
        sigaltstack(ctypes.byref(before), None)
