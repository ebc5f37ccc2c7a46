"""Shared fixtures, the hypothesis profiles (``HYPOTHESIS_PROFILE=ci`` in CI) and the
fuzzer's seed in the report header (``FUZZ_SEED``: tests/fuzz_seed.py)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from tests.fuzz_seed import fuzz_seed

settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,  # ORT session creation varies with machine load: never a flaky deadline
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(  # `tox -e mutation`: few, fixed examples per mutant
    "mutation",
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_report_header() -> str:
    seed = fuzz_seed()
    if seed is None:
        return "fuzz: derandomized (FUZZ_SEED unset)"
    return f"fuzz: FUZZ_SEED={seed} (set it to replay this run's fuzz models)"


#: Test files run on the worker of another file under ``--dist loadfile`` (the README's
#: command), so a cache both read is filled once: the exporter files' rewrites
#: (``exporter_support.rewrite_file_once``).
SAME_WORKER = {"tests/test_exporter_table.py": "tests/test_exporter_files.py"}


def pytest_configure(config) -> None:
    if config.pluginmanager.hasplugin("xdist"):  # the lowest-versions run has no xdist
        config.pluginmanager.register(_SameWorkerScheduling(), "same-worker-scheduling")


class _SameWorkerScheduling:
    """``--dist loadfile``, each file of :data:`SAME_WORKER` in its partner's unit."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling

        class Scheduling(LoadFileScheduling):
            def _split_scope(self, nodeid: str) -> str:
                scope = super()._split_scope(nodeid)
                return SAME_WORKER.get(scope, scope)

        return Scheduling(config, log)
