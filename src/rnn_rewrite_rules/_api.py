"""Apply the rules to a model with the cleanups that make their effect visible."""

from __future__ import annotations

import collections
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, TypeVar

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import (
    MatchingTracer,
    MatchResult,
    MatchStatus,
    RewriteRule,
    RewriteRuleSet,
)

from rnn_rewrite_rules import _serialize, costs
from rnn_rewrite_rules._compat import check_onnxscript
from rnn_rewrite_rules.errors import BadOptions, UnknownRule
from rnn_rewrite_rules.normalize import Journal, normalize
from rnn_rewrite_rules.passes import (
    BatchZeroGuardPass,
    DeclaredOutputShapesPass,
    EmptyUnusedRnnOutputsPass,
    ForwardReverseNodesPass,
    InitializerInfoFromTensorPass,
    RemoveDeadNodesPass,
    RemoveUnusedSubgraphInitializersPass,
    UniqueRewrittenNodeNamesPass,
)
from rnn_rewrite_rules.passes.unique_rewritten_node_names import model_nodes
from rnn_rewrite_rules.rules import DEFAULT_TARGET, families, select_rules

__all__ = ["BadOptions", "UnknownRule", "rewrite", "rules", "select"]

_Model = TypeVar("_Model", onnx.ModelProto, ir.Model)
_MAX_ROUNDS = 4


def select(
    names: Sequence[str] | str | None,
    *,
    target: str | None = None,
    installed_only: bool = False,
    exclude: Sequence[str] | str | None = None,
) -> list[RewriteRule]:
    """The rules named for ``target`` (None: the default), less those ``exclude`` names:
    a string is one name, None all (see ``select_rules``).

    Raises:
        UnknownRule: a name is neither a family nor a rule.
        BadOptions: ``names`` is empty, ``target`` unknown, or ``exclude`` leaves no rule.
        TypeError: a name is not a string.
    """
    names = _name_list(names)
    if names is not None and not names:
        raise BadOptions(
            f"give at least one rule or family name, or None for all "
            f"(families: {', '.join(families())})"
        )
    excluded = _name_list(exclude) or []
    target = target or DEFAULT_TARGET
    try:
        selected = select_rules(names, installed_only=installed_only, target=target)
        available = families()
        dropped: set[str] = set()  # by name: each call builds its rules anew
        for name in excluded:  # a family excluded takes its rules of every target with it
            in_family = available[name].all_rules if name in available else None
            dropped.update(rule_name(r) for r in in_family or select_rules([name], target=target))
    except KeyError as error:
        raise UnknownRule(error.args[0], list(families())) from None
    except ValueError as error:  # an unknown target
        raise BadOptions(str(error)) from None
    kept = [rule for rule in selected if rule_name(rule) not in dropped]
    if selected and not kept:
        raise BadOptions(f"--exclude {','.join(excluded)} leaves no rule to apply")
    return kept


def _name_list(names: Sequence[str] | str | None) -> list[str] | None:
    """``names`` as a list (a string is one name), None as None.

    Raises:
        TypeError: a name is not a string.
    """
    if names is None:
        return None
    names = [names] if isinstance(names, str) else list(names)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"rule and family names are strings, not {type(name).__name__}")
    return names


def rules(
    names: Sequence[str] | str | None = None,
    *,
    target: str | None = None,
    exclude: Sequence[str] | str | None = None,
) -> RewriteRuleSet:
    """Our rules as a set for ``onnxscript.rewriter.rewrite(model, pattern_rewrite_rules=...)``.

    Args:
        names: family or rule names (see ``rnn-rewrite --list-rules``), a string for one;
            all by default.
        target: ``"portable"`` (default): the output runs wherever the original runs
            (ONNX Runtime, tract, OpenVINO, ``onnx.reference``); ``"onnxruntime"``: the
            smallest graph, which tract rejects (zero initial states dropped). See
            ``rnn_rewrite_rules.rules.TARGETS``.
        exclude: family or rule names left out of ``names`` (a string for one), e.g.
            ``exclude="reroll"`` for every family but ``reroll``.

    Raises:
        UnknownRule: a name is neither a family nor a rule (a ``KeyError``).
        BadOptions: ``names`` is empty, the target unknown, or ``exclude`` leaves no rule
            (a ``ValueError``).
    """
    return RewriteRuleSet(select(names, target=target, exclude=exclude))


def rewrite(
    model: _Model,
    names: Sequence[str] | str | None = None,
    *,
    target: str | None = None,
    exclude: Sequence[str] | str | None = None,
    context: costs.Context | None = None,
) -> _Model:
    """Rewrite ``model`` until no rule fires, then drop what became unused.

    Returns the same kind of object it was given; an ``ir.Model`` is changed in place.
    The normalisation passes (:mod:`rnn_rewrite_rules.normalize`) run first; what no rule
    used of them is undone, so where no rule fires the model comes back as given (a
    ``ModelProto`` byte for byte, unless cleanup fixes a declared output shape).
    ``names``, ``target`` and ``exclude`` are as in :func:`rules`. ``context``: the cost
    tables the rules decide on and where they record what they declined (default: the
    checked-in tables, the record dropped).

    Memory: a ``ModelProto`` is not changed, so the result is a second copy of the weights
    (the folded ones), built while each is dropped from the working model: the peak is the
    model given plus about 1.4x its size. For a model on disk, :func:`rewrite_file` (or
    ``rnn-rewrite``) keeps the weights on disk until written and peaks lower.

    Raises:
        TypeError: ``model`` is neither an ``onnx.ModelProto`` nor an ``onnx_ir.Model``.
        UnknownRule, BadOptions: as :func:`rules`.
        rnn_rewrite_rules.errors.UnsupportedVersionError: onnxscript is outside the
            tested range (a ``RuntimeError``); the model is not touched.
    """
    if not isinstance(model, onnx.ModelProto | ir.Model):
        hint = (
            "; for a file on disk use rnn_rewrite_rules.rewrite_file(src, dst)"
            if isinstance(model, str | bytes | os.PathLike)
            else ""
        )
        raise TypeError(
            f"rewrite() takes an onnx.ModelProto or an onnx_ir.Model, "
            f"not {type(model).__name__}{hint}"
        )
    check_onnxscript()
    rule_set = RewriteRuleSet(select(names, target=target, exclude=exclude))
    if isinstance(model, onnx.ModelProto):
        ir_model = ir.serde.deserialize_model(model)
        fired = apply_rounds(ir_model, rule_set, context=context, target=target)
        if not fired:
            # no rule fired: the model given with only what cleanup fixes (declared
            # output shapes the prover refutes, unused RNN outputs), no normalisation
            ir_model = ir.serde.deserialize_model(model)
            cleanup(ir_model, model_nodes(ir_model), target=target)
            untouched = ir.serde.deserialize_model(model)
            InitializerInfoFromTensorPass()(untouched)
            if _serialize.structure(untouched) == _serialize.structure(ir_model):
                result = onnx.ModelProto()
                result.CopyFrom(model)  # nothing changed: byte for byte the model given
                return result
        return _serialize.serialize_releasing(ir_model)
    apply_rounds(model, rule_set, context=context, target=target)
    return model


def apply_rounds(
    model: ir.Model,
    rule_set: RewriteRuleSet,
    on_round: Callable[[int], None] | None = None,
    *,
    counts: collections.Counter[str] | None = None,
    on_node: Callable[[], None] | None = None,
    context: costs.Context | None = None,
    refusals: list[Refused] | None = None,
    target: str | None = None,
) -> bool:
    """Apply ``rule_set`` to ``model`` in place until a round fires nothing (at most
    ``_MAX_ROUNDS``: one rule's output is another's input), then :func:`cleanup`.

    The normalisation passes (:mod:`rnn_rewrite_rules.normalize`) run first; after the
    rounds, each of their edits no rule used is undone, so the exporter's spelling (node
    and output names, declared types) stays wherever no rule rewrote it. Dead nodes
    are removed after each round that fired, so the next one does not rewrite
    dead code. True when a rule fired.

    Args:
        on_round: called with the round number before each round.
        counts: if given, each rule's rewrites are added to it, by rule name. Each rule is
            wrapped (the wrapper delegates everything to it), so the count is what the
            rewriter applied.
        on_node: called for every node the rules visit (progress); needs ``counts``.
        context: what the rules' checks read and record (:mod:`rnn_rewrite_rules.costs`);
            None: a fresh one.
        refusals: if given, it ends holding every failed condition of the last round (the
            one that fired nothing: the rules' refusals on the rewritten model).
        target: what the result must run on, as in :func:`rules` (None: the default), for
            :func:`cleanup`.
    """
    tracer = _RefusalTracer() if refusals is not None else None
    if (counts is not None or tracer is not None) and rule_set.rules:
        wrapped = [
            _CountingRule(rule, counts, on_node if index == 0 else None, tracer)
            for index, rule in enumerate(rule_set.rules)
        ]
        # a _CountingRule stands in for its rule by delegation, not by subclassing
        rule_set = RewriteRuleSet(wrapped)  # type: ignore[arg-type]
    original = weakref.WeakSet(model_nodes(model))  # weakly: removed nodes are freed
    journal = Journal()
    if rule_set.rules:
        normalize(model, journal)  # one spelling for every family (rnn_rewrite_rules.normalize)
    fired = False
    with costs.attached(model, context or costs.Context()):
        fired = _rounds(model, rule_set, on_round, tracer)
        normalised = [] if tracer is None else list(tracer.failures)
        # the exporter's spelling wherever no rule used the normalised one, then the
        # rules once more on it, as they would run without normalisation (an Identity
        # put back between two layers is one the layer-glue rules remove)
        if journal.restore(original) and fired:
            _rounds(model, rule_set, on_round, tracer)
    if refusals is not None and tracer is not None:
        refusals[:] = _real_refusals(normalised, tracer.failures)
    cleanup(model, original, target=target)
    return fired


def _rounds(
    model: ir.Model,
    rule_set: RewriteRuleSet,
    on_round: Callable[[int], None] | None,
    tracer: _RefusalTracer | None,
) -> bool:
    """Apply ``rule_set`` until a round fires nothing (at most ``_MAX_ROUNDS``), dead
    nodes removed after each round that fired; True when a rule fired."""
    fired = False
    for round_number in range(_MAX_ROUNDS):
        if on_round is not None:
            on_round(round_number)
        if tracer is not None:
            tracer.failures.clear()
        if not rule_set.apply_to_model(model):
            break
        fired = True
        RemoveDeadNodesPass()(model)
    return fired


def _real_refusals(normalised: list[Refused], last: list[Refused]) -> list[Refused]:
    """The refusals of the last round, each rule's at a node it also refused in the last
    normalised round (before the journal put the exporter's spelling back) taken from
    there: the rules read the normalised spelling, so that refusal is the real reason (a
    Loop refused for its cell is otherwise refused for its condition's spelling)."""
    refused = {(rule_name(r.rule), r.root) for r in last}
    earlier = [r for r in normalised if (rule_name(r.rule), r.root) in refused]
    replaced = {(rule_name(r.rule), r.root) for r in earlier}
    return earlier + [r for r in last if (rule_name(r.rule), r.root) not in replaced]


def rule_name(rule: RewriteRule) -> str:
    """The rule's name (what ``--rules`` and the reports use)."""
    return rule.name or repr(rule)


class Refused(NamedTuple):
    """A rule's failed condition (or failed replacement) at a node."""

    rule: RewriteRule
    root: ir.Node
    match: MatchResult
    status: MatchStatus


class _RefusalTracer(MatchingTracer):
    """Keeps every failed condition (the base class keeps only the best match per rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[Refused] = []

    def log(self, rule, container, node, match_result, status) -> None:
        if status in (MatchStatus.CONDITION_FAILED, MatchStatus.REPLACEMENT_FAILED):
            self.failures.append(Refused(rule, node, match_result, status))


class _CountingRule:
    """Delegates to a rule, counts the rewrites it produced and (given a tracer) traces
    its failed conditions: the tracer goes to the rule, not to the rule set, which would
    then apply nothing."""

    def __init__(
        self,
        rule: RewriteRule,
        counts: collections.Counter[str] | None,
        on_node: Callable[[], None] | None = None,
        tracer: MatchingTracer | None = None,
    ) -> None:
        self._rule = rule
        self._counts = counts
        self._on_node = on_node
        self._tracer = tracer

    def __getattr__(self, name: str):
        return getattr(self._rule, name)

    def try_rewrite(self, model, graph_or_function, node, **kwargs):
        if self._on_node is not None:
            self._on_node()
        if kwargs.get("tracer") is None and self._tracer is not None:
            kwargs["tracer"] = self._tracer
            delta = self._rule.try_rewrite(model, graph_or_function, node, **kwargs)
            traced_by_caller = False
        else:
            delta = self._rule.try_rewrite(model, graph_or_function, node, **kwargs)
            traced_by_caller = kwargs.get("tracer") is not None
        if delta is not None and not traced_by_caller and self._counts is not None:
            self._counts[rule_name(self._rule)] += 1
        return delta


def cleanup(
    model: ir.Model,
    original: Iterable[ir.Node] | None = None,
    *,
    target: str | None = None,
) -> None:
    """The passes :func:`rewrite` runs after the rules (the CLI runs them too).

    ``original``: the model's nodes before the rules ran, to tell those a rule emitted
    (:class:`~rnn_rewrite_rules.passes.UniqueRewrittenNodeNamesPass`). ``target``: what
    the result must run on (None: the default), for
    :class:`~rnn_rewrite_rules.passes.ForwardReverseNodesPass` (the rule-built reverse
    nodes it converts carry ``_rnn_ops.RULE_MADE``)."""
    original = None if original is None else weakref.WeakSet(original)
    ir.passes.PassManager(
        [
            RemoveDeadNodesPass(),
            # emitted reverse nodes a runtime of the target runs wrongly, made forward
            ForwardReverseNodesPass((target or DEFAULT_TARGET,)),
            # emitted LSTM/GRU nodes kept from batch 0, where ONNX Runtime aborts on them
            BatchZeroGuardPass(),
            RemoveUnusedSubgraphInitializersPass(),  # the main graph's go in the pass above
            common_passes.RemoveUnusedFunctionsPass(),
            common_passes.RemoveUnusedOpsetsPass(),
            # after every NameFixPass: unused RNN outputs named "" (see unused_outputs)
            EmptyUnusedRnnOutputsPass(),
            DeclaredOutputShapesPass(),  # outputs declared with sizes the prover refutes
            InitializerInfoFromTensorPass(),
            UniqueRewrittenNodeNamesPass(original),
        ]
    )(model)
