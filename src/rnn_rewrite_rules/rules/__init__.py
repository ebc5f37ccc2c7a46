"""The rule families, one module each, and the registry that names them.

Each family module exposes ``rules`` (an ``onnxscript.rewriter.RewriteRuleSet``)
and ``INSTALL_BY_DEFAULT`` (whether :func:`rnn_rewrite_rules.install` adds it to
onnxscript's default rules). The first line of its docstring is its description.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable

from onnxscript.rewriter import RewriteRule

__all__ = ["FAMILY_MODULES", "RuleFamily", "families", "select_rules"]

#: Family name -> module. Order is the order rules are tried on each node.
FAMILY_MODULES: dict[str, str] = {
    "weight_folding": "rnn_rewrite_rules.rules.weight_folding",
    "initial_state": "rnn_rewrite_rules.rules.initial_state",
    "layer_output": "rnn_rewrite_rules.rules.layer_output",
    "layer_glue": "rnn_rewrite_rules.rules.layer_glue",
    "unused_outputs": "rnn_rewrite_rules.rules.unused_outputs",
    "layout": "rnn_rewrite_rules.rules.layout",
}


@dataclasses.dataclass(frozen=True)
class RuleFamily:
    name: str
    description: str
    rules: tuple[RewriteRule, ...]
    install_by_default: bool
    #: False when a runtime other than ONNX Runtime is known to reject what it emits.
    portable: bool


def families() -> dict[str, RuleFamily]:
    """Every available family, in application order."""
    result = {}
    for name, module_name in FAMILY_MODULES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue  # a family still being written
        doc = (module.__doc__ or "").strip().splitlines()
        result[name] = RuleFamily(
            name=name,
            description=doc[0] if doc else name,
            rules=tuple(module.rules),
            install_by_default=getattr(module, "INSTALL_BY_DEFAULT", True),
            portable=getattr(module, "PORTABLE", True),
        )
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
        names = [f.name for f in available.values() if f.install_by_default or not installed_only]
    by_rule = {rule.name: (family, rule) for family in available.values() for rule in family.rules}
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
