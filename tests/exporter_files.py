"""The real exporter outputs committed under ``tests/data/exporters/<exporter>/``: every
manifest's entries, the sizes each file runs at, and its inputs.

Standard library and numpy only: the exporter scripts (``tools/exporters/``) use
:func:`make_feeds` in their own environments to compare each file with its source.

A manifest (written by ``tools/exporters/manifest.py``)::

    {"exporter": "tf2onnx", "versions": {...}, "script": "tools/exporters/tf2onnx_models.py",
     "models": [{"file": "lstm.onnx", "source": "...", "layer": "LSTM", "config": {...},
                 "inputs": {"x": ["batch", "seq", 8],
                            "lengths": {"axes": ["batch"], "values": "lengths"}},
                 "export_sizes": {"batch": 2, "seq": 5}, "frozen": ["seq"],
                 "fails_at": [{"sizes": {"seq": 1}, "error": "..."}],
                 "expect": "rewrite" | "refuse: <why>" | "invalid", "notes": "..."}],
     "failed": [{"file": "...", "error": "the exporter's message"}]}

An input is a list of axes (a role name, the same size wherever it appears, or a fixed
int) or ``{"axes": [...], "values": ..., "dtype": ...}``; ``values`` is one of
``"lengths"`` (integers in [1, seq], one per row), ``"masked"`` (floats with whole steps
zeroed in some rows, for Keras ``Masking``), ``{"low": L, "high": H}`` (integers in
[L, H)), or absent (floats N(0, 1)). ``frozen`` roles run at their export size only;
``fails_at`` lists sizes (the roles that differ from the export's) where ONNX Runtime
fails on the file itself (an exporter's defect, kept as found).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

__all__ = [
    "DATA",
    "ExporterFile",
    "exporter_files",
    "load_manifests",
    "make_feeds",
    "size_plans",
]

DATA = Path(__file__).resolve().parent / "data" / "exporters"

#: The roles every exporter script uses for the batch and sequence axes.
BATCH, SEQ = "batch", "seq"


@dataclasses.dataclass(frozen=True)
class ExporterFile:
    """One committed file and its manifest entry."""

    exporter: str
    path: Path
    entry: Mapping

    @property
    def id(self) -> str:
        return f"{self.exporter}/{self.path.stem}"

    @property
    def expect(self) -> str:
        return str(self.entry.get("expect", "rewrite"))

    @property
    def frozen(self) -> frozenset[str]:
        return frozenset(self.entry.get("frozen", ()))

    @property
    def export_sizes(self) -> dict[str, int]:
        return dict(self.entry["export_sizes"])

    def fails_at(self, sizes: Mapping[str, int]) -> str | None:
        """The recorded error when ONNX Runtime fails on the file at ``sizes``, else None."""
        for known in self.entry.get("fails_at", ()):
            if all(sizes.get(r) == s for r, s in known["sizes"].items()):
                return str(known["error"])
        return None

    def input_axes(self) -> dict[str, list]:
        """Graph input name -> its axes (role names or ints)."""
        return {name: _axes(spec) for name, spec in self.entry["inputs"].items()}

    def roles(self) -> list[str]:
        """The roles of the inputs' axes, in order of appearance."""
        seen: dict[str, None] = {}
        for axes in self.input_axes().values():
            seen.update((a, None) for a in axes if isinstance(a, str))
        return list(seen)


def _axes(spec: list | Mapping) -> list:
    return list(spec["axes"] if isinstance(spec, Mapping) else spec)


def load_manifests(root: Path = DATA) -> Iterator[tuple[Path, dict]]:
    """Every ``<exporter>/manifest.json`` under ``root`` (exporters sorted by name)."""
    for path in sorted(root.glob("*/manifest.json")):
        yield path, json.loads(path.read_text())


def exporter_files(root: Path = DATA) -> list[ExporterFile]:
    """Every model of every manifest (``failed`` exports are not files)."""
    return [
        ExporterFile(manifest["exporter"], path.parent / entry["file"], entry)
        for path, manifest in load_manifests(root)
        for entry in manifest["models"]
    ]


def _other_sizes(size: int) -> list[int]:
    """Sizes besides the export's: larger, smaller, 1 and 0."""
    return [s for s in dict.fromkeys((size + 2, size - 1, 1, 0)) if s >= 0 and s != size]


def size_plans(file: ExporterFile) -> list[dict[str, int]]:
    """The role sizes to run ``file`` at: the export's, then each role not frozen at a
    larger and a smaller size, 1 and 0 (the others at their export size), then every
    role not frozen at its larger size at once."""
    base = file.export_sizes
    missing = [r for r in file.roles() if r not in base]
    if missing:
        raise ValueError(f"{file.id}: roles without an export size: {missing}")
    plans = [dict(base)]
    free = [r for r in file.roles() if r not in file.frozen]
    for role in free:
        plans += [{**base, role: size} for size in _other_sizes(base[role])]
    if len(free) > 1:
        plans.append({**base, **{r: base[r] + 2 for r in free}})
    return plans


def make_feeds(
    file: ExporterFile,
    sizes: Mapping[str, int],
    dtypes: Mapping[str, np.dtype],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Random inputs of ``file`` at the role ``sizes``; ``dtypes`` per input name (the
    model's declared element types)."""
    feeds = {}
    for name, spec in file.entry["inputs"].items():
        axes = _axes(spec)
        shape = tuple(sizes[a] if isinstance(a, str) else int(a) for a in axes)
        values = spec.get("values") if isinstance(spec, Mapping) else None
        dtype = np.dtype(
            spec.get("dtype", dtypes[name]) if isinstance(spec, Mapping) else dtypes[name]
        )
        feeds[name] = _values(values, shape, dtype, axes, sizes, rng)
    return feeds


def _values(values, shape, dtype, axes, sizes, rng: np.random.Generator) -> np.ndarray:
    if values is None:
        return rng.standard_normal(shape).astype(dtype)
    if values == "lengths":
        return rng.integers(1, max(1, sizes[SEQ]) + 1, size=shape).astype(dtype)
    if values == "masked":
        data = rng.standard_normal(shape).astype(dtype)
        if SEQ in axes and BATCH in axes and data.size:
            seq, batch = axes.index(SEQ), axes.index(BATCH)
            for row in range(0, shape[batch], 2):  # every other row: a step in the middle
                index = [slice(None)] * len(shape)
                index[batch] = row
                index[seq] = rng.integers(0, shape[seq])
                data[tuple(index)] = 0
        return data
    if isinstance(values, Mapping):
        return rng.integers(values["low"], values["high"], size=shape).astype(dtype)
    raise ValueError(f"unknown input values {values!r}")
