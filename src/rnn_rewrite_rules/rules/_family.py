"""The description of a rule family that every family module declares as ``FAMILY``."""

from __future__ import annotations

import dataclasses

from onnxscript.rewriter import RewriteRule, RewriteRuleSet

__all__ = ["RuleFamily"]


@dataclasses.dataclass(frozen=True)
class RuleFamily:
    """A family of rules written for one kind of exporter output.

    Attributes:
        name: what ``--rules`` and ``rules(names)`` call it.
        description: one line, shown by ``--list-rules``.
        rule_set: its rules, in the order they are tried.
        install_by_default: whether :func:`rnn_rewrite_rules.install` adds it.
        portable: False when a runtime other than ONNX Runtime is known to reject its output.
        fixes: the ``diagnostics`` hazard kinds it was written to remove.
    """

    name: str
    description: str
    rule_set: RewriteRuleSet
    install_by_default: bool = True
    portable: bool = True
    fixes: tuple[str, ...] = ()

    @property
    def rules(self) -> tuple[RewriteRule, ...]:
        return tuple(self.rule_set)
