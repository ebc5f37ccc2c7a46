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
    loop_scan,
    one_step,
    reroll,
    unused_outputs,
    weight_folding,
)
from rnn_rewrite_rules.rules._family import RuleFamily

__all__ = [
    "DEFAULT_TARGET",
    "FAMILIES",
    "TARGETS",
    "RuleFamily",
    "families",
    "fixed_by",
    "select_rules",
]

#: What the rewritten model must run on -> what that target's output is.
TARGETS: dict[str, str] = {
    "portable": "runs wherever the original runs (ONNX Runtime, tract, OpenVINO, "
    "onnx.reference): zero initial states become one shared ConstantOfShape",
    "onnxruntime": "the smallest graph for ONNX Runtime: zero initial states are dropped "
    "(tract rejects an RNN without initial_h when the batch is symbolic)",
}
DEFAULT_TARGET = "portable"

#: Every family, in application order.
FAMILIES: tuple[RuleFamily, ...] = (
    weight_folding.FAMILY,
    loop_scan.FAMILY,
    reroll.FAMILY,
    one_step.FAMILY,
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
    target: str = DEFAULT_TARGET,
) -> list[RewriteRule]:
    """New rules by family or rule name (all families when ``names`` is None).

    ``installed_only`` keeps the families ``install()`` adds by default; a family gives
    its rules for ``target`` (see :data:`TARGETS`); a rule named gives that rule.

    Raises:
        KeyError: a name is neither a family nor a rule.
        ValueError: ``target`` is not one of :data:`TARGETS`.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} (targets: {', '.join(TARGETS)})")
    available = families()
    if names is None:
        names = [f.name for f in FAMILIES if f.install_by_default or not installed_only]
    family_of = {rule.name: family for family in FAMILIES for rule in family.all_rules}
    selected: dict[str, RewriteRule] = {}  # by name: each rule once, in first-named order
    for name in names:
        if name in available:
            rules = available[name].rules_for(target)
        elif name in family_of:  # the target's own rule of that name where there is one
            family = family_of[name]
            rules = tuple(r for r in family.rules_for(target) if r.name == name) or tuple(
                r for r in family.all_rules if r.name == name
            )
        else:
            raise KeyError(name)
        for rule in rules:
            selected.setdefault(str(rule.name), rule)
    return list(selected.values())
