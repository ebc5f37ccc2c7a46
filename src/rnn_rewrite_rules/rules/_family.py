"""The description of a rule family that every family module declares as ``FAMILY``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from onnxscript.rewriter import RewriteRule, RewriteRuleSet

__all__ = ["RuleFamily"]


@dataclasses.dataclass(frozen=True)
class RuleFamily:
    """A family of rules written for one kind of exporter output.

    Attributes:
        name: what ``--rules`` and ``rules(names)`` call it.
        description: one line, shown by ``--list-rules``.
        rule_set: its rules for the default target (``portable``), in the order they are tried.
        install_by_default: whether :func:`rnn_rewrite_rules.install` adds it.
        target_rule_sets: the rules that replace ``rule_set`` for another target (see
            ``rules.TARGETS``), e.g. a form only ONNX Runtime accepts.
        fixes: the ``diagnostics`` hazard kinds it was written to remove.
    """

    name: str
    description: str
    rule_set: RewriteRuleSet
    install_by_default: bool = True
    target_rule_sets: Mapping[str, RewriteRuleSet] = dataclasses.field(default_factory=dict)
    fixes: tuple[str, ...] = ()

    @property
    def rules(self) -> tuple[RewriteRule, ...]:
        """The rules for the default target."""
        return tuple(self.rule_set)

    def rules_for(self, target: str) -> tuple[RewriteRule, ...]:
        """The rules for ``target``."""
        return tuple(self.target_rule_sets.get(target, self.rule_set))

    @property
    def all_rules(self) -> tuple[RewriteRule, ...]:
        """Every rule of every target, each once (what a rule name can select)."""
        sets = (self.rule_set, *self.target_rule_sets.values())
        return tuple(dict.fromkeys(rule for rule_set in sets for rule in rule_set))
