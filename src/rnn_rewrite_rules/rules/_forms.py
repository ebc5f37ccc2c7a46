"""One named rule for a form the onnxscript matcher can only see as several patterns.

An onnxscript pattern names a fixed number of outputs, and the matcher refuses a match
where an output the pattern does not name is used outside it. So a rule rooted at a node
with a variable number of outputs (an RNN node, a ``Loop``, a ``Scan``, an ``If``) is one
pattern per output count. :class:`FormRule` makes those patterns one rule: one name in
``select_rules``, ``install()``, ``--list-rules``, the counts and the node metadata; it
tries its variants in order on each node and applies the first that rewrites it, which is
what the rewriter did with the variants listed one after another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import RewriteRule

from rnn_rewrite_rules._compat import rule_parts

__all__ = ["FormRule"]


class FormRule(RewriteRule):
    """A rule named ``name`` that applies the first of ``variants`` that rewrites a node.

    The variants are ordinary rules (e.g. ``SomeRule.rule(n)`` for each output count, most
    outputs first); they must agree on ``remove_nodes`` and not be ``as_function``. Each
    variant's setup and cleanup run as the rewriter runs a rule's. The variants take the
    rule's name, so a tracer records their refusals under it.

    Raises:
        ValueError: no variants, or variants that disagree on ``remove_nodes``, or an
            ``as_function`` variant.
    """

    def __init__(self, name: str, variants: Sequence[RewriteRule]) -> None:
        if not variants:
            raise ValueError(f"rule {name!r} has no variants")
        if len({variant.remove_nodes for variant in variants}) != 1:
            raise ValueError(f"the variants of {name!r} disagree on remove_nodes")
        if any(variant.as_function for variant in variants):
            raise ValueError(f"rule {name!r}: as_function variants are not supported")
        first = variants[0]
        # the first variant's pattern, check and rewrite stand for the rule where onnxscript
        # or a report reads them (a docstring); matching goes through try_rewrite below
        super().__init__(
            *rule_parts(first),
            name=name,
            remove_nodes=first.remove_nodes,
            graph_pre_visitor=_each(v.graph_pre_visitor for v in variants),
            graph_post_visitor=_each(v.graph_post_visitor for v in variants),
        )
        for variant in variants:
            variant.name = name
        self.variants: tuple[RewriteRule, ...] = tuple(variants)

    def try_rewrite(
        self,
        model: ir.Model,
        graph_or_function: ir.Graph | ir.Function,
        node: ir.Node,
        **kwargs: Any,
    ) -> Any:
        for variant in self.variants:
            delta = variant.try_rewrite(model, graph_or_function, node, **kwargs)
            if delta is not None:
                return delta
        return None

    def match(self, *args: Any, **kwargs: Any) -> Any:
        for variant in self.variants:
            result = variant.match(*args, **kwargs)
            if result:
                return result
        return None

    def commute(self) -> Sequence[RewriteRule]:
        variants = [commuted for variant in self.variants for commuted in variant.commute()]
        return [FormRule(str(self.name), variants)]


def _each(visitors: Any) -> Callable[[], None] | None:
    """One visitor calling each of ``visitors`` that is set, in order (None if none is)."""
    present: list[Callable[[], None]] = [v for v in visitors if v is not None]
    if not present:
        return None

    def visit() -> None:
        for visitor in present:
            visitor()

    return visit
