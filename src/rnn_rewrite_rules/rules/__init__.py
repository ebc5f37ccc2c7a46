"""The rule families, one module each, and the selection of rules by name.

Each family module declares one :class:`RuleFamily` as ``FAMILY``; :data:`FAMILIES`
lists them in the order their rules are tried on each node.
"""

from __future__ import annotations

from collections.abc import Iterable

from onnxscript.rewriter import RewriteRule

from rnn_rewrite_rules.rules import (
    bidirectional,
    fold_if,
    initial_state,
    layer_glue,
    layer_output,
    layout,
    reroll,
    unused_outputs,
    weight_folding,
)
from rnn_rewrite_rules.rules._family import RuleFamily

__all__ = ["FAMILIES", "RuleFamily", "families", "fixed_by", "select_rules"]

#: Every family, in application order.
FAMILIES: tuple[RuleFamily, ...] = (
    weight_folding.FAMILY,
    reroll.FAMILY,
    fold_if.FAMILY,
    bidirectional.FAMILY,
    initial_state.FAMILY,
    layer_output.FAMILY,
    layer_glue.FAMILY,
    unused_outputs.FAMILY,
    layout.FAMILY,
)


def families() -> dict[str, RuleFamily]:
    """Every family by name, in application order."""
    return {family.name: family for family in FAMILIES}


def fixed_by() -> dict[str, tuple[str, ...]]:
    """Hazard kind (see ``diagnostics.KINDS``) -> the families written to remove it."""
    result: dict[str, tuple[str, ...]] = {}
    for family in FAMILIES:
        for kind in family.fixes:
            result[kind] = (*result.get(kind, ()), family.name)
    return result


def select_rules(
    names: Iterable[str] | None = None,
    *,
    installed_only: bool = False,
    portable: bool = False,
) -> list[RewriteRule]:
    """Rules by family or rule name (all families when ``names`` is None).

    ``installed_only`` keeps the families ``install()`` adds by default; ``portable``
    drops the families whose output a runtime other than ONNX Runtime rejects (see
    ``docs/benchmarks.md``: tract and dropped zero states), also when named.

    Raises:
        KeyError: a name is neither a family nor a rule.
    """
    available = families()
    if names is None:
        names = [f.name for f in FAMILIES if f.install_by_default or not installed_only]
    by_rule = {rule.name: (family, rule) for family in FAMILIES for rule in family.rules}
    selected: list[RewriteRule] = []
    for name in names:
        if name in available:
            chosen = [(available[name], rule) for rule in available[name].rules]
        elif name in by_rule:
            chosen = [by_rule[name]]
        else:
            raise KeyError(name)
        selected.extend(rule for family, rule in chosen if family.portable or not portable)
    return list(dict.fromkeys(selected))
