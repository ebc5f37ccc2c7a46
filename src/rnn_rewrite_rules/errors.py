"""Every error the package raises to its callers; the command maps each to an exit code.

Only the standard library is imported here (the command imports this module at start-up).
Each message is one line that says what is wrong and what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "BadOptions",
    "CannotVerify",
    "DamagedModel",
    "InvalidModel",
    "InvalidResult",
    "ModelIOError",
    "ModelIsDirectory",
    "ModelNotFound",
    "NoRecurrence",
    "NotOnnx",
    "OnnxRuntimeMissing",
    "OutputNotWritable",
    "ReportedError",
    "SameAsInput",
    "SlowerResult",
    "UnknownRule",
    "UnsupportedInput",
    "UnsupportedModel",
    "UnsupportedVersionError",
    "VerifyFailed",
]


# ------------------------------------------------------------------------- options, names


class BadOptions(ValueError):
    """Options that contradict each other or the model (a usage error)."""


class UnknownRule(KeyError):
    """A rule or family name that does not exist; the message names the valid ones."""

    def __init__(self, name: str, families: Sequence[str] = ()) -> None:
        super().__init__(name)
        self.name = name
        #: The families there are, for the message.
        self.families = tuple(families)

    def __str__(self) -> str:
        return (
            f"unknown rule or family {self.name!r} (families: {', '.join(self.families)}; "
            "rules: see rnn-rewrite --list-rules)"
        )


class UnsupportedVersionError(RuntimeError):
    """The installed onnxscript is outside the tested range."""


# --------------------------------------------------------------------------- model files


class ModelIOError(Exception):
    """A model file that cannot be read or written; the message is one line for users."""


class ModelNotFound(ModelIOError):
    """The input does not exist or cannot be read."""


class ModelIsDirectory(ModelIOError):
    """The input is a directory."""


class NotOnnx(ModelIOError):
    """The input is not an ONNX model (empty, another format, a special file)."""


class InvalidModel(NotOnnx):
    """The input fails the ONNX checker (graph outputs no node produces, say)."""


class DamagedModel(ModelIOError):
    """The input is truncated or damaged, its external data included."""


class UnsupportedModel(ModelIOError):
    """The input's IR version or opset is outside what this onnx supports."""


class OutputNotWritable(ModelIOError):
    """The output cannot be written (a directory, a special file, no space, no directory)."""


class SameAsInput(ModelIOError):
    """The output is the input (without in-place) or a file the input uses."""


# ------------------------------------------------------------------ verifying the result


class OnnxRuntimeMissing(Exception):
    """onnxruntime is not installed."""


class UnsupportedInput(Exception):
    """An input's element type cannot be generated."""


class CannotVerify(Exception):
    """The comparison cannot be made (the original model does not run, an input has no rank)."""


class ReportedError(Exception):
    """An error found once the run had something to report: ``report`` is the
    :class:`rnn_rewrite_rules.Report` of the run (the command prints it before the error)."""

    def __init__(self, message: str, report: Any) -> None:
        super().__init__(message)
        self.report = report


class VerifyFailed(ReportedError):
    """The outputs differ beyond the tolerance; ``report`` says how (nothing was written)."""


class InvalidResult(Exception):
    """The rewritten model fails the ONNX checker (and the input passes it)."""


class NoRecurrence(ReportedError):
    """The model has no RNN, LSTM or GRU node and no rule fired (nothing was written);
    ``report`` says what was looked at."""


class SlowerResult(ReportedError):
    """``--benchmark`` measured the result slower than the original beyond noise
    (nothing was written; ``keep_slower`` writes it anyway); ``report`` has the numbers."""
