"""Why the rules leave an RNN alone, and where the shape prover loses the path to it.

For each RNN node of a model after the default rewrite:

* whether the rewrite changed anything around it (its outputs, or the ops within two
  hops of it), else it is *left alone*;
* the reasons the rules gave: a tracing pass (``onnxscript``'s ``MatchingTracer``, which
  changes nothing) over the rewritten model keeps every failed condition on a match that
  contains the RNN or lies within a few hops of it; reasons that only say there is
  nothing to do ("already minimal", "layout is already 0") are set apart;
* the hazards ``rnn-rewrite --check`` still finds on it;
* what :class:`~rnn_rewrite_rules.shape.ShapeProver` proves about its input ``X`` and
  initial states, and the nodes on the way there where the proof stops: an output of
  unknown rank from inputs of known rank, or a size the prover cannot relate to the
  inputs' (a fresh symbol).

Only the package's public names are used (``rewrite``, ``rules``, ``diagnostics``,
``rules.families``, ``shape.ShapeProver``), so this survives internal moves.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import re
from collections.abc import Iterable

import onnx_ir as ir
from onnxscript.rewriter import MatchingTracer, MatchStatus, RewriteRuleSet

import rnn_rewrite_rules
from rnn_rewrite_rules import diagnostics
from rnn_rewrite_rules.rules import families
from rnn_rewrite_rules.rules.loop_scan.guards import NOT_GUARDS
from rnn_rewrite_rules.shape import Dim, ShapeProver

__all__ = ["ModelAnalysis", "RnnAnalysis", "analyze", "rule_families"]

#: Reasons that say a rule has nothing to do here, not that something stopped it.
NOTHING_TO_DO = re.compile(
    r"already|node has \d+ outputs?, not \d+|the last output is used|the chain goes on|"
    r"neither starts at an RNN output nor feeds X|no input is a Split's output|"
    r"has no layout attribute|" + re.escape(NOT_GUARDS)
)
#: Families whose failures on ordinary nodes are not about an existing RNN node (they
#: look for unrolled recurrences among MatMuls and activations).
_SEARCHING = {"reroll"}
#: Hops from a failed match to the RNN it is about.
_HOPS = 3
#: Nodes visited upstream of an RNN's inputs (bounds the cost on big graphs).
_MAX_UPSTREAM = 400


@dataclasses.dataclass
class RnnAnalysis:
    name: str
    op_type: str
    direction: str
    left_alone: bool
    #: ``family/rule: reason`` that stopped a rule.
    blocked: list[str]
    #: ``family/rule: reason`` that only say there was nothing to do.
    nothing_to_do: list[str]
    #: ``kind: message`` of the hazards ``--check`` still finds.
    hazards: list[str]
    #: What the prover proves about X: its sizes, or why not.
    x_shape: str
    #: Op types on the path to X / the states where the proof stops, with counts.
    rank_lost_at: collections.Counter[str]
    sizes_lost_at: collections.Counter[str]
    #: Op types on that path the prover has no transfer function for (None: the prover's
    #: table was not found, it moved).
    not_followed: collections.Counter[str] | None


@dataclasses.dataclass
class ModelAnalysis:
    rnns: list[RnnAnalysis]
    #: Recurrences not written as RNN ops (Loop, Scan), by op type.
    loops: collections.Counter[str]


def rule_families() -> dict[str, str]:
    """Rule name -> family name for every rule."""
    return {rule.name: name for name, family in families().items() for rule in family.all_rules}


class _Recorder(MatchingTracer):
    """Keeps every failed condition (the base class keeps the best match per rule only)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[tuple[str, ir.Node, list[ir.Node], str]] = []

    def log(self, rule, container, node, match_result, status) -> None:
        if status in (MatchStatus.CONDITION_FAILED, MatchStatus.REPLACEMENT_FAILED):
            reason = " ".join(str(match_result.reason or "condition failed").split())
            nodes = [n for n in match_result.nodes if n is not None]
            self.failures.append((rule.name or repr(rule), node, nodes, reason))


def _near_rnns(nodes: Iterable[ir.Node]) -> list[ir.Node]:
    """The RNN nodes among ``nodes``, else the nearest ones up to :data:`_HOPS` away."""
    nodes = list(nodes)
    found = [n for n in nodes if diagnostics.is_rnn(n)]
    up = down = set(nodes)
    for _ in range(_HOPS):
        if found:
            return found
        up = {v.producer() for n in up for v in n.inputs if v is not None and v.producer()}
        down = {c for n in down for v in n.outputs for c in v.consumers()}
        found = [n for n in up | down if diagnostics.is_rnn(n)]
    return found


def _neighbourhood(node: ir.Node, hops: int = 2) -> tuple:
    """What a rewrite around ``node`` changes: its used outputs and the ops near it."""
    ops: collections.Counter[str] = collections.Counter()
    up = down = {node}
    for _ in range(hops):
        up = {v.producer() for n in up for v in n.inputs if v is not None and v.producer()}
        down = {c for n in down for v in n.outputs for c in v.consumers()}
        ops.update(f"<{n.op_type}" for n in up)
        ops.update(f">{n.op_type}" for n in down)
    used = tuple(bool(v.consumers()) or v.is_graph_output() for v in node.outputs)
    states = tuple(v is not None for v in node.inputs[5:])
    return used, states, tuple(sorted(ops.items()))


def _fresh(dim: Dim | None, value: ir.Value) -> bool:
    """``dim`` is a size the prover named after ``value`` itself (it lost the relation)."""
    symbol = dim.symbol if dim is not None else None
    return symbol is not None and symbol.value is value


def _upstream(rnn: ir.Node) -> list[ir.Node]:
    """Nodes computing X and the initial states (not the weights), nearest first."""
    starts = [rnn.inputs[i] for i in (0, 5, 6) if i < len(rnn.inputs)]
    seen: list[ir.Node] = []
    queue = [v.producer() for v in starts if v is not None and v.producer() is not None]
    while queue and len(seen) < _MAX_UPSTREAM:
        node = queue.pop(0)
        if node in seen:
            continue
        seen.append(node)
        queue.extend(v.producer() for v in node.inputs if v is not None and v.producer())
    return seen


def _losses(
    rnn: ir.Node, prover: ShapeProver
) -> tuple[collections.Counter[str], collections.Counter[str]]:
    rank_lost: collections.Counter[str] = collections.Counter()
    sizes_lost: collections.Counter[str] = collections.Counter()
    for node in _upstream(rnn):
        if node.op_type == "Constant" or not node.outputs:
            continue
        inputs = [v for v in node.inputs if v is not None]
        if any(prover.rank(v) is None for v in inputs):
            continue  # lost further up
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        out = node.outputs[0]
        dims = prover.dims(out)
        if dims is None:
            rank_lost[op] += 1
        elif any(_fresh(d, out) for d in dims):
            sizes_lost[op] += 1
    return rank_lost, sizes_lost


def _transfer_table() -> set[tuple[str, str]] | None:
    """(domain, op_type) the prover has a transfer function for, or None when the table
    is not where it was (``rnn_rewrite_rules.shape.ops.TRANSFER``)."""
    try:
        table = importlib.import_module("rnn_rewrite_rules.shape.ops").TRANSFER
    except (ImportError, AttributeError):
        return None
    return {(domain or "", op) for domain, op in table} | {("", "Constant"), ("", "If")}


def _not_followed(
    rnn: ir.Node, known: set[tuple[str, str]] | None
) -> collections.Counter[str] | None:
    if known is None:
        return None
    return collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        for n in _upstream(rnn)
        if ("" if n.domain == "ai.onnx" else n.domain, n.op_type) not in known
    )


def _x_shape(rnn: ir.Node, prover: ShapeProver) -> str:
    dims = prover.dims(rnn.inputs[0] if rnn.inputs else None)
    if dims is None:
        return "rank not proven"
    return "[" + ", ".join(str(d.value) if d.is_const else str(d) for d in dims) + "]"


def analyze(rewritten: ir.Model, original: ir.Model) -> ModelAnalysis:
    """The analysis of ``rewritten`` (the default rewrite of ``original``); neither changes."""
    by_family = rule_families()
    recorder = _Recorder()
    rule_set = rnn_rewrite_rules.rules()
    RewriteRuleSet(list(rule_set.rules)).apply_to_model(rewritten, tracer=recorder)
    reasons: dict[ir.Node, dict[str, None]] = collections.defaultdict(dict)
    for rule, root, nodes, reason in recorder.failures:
        family = by_family.get(rule, "?")
        if family in _SEARCHING and not any(diagnostics.is_rnn(n) for n in nodes):
            continue
        for rnn in _near_rnns([root, *nodes]):
            reasons[rnn][f"{family}/{rule}: {reason}"] = None
    before = {
        n.name: _neighbourhood(n) for n in original.graph.all_nodes() if diagnostics.is_rnn(n)
    }
    prover = ShapeProver()
    known = _transfer_table()
    result = []
    for node in rewritten.graph.all_nodes():
        if not diagnostics.is_rnn(node):
            continue
        found = list(reasons.get(node, {}))
        rank_lost, sizes_lost = _losses(node, prover)
        direction = node.attributes.get_string("direction", "forward")
        result.append(
            RnnAnalysis(
                name=node.name or "?",
                op_type=node.op_type,
                direction=direction,
                left_alone=before.get(node.name) == _neighbourhood(node),
                blocked=[r for r in found if not NOTHING_TO_DO.search(r.split(": ", 1)[1])],
                nothing_to_do=[r for r in found if NOTHING_TO_DO.search(r.split(": ", 1)[1])],
                hazards=[f"{h.kind}: {h.message}" for h in diagnostics.rnn_hazards(node)],
                x_shape=_x_shape(node, prover),
                rank_lost_at=rank_lost,
                sizes_lost_at=sizes_lost,
                not_followed=_not_followed(node, known),
            )
        )
    loops = collections.Counter(
        n.op_type for n in rewritten.graph.all_nodes() if n.op_type in ("Loop", "Scan")
    )
    return ModelAnalysis(result, loops)
