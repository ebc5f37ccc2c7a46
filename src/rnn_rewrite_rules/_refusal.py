"""The typed reason a proof or a plan gives when it does not hold."""

from __future__ import annotations

__all__ = ["Inapplicable", "Refusal"]


class Refusal(str):
    """Why a condition does not hold, in the model's terms: what a rule's check reports.

    A function that proves something returns its result or a ``Refusal`` (``X | Refusal``),
    or a ``Refusal`` or None (``Refusal | None``); test for it with
    ``isinstance(result, Refusal)``. It is the reason text itself, so it prints, compares
    and is passed to ``MatchResult.fail`` as the string it holds.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Refusal({str.__repr__(self)})"


class Inapplicable(Refusal):
    """A refusal that says nothing about the node: the rule is not written for it at all
    (a rule for another output count, a guard merge on a Concat no guard feeds). Reports
    leave it out."""

    __slots__ = ()
