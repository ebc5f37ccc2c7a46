"""The fuzzer's strategy: a core recurrence, then random surroundings around it."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import strategies as st

from rnn_rewrite_rules.testing.fuzz.case import Case
from rnn_rewrite_rules.testing.fuzz.cores import CORES
from rnn_rewrite_rules.testing.fuzz.functions import in_function
from rnn_rewrite_rules.testing.fuzz.surroundings import MUTATORS

__all__ = ["ALL_MUTATORS", "fuzz_cases"]

#: Every mutator by name: the surroundings, then wrapping into a function.
ALL_MUTATORS = {**MUTATORS, "in_function": in_function}


@st.composite
def fuzz_cases(
    draw,
    cores: Iterable[str] | None = None,
    mutators: Iterable[str] | None = None,
    max_mutations: int = 4,
) -> Case:
    """A :class:`Case`: one of ``cores`` (all of :data:`~.cores.CORES` by default) with up
    to ``max_mutations`` of ``mutators`` (all of :data:`ALL_MUTATORS`) applied in the
    order drawn (a mutator that does not apply is skipped). hypothesis shrinks a failing
    case to fewer mutations and smaller core arguments."""
    names = sorted(cores or CORES)
    case = draw(st.one_of([CORES[name] for name in names]))
    allowed = sorted(mutators if mutators is not None else ALL_MUTATORS)
    if allowed:
        for name in draw(st.lists(st.sampled_from(allowed), max_size=max_mutations)):
            ALL_MUTATORS[name](draw, case)
    return case
