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
