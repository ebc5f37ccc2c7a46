"""What a rewrite did: nodes by op type, rule firings, tensor bytes, and why RNNs were left
alone; and every line of text the command reports about it (:func:`report_lines`).

Firings are counted by :func:`rnn_rewrite_rules._api.apply_rounds`. Reasons come from a
tracing pass over the rewritten model: every condition that failed on a match near an RNN
node is reported for that node, with the reason the rule's check gave.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import onnx_ir as ir
from onnxscript.rewriter import (
    MatchStatus,
    RewriteRule,
)

from rnn_rewrite_rules import _compat, _save, _verify, costs, diagnostics
from rnn_rewrite_rules._api import Refused, rule_name
from rnn_rewrite_rules._refusal import Inapplicable
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules._rnn_ops import rnn_op_of_type
from rnn_rewrite_rules._size_plan import format_plan
from rnn_rewrite_rules._verify import VerifyResult
from rnn_rewrite_rules.diagnostics import describe_node, is_rnn
from rnn_rewrite_rules.rules import families, fixed_by
from rnn_rewrite_rules.rules.loop_scan.zero_step import is_zero_step_loop

if TYPE_CHECKING:
    from rnn_rewrite_rules.benchmark import BenchmarkResult
    from rnn_rewrite_rules.quantize import QuantizeResult

__all__ = [
    "NO_RECURRENCE",
    "ModelStats",
    "Report",
    "Unimproved",
    "format_report",
    "hazard_lines",
    "model_stats",
    "report_lines",
    "rule_description",
    "rule_families",
    "unimproved_rnns",
    "verify_lines",
]


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


@dataclasses.dataclass(frozen=True)
class ModelStats:
    op_counts: collections.Counter[str]
    tensor_bytes: int
    rnn_nodes: int
    #: ``Loop``\ s of zero-step guards (``loop_scan``): no recurrence, run at length 0 only.
    zero_step_loops: int = 0

    @property
    def nodes(self) -> int:
        return sum(self.op_counts.values())


def model_stats(model: ir.Model) -> ModelStats:
    """Node counts by op type (subgraphs included), tensor bytes and RNN node count."""
    nodes = list(model.graph.all_nodes())
    return ModelStats(
        collections.Counter(_op_name(n) for n in nodes),
        _save.tensor_bytes(model),
        sum(is_rnn(n) for n in nodes),
        sum(is_zero_step_loop(n) for n in nodes),
    )


def rule_families() -> dict[str, str]:
    """Rule name -> family name, for every available rule."""
    return {
        rule_name(rule): family.name for family in families().values() for rule in family.all_rules
    }


def _for_op(text: str, op_type: str, num_outputs: int) -> str:
    """A description written for a generic ``RNN(...)`` (LSTM's inputs and outputs) said
    for ``op_type`` with ``num_outputs`` outputs."""
    text = re.sub(r"\bRNN\(", f"{op_type}(", text)
    spec = rnn_op_of_type(op_type)
    if spec is None or not spec.cell_state:
        text = re.sub(r", initial_c=\w+", "", text).replace('(..., "", "")', '(..., "")')
        text = text.replace("(..., z, z)", "(..., z)")
    names = list(spec.outputs[:num_outputs]) if spec else []
    if "<unused Y_c>" in text and names:
        kept = ", ".join(names[:-1])
        unused = ", ".join([*names[:-1], f"<unused {names[-1]}>"])
        text = text.replace("(Y, Y_h, <unused Y_c>)", f"({unused})")
        text = text.replace("-> (Y, Y_h)", f"-> ({kept})")
    return text


def rule_description(rule: RewriteRule) -> str:
    """The first docstring paragraph of the rule's class (or replacement function) as one
    line, else "".

    Rules made per RNN op (named ``Class[OP]``) get the description for that op.
    """
    text = _docstring_line(rule)
    match = re.search(r"\[(\w+)\]$", rule_name(rule))
    spec = rnn_op_of_type(match[1]) if match else None
    return _for_op(text, spec.op_type, len(spec.outputs)) if spec else text


def _docstring_line(rule: RewriteRule) -> str:
    condition, replacement = _compat.rule_callables(rule)
    candidates: list[object] = [
        type(owner)
        for owner in (getattr(condition, "__self__", None), getattr(replacement, "__self__", None))
        if owner is not None
    ]
    candidates.append(replacement)
    for candidate in candidates:
        doc = getattr(candidate, "__doc__", None) if candidate is not None else None
        if doc and doc.strip():  # the first paragraph, which may wrap, as one line
            return " ".join(doc.strip().split("\n\n")[0].split())
    return ""


def _not_about_it(reason: object) -> bool:
    """A refusal that says nothing about the node near it (a rule made for another number
    of outputs, ``loop_scan``'s guard merge on a Concat of anything but guards): its kind,
    not its text."""
    return isinstance(reason, Inapplicable)


def _is_subject(node: ir.Node) -> bool:
    """What the report explains: an RNN node, or a Loop/Scan holding a recurrent cell."""
    return is_rnn(node) or diagnostics.is_recurrent_loop(node)


def _neighbour_rnns(nodes: Iterable[ir.Node], max_hops: int = 3) -> list[ir.Node]:
    """The RNN nodes a match is about: in it, else the nearest upstream, else downstream."""
    nodes = [n for n in nodes if n is not None]
    found = [n for n in nodes if _is_subject(n)]
    if found:
        return found
    upstream = downstream = set(nodes)
    for _ in range(max_hops):
        upstream = {p for n in upstream for v in n.inputs if v is not None and (p := v.producer())}
        found = [n for n in upstream if _is_subject(n)]
        if found:
            return found
        downstream = {c for n in downstream for v in n.outputs for c in v.consumers()}
        found = [n for n in downstream if _is_subject(n)]
        if found:
            return found
    return []


@dataclasses.dataclass(frozen=True)
class Unimproved:
    #: The RNN node, as :func:`~rnn_rewrite_rules.diagnostics.describe_node` names it.
    node: str
    #: Hazards still on the node, each ``kind: message``.
    hazards: tuple[str, ...]
    #: Why the rules written for those hazards did not remove them.
    reasons: tuple[str, ...]


def unimproved_rnns(
    model: ir.Model,
    rules: Sequence[RewriteRule],
    rule_families: Mapping[str, str],
    refusals: Sequence[Refused] = (),
) -> list[Unimproved]:
    """RNN nodes of ``model`` (already rewritten) that still carry a hazard a family targets.

    For each, the reasons are the failed conditions of that family's rules on matches near
    the node, from ``refusals``: the trace of the rewrite's last round (``apply_rounds``),
    which fired nothing, so the rules' verdicts on the model as it is. onnxscript does not
    record failures at a pattern's root op type, so "no rule matched" is said then.

    Args:
        rule_families: rule name -> family name, for every available rule.
    """
    subjects = [n for n in model.graph.all_nodes() if _is_subject(n)]
    remaining = {node: diagnostics.subject_hazards(node, model.graph) for node in subjects}
    fixers = fixed_by()
    remaining = {
        node: [h for h in hazards if h.kind in fixers] for node, hazards in remaining.items()
    }
    remaining = {node: hazards for node, hazards in remaining.items() if hazards}
    if not remaining:
        return []
    failures: dict[ir.Node, list[tuple[str, str]]] = collections.defaultdict(list)
    for rule, root, match, status in refusals:
        if _not_about_it(match.reason):
            continue
        default = "condition failed" if status == MatchStatus.CONDITION_FAILED else "no rewrite"
        reason = " ".join(str(match.reason or default).split())
        name = rule_name(rule)
        # a node the refusal names (a merge names the half it refused) before neighbours
        named = [n for n in match.failure_nodes_and_values if isinstance(n, ir.Node)]
        for rnn in _neighbour_rnns([root, *match.nodes, *named]):
            if (name, reason) not in failures[rnn]:
                failures[rnn].append((name, reason))
    selected = {rule_families.get(rule_name(rule)) for rule in rules}
    available = set(rule_families.values())
    result = []
    for node, hazards in remaining.items():
        reasons: list[str] = []
        facts = rnn_facts(node)
        if isinstance(facts, str) and is_rnn(node):
            reasons.append(f"static facts unknown: {facts}")
        for family in dict.fromkeys(f for h in hazards for f in fixers[h.kind]):
            found = [
                f"{family}/{name}: {reason}"
                for name, reason in failures[node]
                if rule_families.get(name) == family
            ]
            if found:
                reasons.extend(r for r in found if r not in reasons)
            elif family not in available:
                reasons.append(f"{family}: not available")
            elif family not in selected:
                reasons.append(f"{family}: not selected (--rules)")
            else:
                reasons.append(f"{family}: no rule matched around this node")
        merging = {rule for rule, family in rule_families.items() if family in fixers[_HALF]}
        reasons.extend(_partner_reasons(node, reasons, failures, merging))
        result.append(
            Unimproved(
                describe_node(node),
                tuple(f"{h.kind}: {h.message}" for h in hazards),
                tuple(reasons),
            )
        )
    return result


_HALF = "hand-built-direction"


def _partner_reasons(
    node: ir.Node,
    reasons: list[str],
    failures: Mapping[ir.Node, list[tuple[str, str]]],
    merging: set[str],
) -> list[str]:
    """For a hand-built forward half no rule matched from: why its reverse half was not
    merged (the merge rules match from the reverse half)."""
    partner = diagnostics.reverse_partner(node)
    if partner is None or any(not r.endswith("no rule matched around this node") for r in reasons):
        return []
    return [
        f"reverse half {describe_node(partner)}: {name}: {reason}"
        for name, reason in failures.get(partner, [])
        if name in merging
    ]


def _human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError


def format_report(
    before: ModelStats,
    after: ModelStats,
    fired: collections.Counter[str],
    unimproved: Sequence[Unimproved],
    *,
    rule_families: dict[str, str] | None = None,
    rules_used: int,
) -> list[str]:
    """The report as lines of text."""
    lines = [f"nodes: {before.nodes} -> {after.nodes}"]
    ops = sorted(
        set(before.op_counts) | set(after.op_counts), key=lambda o: (-before.op_counts[o], o)
    )
    if ops:
        width = max(len("op"), *(len(o) for o in ops))
        lines.append(f"  {'op':<{width}}  before  after")
        for op in ops:
            b, a = before.op_counts[op], after.op_counts[op]
            mark = "" if a == b else f"  {a - b:+d}"
            lines.append(f"  {op:<{width}}  {b:>6}  {a:>5}{mark}")
    if not rules_used:
        lines.append("rules fired: none (no rules available)")
    elif not fired:
        lines.append(f"rules fired: none of {rules_used}")
    else:
        lines.append(
            f"rules fired ({sum(fired.values())} rewrites, {len(fired)} of {rules_used} rules):"
        )
        families = rule_families or {}
        labels = {name: f"{families[name]}/{name}" if name in families else name for name in fired}
        width = max(len(label) for label in labels.values())
        for name, count in sorted(fired.items(), key=lambda item: (-item[1], item[0])):
            lines.append(f"  {labels[name]:<{width}}  {count}")
    lines.append(
        f"initializer bytes: {before.tensor_bytes:,} -> {after.tensor_bytes:,} "
        f"({_human_bytes(before.tensor_bytes)} -> {_human_bytes(after.tensor_bytes)})"
    )
    if after.zero_step_loops:
        lines.append(
            f"zero-step guards: {after.zero_step_loops} Loop (in the If branch taken where X"
            " is empty: holds no cell, passes the initial state through)"
        )
    loops = [item for item in unimproved if item.node.startswith(("Loop", "Scan"))]
    rnns = [item for item in unimproved if item not in loops]
    for items, header in (
        (rnns, f"RNN nodes not improved ({len(rnns)} of {after.rnn_nodes}):"),
        (loops, f"Loop/Scan recurrences not rewritten ({len(loops)}):"),
    ):
        if items:
            lines.append(header)
        for item in items:
            lines.append(f"  {item.node}")
            lines.extend(f"    still: {hazard}" for hazard in item.hazards)
            lines.extend(f"    why: {reason}" for reason in item.reasons)
    return lines


@dataclasses.dataclass
class Report:
    """What :func:`rnn_rewrite_rules.rewrite_file` did."""

    source: Path
    #: None when nothing was to be written.
    target: Path | None
    before: ModelStats
    after: ModelStats
    #: Rule name -> rewrites.
    fired: collections.Counter[str]
    unimproved: list[Unimproved]
    rules_used: int
    hazards_before: list[diagnostics.Hazard] | None = None
    hazards_after: list[diagnostics.Hazard] | None = None
    verify: _verify.VerifyResult | None = None
    written: bool = False
    #: Things the caller should hear about that did not stop the rewrite.
    warnings: list[str] = dataclasses.field(default_factory=list)
    #: Recurrences a rule proved but left unrolled for the target, and why.
    kept_unrolled: list[costs.Declined] = dataclasses.field(default_factory=list)
    #: ``quantize="int8"``: what ONNX Runtime's quantizer did (its ``model`` is not kept).
    quantized: QuantizeResult | None = None
    #: ``benchmark=True``: the original and the result timed side by side.
    benchmark: BenchmarkResult | None = None

    @property
    def found_no_recurrence(self) -> bool:
        """No RNN, LSTM or GRU node before the rewrite, no rule made one, no recurrent
        Loop/Scan was left alone and no recurrence was left unrolled on purpose."""
        return (
            not self.fired
            and self.before.rnn_nodes == 0
            and not self.unimproved
            and not self.kept_unrolled
        )

    def lines(self, *, header: bool = True) -> list[str]:
        """The report as text (:func:`report_lines`)."""
        return report_lines(self, header=header)


#: What the report says of a model the rules found nothing in.
NO_RECURRENCE = (
    "no RNN, LSTM or GRU node and no recurrence the rules recognize (unrolled steps, cell "
    "loops): nothing to rewrite"
)


def report_lines(report: Report, *, header: bool = True) -> list[str]:
    """What :func:`rnn_rewrite_rules.rewrite_file` did, as text: the header, node counts,
    rules fired, hazards and the verification."""
    out = []
    if header:
        out.append(
            f"{report.source} -> {report.target}"
            if report.target
            else f"{report.source}: nothing written"
        )
    out += format_report(
        report.before,
        report.after,
        report.fired,
        report.unimproved,
        rule_families=rule_families(),
        rules_used=report.rules_used,
    )
    if report.found_no_recurrence:
        out.append(NO_RECURRENCE)
    out += kept_unrolled_lines(report.kept_unrolled)
    if report.hazards_before is not None:
        out += hazard_lines(report.hazards_before, report.hazards_after or [])
    if report.quantized is not None:
        out += quantize_lines(report.quantized)
    if report.verify is not None:
        out += verify_lines(report.verify)
    if report.benchmark is not None:
        out += benchmark_lines(report.benchmark)
    return out


def kept_unrolled_lines(declined: Sequence[costs.Declined]) -> list[str]:
    """The recurrences left unrolled for the target, grouped by reason."""
    if not declined:
        return []
    by_reason = collections.Counter(d.reason for d in declined)
    count = len(declined)
    out = [f"recurrences kept unrolled ({count}):"]
    out += [f"  {n} x {reason}" if n > 1 else f"  {reason}" for reason, n in by_reason.items()]
    return out


def quantize_lines(result: QuantizeResult) -> list[str]:
    """What ``--quantize int8`` converted, the size, and what stays float."""
    done = ", ".join(f"{n} {op}" for op, n in result.quantized.items()) or "nothing"
    out = [
        f"quantize int8 (onnxruntime quantize_dynamic): {done}; "
        f"{_human_bytes(result.bytes_before)} -> {_human_bytes(result.bytes_after)}"
    ]
    out += [f"  {n} {op} stay float: {why}" for op, (n, why) in result.left_float.items()]
    return out


#: The last line of ``--benchmark``'s report, by verdict.
_BENCHMARK_VERDICTS = {
    "slower": "benchmark: the result is SLOWER than the original beyond noise",
    "faster": "benchmark: the result is faster than the original beyond noise",
    "no slower": "benchmark: the result is faster than the original beyond noise in some "
    "lines and within noise in the others",
    "noise": "benchmark: no difference beyond noise",
    "untimed": "benchmark: nothing was timed",
}


def benchmark_lines(result: BenchmarkResult) -> list[str]:
    """``--benchmark``'s ratios (result / original; below 1: faster), each with its interval
    and the repeats it took, and the verdict."""
    from rnn_rewrite_rules.benchmark import CONFIDENCE

    out = [
        f"benchmark: one thread, repeats of {result.rounds} interleaved rounds, ratio = "
        f"result / original (median over repeats, {CONFIDENCE:.0%} interval; within "
        f"{costs.NOISE:.0%} of 1 is noise; more repeats while the interval crosses that band)"
    ]
    out += [f"  note: {note}" for note in result.notes]
    for name, (before, after) in result.sessions.items():
        out.append(
            f"  {name} session creation: {before * 1e3:.1f} ms -> {after * 1e3:.1f} ms "
            f"({after / before:.2f}x)"
        )
    for t in result.latencies:
        judged = "" if result.is_judged(t.runtime) else " (not judged for this target)"
        spread = "" if t.interval else " range"
        out.append(
            f"  {t.runtime} latency at {t.sizes}: {t.original_s * 1e6:.1f} us -> "
            f"{t.result_s * 1e6:.1f} us, {t.ratio:.2f}x ({t.low:.2f}-{t.high:.2f}{spread}, "
            f"{t.repeats} repeats): {_LATENCY_VERDICTS[t.verdict]}{judged}"
        )
    for st in result.streaming:
        out.append(
            f"  {st.runtime} streaming ({st.states}; {st.frames} calls chained): "
            f"{st.original_fps:.0f} -> {st.result_fps:.0f} frames/s, {st.ratio:.2f}x "
            f"(rounds {st.low:.2f}-{st.high:.2f}; shown, not judged)"
        )
    out += [f"  {name}: not timed: {why}" for name, why in result.skipped.items()]
    out.append(_BENCHMARK_VERDICTS[result.verdict])
    return out


_LATENCY_VERDICTS = {"slower": "SLOWER", "faster": "faster", "noise": "no difference beyond noise"}


def hazard_lines(
    before: Sequence[diagnostics.Hazard], after: Sequence[diagnostics.Hazard]
) -> list[str]:
    """``--check``: the hazards found before the rewrite, and those left after it."""
    if not before:
        return ["hazards: none found"]
    lines = [f"hazards ({len(before)}):"]
    lines += [f"  {hazard}" for hazard in before]
    kinds = {kind: sum(h.kind == kind for h in after) for kind in diagnostics.KINDS}
    remaining = ", ".join(f"{kind} x{count}" for kind, count in kinds.items() if count)
    lines.append(f"after the rewrite: {len(after)} remain" + (f" ({remaining})" if after else ""))
    # the RNN hazards rules target are listed with their reasons under "RNN nodes not improved"
    lines += [f"  {hazard}" for hazard in after if hazard.kind not in fixed_by()]
    return lines + _rerolled_axis_lines(before, after)


def _rerolled_axis_lines(
    before: Sequence[diagnostics.Hazard], after: Sequence[diagnostics.Hazard]
) -> list[str]:
    """Unrolled axes the rewrite re-rolled: no frozen-axis hazard names them after it."""
    frozen_after = [h for h in after if h.kind == "frozen-axis"]
    names = dict.fromkeys(h.unrolled for h in before if h.unrolled is not None)
    return [
        f"  now truly dynamic: {name!r} (the per-step reads were re-rolled into one recurrent node)"
        for name in names
        if not any(h.unrolled == name or repr(name) in h.message for h in frozen_after)
    ]


def verify_lines(result: VerifyResult) -> list[str]:
    """What ``--verify`` compared and found."""
    runs = f"{len(result.runs)} run" + ("" if len(result.runs) == 1 else "s")
    out = [f"verify: {runs}, seed {result.seed}, tolerance {result.tolerance:g}"]
    out += [f"  note: {note}" for note in result.notes]
    for index, plan in enumerate(result.runs, 1):
        out.append(f"  run {index}: {format_plan(plan)}")
    if result.max_diff:
        out.append(f"  max abs diff per output ({result.reference} reference):")
        width = max(len(name) for name in result.max_diff)
        for name, diff in result.max_diff.items():
            flag = "" if diff <= result.tolerance else "  > tolerance"
            out.append(f"    {name:<{width}}  {diff:.3g}{flag}")
    if result.failure:
        out.append(f"verify: FAILED: {result.failure}")
    elif not result.ok:
        out.append(
            f"verify: FAILED: max abs diff {result.worst:.3g} > tolerance {result.tolerance:g}"
        )
    else:
        out.append("verify: OK")
    return out
