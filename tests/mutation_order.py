"""pytest plugin for ``tox -e mutation`` only: run a mutant's tests fastest first.

mutmut runs, per mutant, the tests that reach the mutated function with ``-x``, in no
particular order. Ordering them by the durations mutmut recorded
(``mutants/mutmut-stats.json``, the working directory of its runs) lets the short,
precise unit tests kill a mutant before the slow end-to-end ones start. Loaded through
``PYTEST_ADDOPTS`` in tox.ini's ``[testenv:mutation]``; the default test run never loads it.
"""

from __future__ import annotations

import json
import pathlib

import pytest


def _durations() -> dict[str, float]:
    try:
        stats = json.loads(pathlib.Path("mutmut-stats.json").read_text())
    except (OSError, ValueError):
        return {}
    return stats.get("duration_by_test", {})


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    durations = _durations()
    if durations:
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
