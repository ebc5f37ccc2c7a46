"""onnxscript rewriter rules that make exported ONNX LSTM/GRU/RNN graphs fast and portable.

Three ways in:

* ``onnxscript.rewriter.rewrite(model, pattern_rewrite_rules=rnn_rewrite_rules.rules())``
  or :func:`rnn_rewrite_rules.rewrite` (which also iterates and cleans up);
* :func:`install` before ``torch.onnx.export(..., dynamo=True)`` or
  ``onnxscript.optimizer.optimize()``;
* :func:`rewrite_file` for models on disk, or the ``rnn-rewrite`` command built on it.

Errors (each names what to do; all in :mod:`rnn_rewrite_rules.errors`): :class:`UnknownRule`
(a ``KeyError``) and :class:`BadOptions` (a ``ValueError``) for names and options;
:class:`ModelIOError` (its subclasses say which) for a file that cannot be read or
written; :class:`OnnxRuntimeMissing`, :class:`CannotVerify` and :class:`VerifyFailed`
(its ``report`` says how the outputs differ) for ``verify=True``; :class:`InvalidResult`
when the result fails the ONNX checker; :class:`NoRecurrence` when the model has nothing
the rules rewrite; :class:`SlowerResult` when ``benchmark=True`` measured the result
slower. :func:`rewrite_file` writes nothing when it raises.

The names are imported on first use, so that the command starts (and handles Ctrl-C)
before onnx and onnxscript are loaded.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

__version__ = "0.2.0"

#: Exported name -> the module that defines it.
_EXPORTS = {
    "BadOptions": "errors",
    "CannotVerify": "errors",
    "InvalidResult": "errors",
    "ModelIOError": "errors",
    "NoRecurrence": "errors",
    "OnnxRuntimeMissing": "errors",
    "Report": "_report",
    "RewriteOptions": "_rewrite_file",
    "SlowerResult": "errors",
    "UnknownRule": "errors",
    "VerifyFailed": "errors",
    "install": "_install",
    "installed": "_install",
    "is_installed": "_install",
    "rewrite": "_api",
    "rewrite_file": "_rewrite_file",
    "rules": "_api",
    "uninstall": "_install",
}

__all__ = [
    "BadOptions",
    "CannotVerify",
    "InvalidResult",
    "ModelIOError",
    "NoRecurrence",
    "OnnxRuntimeMissing",
    "Report",
    "RewriteOptions",
    "SlowerResult",
    "UnknownRule",
    "VerifyFailed",
    "__version__",
    "install",
    "installed",
    "is_installed",
    "rewrite",
    "rewrite_file",
    "rules",
    "uninstall",
]

if TYPE_CHECKING:
    from rnn_rewrite_rules._api import rewrite, rules
    from rnn_rewrite_rules._install import install, installed, is_installed, uninstall
    from rnn_rewrite_rules._report import Report
    from rnn_rewrite_rules._rewrite_file import RewriteOptions, rewrite_file
    from rnn_rewrite_rules.errors import (
        BadOptions,
        CannotVerify,
        InvalidResult,
        ModelIOError,
        NoRecurrence,
        OnnxRuntimeMissing,
        SlowerResult,
        UnknownRule,
        VerifyFailed,
    )


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Package(types.ModuleType):
    """The subpackage ``rules`` must not replace the function ``rules`` once imported."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
