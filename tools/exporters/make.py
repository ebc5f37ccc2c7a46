"""Export the models of one exporter with its pinned versions, in a virtual environment of its own.

    python -m tools.exporters.make EXPORTER [--only NAME ...] [--reinstall]

creates (or reuses) ``build/exporter-venvs/<venv>`` (git-ignored) with :data:`EXPORTERS`'
pins and runs ``tools/exporters/<script>.py --exporter EXPORTER --out
tests/data/exporters/EXPORTER`` in it, from the repository root. The script writes the
``.onnx`` files and the manifest (:mod:`tools.exporters.manifest`); with ``--only`` it
exports those models and keeps the manifest's other entries.

A venv is reused while the pins it was made with (``pins.txt`` in it) are the table's; a
changed pin or ``--reinstall`` makes it anew. pip only: the torch CPU wheel lies on local
disk, which uv and poetry do not see, and a torch range would pull a CUDA build.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / "build" / "exporter-venvs"
DATA = ROOT / "tests" / "data" / "exporters"


@dataclasses.dataclass(frozen=True)
class Exporter:
    #: The folder under ``build/exporter-venvs`` (torch's two exporters share one).
    venv: str
    #: ``tools/exporters/<script>.py``.
    script: str
    #: Exact pins, installed with pip in one call (onnxruntime: the scripts check each file
    #: against its source, :mod:`tools.exporters.checks`).
    requirements: tuple[str, ...]
    #: The interpreter the venv is made with, and its environment.
    python: str = "python3.11"
    python_env: tuple[tuple[str, str], ...] = ()


_TORCH = Exporter(
    venv="torch",
    script="torch_models",
    requirements=("torch==2.13.0", "onnxscript==0.7.2", "onnx==1.23.2", "onnxruntime==1.32.0"),
)

#: Exporter name (the folder under ``tests/data/exporters``) -> how it is installed and run.
EXPORTERS: dict[str, Exporter] = {
    "tf2onnx": Exporter(
        venv="tf2onnx",
        script="tf2onnx_models",
        requirements=(
            "tensorflow-cpu==2.21.0",
            "tf2onnx==1.17.0",
            "keras==3.15.1",
            "onnx==1.23.2",
            "onnxruntime==1.32.0",
        ),
    ),
    "tf2onnx_keras2": Exporter(
        venv="tf2onnx_keras2",
        script="tf2onnx_models",
        requirements=(
            "tensorflow-cpu==2.21.0",
            "tf2onnx==1.17.0",
            "tf-keras==2.21.0",
            "onnx==1.23.2",
            "onnxruntime==1.32.0",
        ),
    ),
    "torch_dynamo": _TORCH,
    "torch_script": _TORCH,
    "jax2onnx": Exporter(
        venv="jax2onnx",
        script="jax2onnx_models",
        # every package the export reads: jax2onnx's output depends on onnx and onnx-ir
        requirements=(
            "jax==0.12.0.1",
            "jaxlib==0.12.0.1",
            "jax2onnx==0.17.1",
            "flax==0.12.12",
            "onnx==1.23.2",
            "onnx-ir==1.1.0",
            "onnxruntime==1.32.0",
            "numpy==2.5.5",
        ),
        python="python3.12",  # jax2onnx needs Python >= 3.12: pyenv's 3.12.1
        python_env=(("PYENV_VERSION", "3.12.1"),),
    ),
    "paddle2onnx": Exporter(
        venv="paddle2onnx",
        script="paddle2onnx_models",
        # paddle2onnx imports packaging without declaring it, and folds constants with
        # Polygraphy, which pip-installs onnxruntime, onnx_graphsurgeon and sympy into the
        # running venv when they are missing (POLYGRAPHY_AUTOINSTALL_DEPS=1): pinned here,
        # an export never changes the venv
        requirements=(
            "paddlepaddle==3.3.1",
            "paddle2onnx==2.1.0",
            "packaging==26.4",
            "onnx==1.17.0",
            "polygraphy==0.53.6",
            "onnxruntime==1.32.0",
            "onnx_graphsurgeon==0.6.1",
            "sympy==1.14.0",
            "numpy==2.4.6",
        ),
    ),
}


def _run(command: Sequence[str], **kwargs) -> None:
    print("+", " ".join(str(c) for c in command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def venv_python(exporter: Exporter, *, reinstall: bool = False) -> Path:
    """The venv's interpreter, the venv made (or remade) with the exporter's pins."""
    venv = VENVS / exporter.venv
    python = venv / "bin" / "python"
    marker = venv / "pins.txt"
    pins = "\n".join(exporter.requirements) + "\n"
    if not reinstall and python.exists() and marker.exists() and marker.read_text() == pins:
        return python
    if venv.exists():
        shutil.rmtree(venv)
    VENVS.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **dict(exporter.python_env), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        _run([exporter.python, "-m", "venv", str(venv)], env=env)
        _run([str(python), "-m", "pip", "install", "-q", *exporter.requirements], env=env)
    except subprocess.CalledProcessError:
        shutil.rmtree(venv, ignore_errors=True)  # the next call starts anew
        raise
    marker.write_text(pins)
    return python


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.exporters.make", description=__doc__)
    parser.add_argument("exporter", choices=sorted(EXPORTERS))
    parser.add_argument("--only", nargs="+", metavar="NAME", help="models to export (file stems)")
    parser.add_argument("--reinstall", action="store_true", help="make the venv anew")
    args = parser.parse_args(argv)
    exporter = EXPORTERS[args.exporter]
    script = ROOT / "tools" / "exporters" / f"{exporter.script}.py"
    if not script.exists():
        parser.error(f"{script.relative_to(ROOT)} does not exist")
    python = venv_python(exporter, reinstall=args.reinstall)
    command = [str(python), "-m", f"tools.exporters.{exporter.script}"]
    command += ["--exporter", args.exporter, "--out", str(DATA / args.exporter)]
    if args.only:
        command += ["--only", *args.only]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}
    try:
        _run(command, cwd=ROOT, env=env)
    except subprocess.CalledProcessError as error:
        print(f"make: {exporter.script} failed (exit {error.returncode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
