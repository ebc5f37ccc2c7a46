"""The virtual environments of the JAX and Paddle exporters: interpreter and exact pins.

Standard library only (``make.py`` imports it from any interpreter). Every package the
export reads is pinned, not only the exporter: jax2onnx's output depends on onnx and
onnx-ir, and paddle2onnx folds constants with Polygraphy, which pip-installs
onnxruntime, onnx_graphsurgeon and sympy into the running environment when they are
missing (paddle2onnx sets ``POLYGRAPHY_AUTOINSTALL_DEPS=1``). Pinning them here keeps
an export from changing the venv, and the files from depending on the first run.
onnxruntime is also what the scripts compare each file with its source in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["EXPORTER_VENVS", "VENVS", "create_venv"]

VENVS = Path(__file__).resolve().parents[2] / "build" / "exporter-venvs"

#: Exporter (the folder under ``tests/data/exporters``) -> (the command that runs the
#: interpreter the venv is made from, the pip requirements installed in one call).
EXPORTER_VENVS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "jax2onnx": (
        # jax2onnx 0.17 needs Python >= 3.12; pyenv's 3.12.1 through its shim.
        ("env", "PYENV_VERSION=3.12.1", "python3.12"),
        (
            "jax==0.12.0.1",
            "jaxlib==0.12.0.1",
            "jax2onnx==0.17.1",
            "flax==0.12.12",
            "onnx==1.23.2",
            "onnx-ir==1.1.0",
            "onnxruntime==1.32.0",
            "numpy==2.5.5",
        ),
    ),
    "paddle2onnx": (
        ("python3.11",),
        (
            "paddlepaddle==3.3.1",
            "paddle2onnx==2.1.0",
            "packaging==26.4",  # imported by paddle2onnx, not declared
            "onnx==1.17.0",
            "polygraphy==0.53.6",
            "onnxruntime==1.32.0",
            "onnx_graphsurgeon==0.6.1",
            "sympy==1.14.0",
            "numpy==2.4.6",
        ),
    ),
}

_MARKER = "pins.txt"


def _pins(requirements: Sequence[str]) -> str:
    return "\n".join(requirements) + "\n"


def create_venv(exporter: str, *, reinstall: bool = False, root: Path = VENVS) -> Path:
    """The interpreter of ``root/<exporter>``, the venv made first when missing, made
    with other pins (its ``pins.txt``) or ``reinstall``.

    Raises:
        KeyError: ``exporter`` is not in :data:`EXPORTER_VENVS`.
        subprocess.CalledProcessError: venv creation or pip failed (the venv is removed,
            so the next call starts anew).
    """
    launcher, requirements = EXPORTER_VENVS[exporter]
    venv = root / exporter
    python = venv / "bin" / "python"
    marker = venv / _MARKER
    pins = _pins(requirements)
    if not reinstall and python.exists() and marker.exists() and marker.read_text() == pins:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        subprocess.run([*launcher, "-m", "venv", str(venv)], check=True, env=env)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *requirements], check=True, env=env
        )
    except subprocess.CalledProcessError:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    marker.write_text(pins)
    return python
