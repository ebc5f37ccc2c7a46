"""The description of a rule family that every family module declares as ``FAMILY``."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

from onnxscript.rewriter import RewriteRule

__all__ = ["MakeRules", "RuleFamily"]

#: Builds a family's rules anew: each rewrite gets its own, so what a rule and its matcher
#: keep from their last match (the graph, a plan) is freed with them when it returns.
MakeRules = Callable[[], Sequence[RewriteRule]]


@dataclasses.dataclass(frozen=True)
class RuleFamily:
    """A family of rules written for one kind of exporter output.

    Attributes:
        name: what ``--rules`` and ``rules(names)`` call it.
        description: one line, shown by ``--list-rules``.
        make_rules: builds its rules for the default target (``portable``), in the order
            they are tried.
        install_by_default: whether :func:`rnn_rewrite_rules.install` adds it.
        target_rules: builds the rules that replace ``make_rules``'s for another target
            (see ``rules.TARGETS``), e.g. a form only ONNX Runtime accepts.
        fixes: the ``diagnostics`` hazard kinds it was written to remove.
    """

    name: str
    description: str
    make_rules: MakeRules
    install_by_default: bool = True
    target_rules: Mapping[str, MakeRules] = dataclasses.field(default_factory=dict)
    fixes: tuple[str, ...] = ()

    @property
    def rules(self) -> tuple[RewriteRule, ...]:
        """New rules for the default target."""
        return tuple(self.make_rules())

    def rules_for(self, target: str) -> tuple[RewriteRule, ...]:
        """New rules for ``target``."""
        return tuple(self.target_rules.get(target, self.make_rules)())

    @property
    def all_rules(self) -> tuple[RewriteRule, ...]:
        """New rules of every target, one per name (what a rule name can select)."""
        by_name: dict[str, RewriteRule] = {}
        for make in (self.make_rules, *self.target_rules.values()):
            for rule in make():
                by_name.setdefault(str(rule.name), rule)
        return tuple(by_name.values())

    @classmethod
    def measured(
        cls,
        name: str,
        doc: str | None,
        make_rules: Callable[[str], Sequence[RewriteRule]],
        fixes: tuple[str, ...] = (),
    ) -> RuleFamily:
        """A family installed by default whose ``make_rules(target)`` declines by that
        target's measured cost table: ``portable`` by default, ``onnxruntime`` on request;
        described by the first line of ``doc`` (its module's docstring)."""
        return cls(
            name=name,
            description=(doc or "").partition("\n")[0],
            make_rules=functools.partial(make_rules, "portable"),
            target_rules={"onnxruntime": functools.partial(make_rules, "onnxruntime")},
            fixes=fixes,
        )
