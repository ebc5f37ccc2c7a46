"""pytest plugin for ``tox -e mutation`` only: maps and orders the tests mutmut runs.

Loaded through ``PYTEST_ADDOPTS`` in tox.ini's ``[testenv:mutation]``; the default test
run never loads it.

* **Order.** mutmut runs, per mutant, the tests that reach the mutated function with
  ``-x``, in no particular order. Ordering them by the durations mutmut recorded
  (``mutmut-stats.json``, in the working directory of its runs) lets the short, precise
  unit tests kill a mutant before the slow end-to-end ones start.
* **Map.** mutmut maps a function to the tests during which it ran. A rule's ``pattern``
  and ``__init__`` run once, when the module builds its rule at import, so mutmut charges
  them to whichever test ran first. They decide which subgraphs reach the rule's other
  methods (``check``, ``rewrite``...), so at the end of mutmut's stats run they are mapped
  to the tests that reach those methods instead (``__init__``, which names the rule, also
  to the tests of rule names, :data:`NAME_TESTS`). So is a rule module's ``*_rules`` builder
  (``state_rules``, ``rnn_node_rules``), to the tests of its classes' methods.
* **Children.** A test that runs the command in a child process (marker ``command``)
  runs the mutant there (``tests.support.child_env``), but mutmut cannot see what the
  child calls. Such tests are mapped to every function of :data:`_COMMAND_MODULES`,
  the modules only the command runs (``--verify``); the rules' own tests reach the rest.
* **Hangs.** A mutant that makes a test run far past its recorded time (a rule that keeps
  firing, a loop that never ends) fails that test after ``HANG_FACTOR`` times its recorded
  duration plus ``HANG_SLACK`` seconds: a kill, found in seconds instead of at mutmut's
  timeout for the mutant's whole test list.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
from collections.abc import Iterable, Iterator

import pytest

#: Methods a rule runs when it is built (at import), not when it is applied.
_BUILT_AT_IMPORT = ("pattern", "__init__")
#: The tests that read the names a rule's __init__ gives it. ``select_rules`` lives in
#: ``rules/__init__.py``, which mutmut does not mutate and so records no tests for: they
#: are named here (tests/test_mutation_tooling.py checks that they exist).
NAME_TESTS = ("tests/test_api.py::test_every_rule_is_selected_by_its_own_name",)
#: What the command runs that in-process tests may not reach: its --verify comparison and
#: the sizes it runs at.
_COMMAND_MODULES = (
    "rnn_rewrite_rules._verify.",
    "rnn_rewrite_rules._size_plan.",
    "rnn_rewrite_rules._size_facts.",
    "rnn_rewrite_rules.runtime.",
)
HANG_FACTOR = 5.0
HANG_SLACK = 3.0


class MutantHang(Exception):
    """A test ran far past its recorded duration under a mutant."""


def _durations() -> dict[str, float]:
    try:
        stats = json.loads(pathlib.Path("mutmut-stats.json").read_text())
    except (OSError, ValueError):
        return {}
    return stats.get("duration_by_test", {})


_DURATIONS: dict[str, float] = {}


def mutant_under_test() -> str | None:
    """The mutant mutmut is running, by name; None outside a mutant's run (mutmut also sets
    ``MUTANT_UNDER_TEST`` in other phases, such as ``stats``, to a word of its own)."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    return mutant if "__mutmut_" in mutant else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _DURATIONS.update(_durations())
    if _DURATIONS:
        items.sort(key=lambda item: _DURATIONS.get(item.nodeid, 0.0))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    recorded = _DURATIONS.get(item.nodeid)
    if recorded is None or mutant_under_test() is None:
        yield
        return
    budget = HANG_FACTOR * recorded + HANG_SLACK

    def expired(signum: int, frame: object) -> None:
        raise MutantHang(f"{item.nodeid} ran past {budget:.1f} s (recorded {recorded:.2f} s)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, budget)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def remap_built_at_import(tests_by_function: dict[str, set[str]]) -> None:
    """Map each ``pattern``/``__init__`` (mutmut's mangled ``module.xǁClassǁmethod``) to
    the tests of its class's other methods, and a rule module's ``*_rules`` builder
    (``state_rules``, ``rnn_node_rules``: run at import too) to those of its classes'
    methods, in place."""
    for name in list(tests_by_function):
        module, _, function = name.rpartition(".")
        if _is_rule_builder(module, function):
            siblings = [
                tests
                for other, tests in tests_by_function.items()
                if other.startswith(f"{module}.xǁ")
                and other.rpartition("ǁ")[2] not in _BUILT_AT_IMPORT
            ]
            tests_by_function[name] = set().union(tests_by_function[name], *siblings)
            continue
        parts = function.split("ǁ")
        if len(parts) != 3 or parts[2] not in _BUILT_AT_IMPORT:
            continue
        prefix = f"{module}.{parts[0]}ǁ{parts[1]}ǁ"
        siblings = [
            tests
            for other, tests in tests_by_function.items()
            if other.startswith(prefix) and other.rpartition("ǁ")[2] not in _BUILT_AT_IMPORT
        ]
        if parts[2] == "__init__":  # names the rule: what selecting rules by name reads
            siblings.append(set(NAME_TESTS))
        tests_by_function[name] = set().union(tests_by_function[name], *siblings)


def _is_rule_builder(module: str, function: str) -> bool:
    """A module-level function of a rule module that builds its rules (``x_*_rules``)."""
    in_rule_module = module.startswith("rnn_rewrite_rules.rules.")
    return in_rule_module and function.startswith("x_") and function.endswith("_rules")


def map_command_tests(
    tests_by_function: dict[str, set[str]], functions: Iterable[str], command_tests: set[str]
) -> None:
    """Add ``command_tests`` to every function of :data:`_COMMAND_MODULES`, in place."""
    for name in functions:
        if name.startswith(_COMMAND_MODULES):
            tests_by_function.setdefault(name, set()).update(command_tests)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    from mutmut.state import state  # only a mutmut stats run gets here

    tests_by_function = state().tests_by_mangled_function_name
    remap_built_at_import(tests_by_function)
    commands = {item.nodeid for item in session.items if item.get_closest_marker("command")}
    functions = [*state().current_function_hashes, *tests_by_function]
    map_command_tests(tests_by_function, functions, commands)
