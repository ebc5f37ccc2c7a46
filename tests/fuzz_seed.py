"""The fuzzer's seed: ``FUZZ_SEED`` (CI sets a fresh one each run) and how to replay a run."""

from __future__ import annotations

import os

__all__ = ["fuzz_seed", "replay_command"]

#: The environment that decides which models a fuzz run draws, in the replay command.
_REPLAYED = ("HYPOTHESIS_PROFILE", "FUZZ_EXAMPLES", "FUZZ_ALL", "FUZZ_ZERO_CHILD")


def fuzz_seed() -> int | None:
    """``FUZZ_SEED`` as an integer, None when unset or empty (a derandomized run)."""
    text = os.environ.get("FUZZ_SEED", "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"FUZZ_SEED must be an integer, not {text!r}") from None


def replay_command(test: str) -> str:
    """The one command that draws the same models as this run for ``test``."""
    seed = fuzz_seed()
    env = [f"FUZZ_SEED={seed}"] if seed is not None else []
    env += [f"{k}={os.environ[k]}" for k in _REPLAYED if os.environ.get(k)]
    command = f"python -m pytest -p no:cacheprovider -m fuzz tests/test_fuzz.py -k {test}"
    return "replay: " + " ".join([*env, command])
