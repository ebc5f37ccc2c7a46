"""Does rten (the Rust runtime) take a model? ``rten-convert`` answers, without the runtime.

rten has ``LSTM`` and ``GRU`` but no ``RNN`` operator (rten PR #74); its converter
(PyPI ``rten-convert``, pure Python, pinned in the ``test`` extra) names each operator it
cannot convert (``Unsupported operator "RNN"``) and each attribute it does not support
(activations other than the defaults, ``clip``, ``layout=1``, ...). The runtime itself is a
Rust crate, not reachable from Python: a model that converts is one rten can load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import io
import os
import re
import sys
import tempfile

import onnx

__all__ = ["RtenConversion", "convert", "version"]


@dataclasses.dataclass
class RtenConversion:
    """The converter's verdict on one model."""

    ok: bool
    #: one line per failure, as the converter printed it
    errors: list[str]
    #: operator types it has no conversion for
    unsupported: set[str]

    @property
    def summary(self) -> str:
        if self.ok:
            return "converts"
        if self.unsupported:
            return "unsupported: " + ", ".join(sorted(self.unsupported))
        return self.errors[0] if self.errors else "fails"


def version() -> str | None:
    """The installed ``rten-convert`` version, or None."""
    try:
        return importlib.metadata.version("rten-convert")
    except importlib.metadata.PackageNotFoundError:
        return None


def convert(model: onnx.ModelProto) -> RtenConversion:
    """Run ``rten-convert`` (its command's own code, in this process) on ``model``.

    Raises:
        ImportError: rten-convert is not installed.
    """
    from rten_convert.converter import main

    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "model.onnx")
        onnx.save(model, source)
        stderr = io.StringIO()
        argv = sys.argv
        sys.argv = ["rten-convert", source, os.path.join(tmp, "model.rten")]
        failure = ""
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                main()
        except SystemExit as error:
            failure = "" if error.code in (0, None) else f"exit {error.code}"
        except Exception as error:  # the converter's ConversionError and whatever it hits
            failure = f"{type(error).__name__}: {error}"
        finally:
            sys.argv = argv
    lines = [line.strip() for line in stderr.getvalue().splitlines() if "Error" in line]
    unsupported = set(re.findall(r'Unsupported operator "([^"]+)"', stderr.getvalue()))
    errors = lines + ([failure] if failure else [])
    return RtenConversion(ok=not failure, errors=errors, unsupported=unsupported)
