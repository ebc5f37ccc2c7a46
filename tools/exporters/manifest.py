"""The driver every exporter script shares: each model exported in a fresh process, the
entries gathered into ``manifest.json`` (the format: ``tests/exporter_files.py``).

Standard library only: it runs inside each exporter's own virtual environment.

A script defines its models as ``{file stem: export function}``; an export function takes
the output path and returns the model's manifest entry without ``file``. The script's
``main`` calls :func:`main`, which

* without ``--one``: runs ``python -m <script> --one NAME`` per model (a fresh process:
  torch freezes axes on a second export in one process, tf2onnx names nodes by counters),
  collects the entries, and writes the manifest, keeping the entries of models not
  exported this time (``--only``) and listing models whose export failed, with the
  exporter's message, under ``failed``;
* with ``--one NAME``: exports that model and prints its entry as the last line.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["ExportRefused", "main", "versions"]

Export = Callable[[Path], dict]
_ENTRY = "manifest-entry: "


class ExportRefused(Exception):
    """The exporter refused or broke on this model: recorded under ``failed``."""


def versions(*distributions: str) -> dict[str, str]:
    """The installed version of each distribution, and Python's."""
    found = {name: importlib.metadata.version(name) for name in distributions}
    found["python"] = platform.python_version()
    return found


def _export_one(name: str, export: Export, out: Path) -> int:
    try:
        entry = export(out / f"{name}.onnx")
    except Exception as error:  # the exporter's own message is the record
        traceback.print_exc()
        message = " ".join(f"{type(error).__name__}: {error}".split())[:600]
        print(_ENTRY + json.dumps({"failed": message}), flush=True)
        return 0
    print(_ENTRY + json.dumps({"file": f"{name}.onnx", **entry}), flush=True)
    return 0


def _run_child(module: str, exporter: str, out: Path, name: str) -> dict:
    command = [sys.executable, "-m", module, "--exporter", exporter, "--out", str(out)]
    result = subprocess.run([*command, "--one", name], capture_output=True, text=True, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith(_ENTRY)]
    if result.returncode != 0 or not lines:
        tail = " ".join(result.stderr.strip().splitlines()[-3:])[:600]
        return {"failed": f"the export process exited {result.returncode}: {tail}"}
    entry = json.loads(lines[-1][len(_ENTRY) :])
    if "failed" in entry:
        sys.stderr.write(result.stderr[-3000:])
    return entry


def _write_manifest(
    out: Path, header: Mapping[str, object], models: list[dict], failed: list[dict]
) -> None:
    path = out / "manifest.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    names = {m["file"] for m in models} | {f["file"] for f in failed}
    kept = [m for m in old.get("models", []) if m["file"] not in names]
    kept_failed = [f for f in old.get("failed", []) if f["file"] not in names]
    manifest = {
        **header,
        "models": sorted(kept + models, key=lambda m: m["file"]),
        "failed": sorted(kept_failed + failed, key=lambda f: f["file"]),
    }
    path.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")


def main(
    module: str,
    models: Callable[[str], Mapping[str, Export]],
    header: Callable[[str], Mapping[str, object]],
    argv: Sequence[str] | None = None,
) -> int:
    """Run an exporter script.

    Args:
        module: the script as ``python -m`` names it (``tools.exporters.torch_models``).
        models: exporter name -> its models (file stem -> export function).
        header: exporter name -> the manifest's ``exporter``, ``versions``, ``script``.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--exporter", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="+", metavar="NAME")
    parser.add_argument("--one", metavar="NAME", help="export one model in this process")
    args = parser.parse_args(argv)
    table = models(args.exporter)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        return _export_one(args.one, table[args.one], args.out)
    unknown = sorted(set(args.only or ()) - set(table))
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)}")
    done: list[dict] = []
    failed: list[dict] = []
    for name in args.only or table:
        print(f"exporting {args.exporter}/{name} ...", flush=True)
        entry = _run_child(module, args.exporter, args.out, name)
        if "failed" in entry:
            print(f"  FAILED: {entry['failed']}", flush=True)
            failed.append({"file": f"{name}.onnx", "error": entry["failed"]})
            (args.out / f"{name}.onnx").unlink(missing_ok=True)
        else:
            done.append(entry)
    _write_manifest(args.out, header(args.exporter), done, failed)
    print(f"{args.exporter}: {len(done)} exported, {len(failed)} failed", flush=True)
    return 0
