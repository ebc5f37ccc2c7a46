"""Which kernel-changing rewrites are no slower, per target, from a measured table.

``measured.json`` beside this module is written by ``python -m benchmarks.cost_grid`` (one
command, on the benchmark machine; the versions it ran are in the file). Each point is one
rewrite's latency ratio (rewritten / original, best of interleaved rounds, ONNX Runtime or
OpenVINO at one thread) for one op, form of the initial state, direction, hidden size,
sequence length and batch, with the spread of that ratio over repeats.

A point is *no slower* when its ratio is at most 1, or at most ``1 + NOISE`` with a repeat
at or below 1 (the difference is inside the measurement's own noise). Between measured
sizes the decision is conservative: the rewrite fires only when every measured corner
around the size (the measured hidden sizes, sequence lengths and batches just below and
just above it) is no slower on every runtime of the target; outside the measured range the
nearest measured size stands in; a symbolic batch needs every measured batch.

Targets and the runtimes they are checked on: ``onnxruntime``: ONNX Runtime with default
optimizations and with ``ORT_DISABLE_ALL``; ``portable``: those and OpenVINO (where the
table has OpenVINO points).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import itertools
import json
import pathlib
from collections.abc import Iterator, Mapping, Sequence

import onnx_ir as ir

__all__ = [
    "NOISE",
    "RUNTIMES",
    "TIMED_RUNTIMES",
    "Context",
    "CostTable",
    "Decision",
    "Declined",
    "Point",
    "attached",
    "load",
    "no_slower",
    "of",
    "slower",
]

#: A ratio up to 1 + NOISE with a repeat at or below 1 is noise, not a slowdown.
NOISE = 0.05
#: Runtime key -> how users and the reasons name it.
RUNTIMES: dict[str, str] = {
    "ort": "ONNX Runtime",
    "ort_noopt": "ONNX Runtime (ORT_DISABLE_ALL)",
    "openvino": "OpenVINO",
}
#: Target -> the timed runtimes a rewrite must be no slower on (which runtimes its output
#: must run on at all: ``rules._kernels.TARGET_RUNTIMES``).
TIMED_RUNTIMES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("ort", "ort_noopt"),
    "portable": ("ort", "ort_noopt", "openvino"),
}
#: Forms of the rewritten node's initial state: ``none`` (dropped, ONNX's zeros) or
#: ``zeros`` (an explicit shared zero state, what ``portable`` needs for a symbolic batch).
FORMS = ("none", "zeros")
_PATH = pathlib.Path(__file__).with_name("measured.json")
#: Forms measured by a grid of their own, not by ``benchmarks.cost_grid``: form -> the
#: command that writes ``<form>.json`` beside this module. ``batch_first``: the re-rolled
#: node between the two ``Transpose``s a batch-first cell loop needs, against the steps.
FORM_TABLES: dict[str, str] = {"batch_first": "python -m benchmarks.batch_first_costs"}


def slower(ratio: float, low: float) -> bool:
    """A ratio (rewritten / original, best of rounds) is a slowdown beyond noise: above
    ``1 + NOISE``, or above 1 with every repeat's ratio (lowest: ``low``) above 1."""
    return ratio > 1.0 + NOISE or (ratio > 1.0 and low > 1.0)


@dataclasses.dataclass(frozen=True)
class Point:
    """One measured ratio."""

    runtime: str
    op: str
    form: str
    direction: str
    hidden: int
    seq: int
    batch: int
    #: best rewritten / best original over all rounds
    ratio: float
    #: lowest and highest per-repeat ratio (the spread)
    low: float
    high: float
    #: every independent run's ratio, where the table is their median
    ratios: tuple[float, ...] = ()

    @property
    def no_slower(self) -> bool:
        return not slower(self.ratio, self.low)


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether a rewrite fires, and why (the reason a declining rule reports)."""

    fires: bool
    reason: str

    def __iter__(self) -> Iterator[bool | str]:  # ``fires, reason = no_slower(...)``
        return iter((self.fires, self.reason))


class CostTable:
    """The measured points, indexed for :meth:`decide`."""

    def __init__(self, points: Sequence[Point], versions: Mapping[str, str]) -> None:
        self.points = tuple(points)
        self.versions = dict(versions)
        self._index = {
            (p.runtime, p.op, p.form, p.direction, p.hidden, p.seq, p.batch): p for p in points
        }

    @classmethod
    def from_json(cls, data: Mapping) -> CostTable:
        points = [Point(**{**p, "ratios": tuple(p.get("ratios", ()))}) for p in data["points"]]
        return cls(points, data.get("versions", {}))

    def runtimes(self) -> set[str]:
        return {p.runtime for p in self.points}

    def _axis(self, op: str, form: str, direction: str, axis: str) -> list[int]:
        return sorted(
            {
                getattr(p, axis)
                for p in self.points
                if (p.op, p.form, p.direction) == (op, form, direction)
            }
        )

    def decide(
        self,
        target: str,
        op: str,
        hidden: int,
        seq: int,
        batch: int | None,
        direction: str = "forward",
        form: str = "none",
    ) -> Decision:
        """Whether rewriting into ``op`` (form ``form``) is no slower on ``target``."""
        if target not in TIMED_RUNTIMES:
            raise ValueError(f"unknown target {target!r}")
        direction = "forward" if direction == "reverse" else direction
        kernel = f"{op} kernel"
        hiddens = self._axis(op, form, direction, "hidden")
        seqs = self._axis(op, form, direction, "seq")
        batches = self._axis(op, form, direction, "batch")
        if not (hiddens and seqs and batches):
            return Decision(False, f"no measurement of the {direction} {op} kernel ({form} state)")
        corners = itertools.product(
            _around(hiddens, hidden),
            _around(seqs, seq),
            batches if batch is None else _around(batches, batch),
        )
        runtimes = [r for r in TIMED_RUNTIMES[target] if r in self.runtimes()]
        worst: Point | None = None
        for h, s, b in corners:
            for runtime in runtimes:
                point = self._index.get((runtime, op, form, direction, h, s, b))
                if point is None:
                    return Decision(
                        False,
                        f"{RUNTIMES[runtime]}'s {kernel} not measured at hidden {h}, seq {s}, "
                        f"batch {b}",
                    )
                if not point.no_slower and (worst is None or point.ratio > worst.ratio):
                    worst = point
        if worst is not None:
            return Decision(
                False,
                f"{RUNTIMES[worst.runtime]}'s {kernel} is slower at hidden {worst.hidden}, "
                f"seq {worst.seq} ({worst.ratio:.2f}x at batch {worst.batch})",
            )
        return Decision(True, f"no slower on {', '.join(RUNTIMES[r] for r in runtimes)}")


def _around(measured: list[int], value: int) -> list[int]:
    """The measured sizes just below and just above ``value`` (the nearest one outside)."""
    if value <= measured[0]:
        return [measured[0]]
    if value >= measured[-1]:
        return [measured[-1]]
    i = bisect.bisect_left(measured, value)
    return [measured[i]] if measured[i] == value else [measured[i - 1], measured[i]]


@functools.cache
def load(path: str | None = None) -> CostTable:
    """The checked-in table (or the one at ``path``)."""
    data = json.loads(pathlib.Path(path or _PATH).read_text())
    return CostTable.from_json(data)


@dataclasses.dataclass(frozen=True)
class Declined:
    """A proven rewrite a rule left undone for its target (cost, or a runtime's limits)."""

    rule: str
    node: str
    reason: str


@dataclasses.dataclass
class Context:
    """One rewrite's cost state, made by its caller and read by the rules' checks: the
    table they decide on (None: the checked-in ones), whether the cost model is ignored
    (every rewrite no slower: what the grids need to measure), and the trace of rewrites
    declined (each once), what the report reads."""

    table: CostTable | None = None
    ignore: bool = False
    declined: list[Declined] = dataclasses.field(default_factory=list)

    def no_slower(
        self,
        target: str,
        op: str,
        hidden: int,
        seq: int,
        batch: int | None,
        direction: str = "forward",
        form: str = "none",
    ) -> Decision:
        """:func:`no_slower` on this context's table (always, when the model is ignored)."""
        if self.ignore:
            return Decision(True, "cost model ignored")
        return no_slower(target, op, hidden, seq, batch, direction, form, table=self.table)

    def decline(self, rule: str, node: str, reason: str) -> None:
        """Note a declined rewrite (once)."""
        entry = Declined(rule, node, reason)
        if entry not in self.declined:
            self.declined.append(entry)


#: Where a rewrite's :class:`Context` is kept on the model it rewrites (``ir.Model.meta``).
_META_KEY = "rnn_rewrite_rules.costs.Context"


@contextlib.contextmanager
def attached(model: ir.Model, context: Context) -> Iterator[Context]:
    """Inside, the rules rewriting ``model`` read ``context`` (:func:`of`); removed after."""
    previous = model.meta.get(_META_KEY)
    model.meta[_META_KEY] = context
    try:
        yield context
    finally:
        if previous is None:
            model.meta.pop(_META_KEY, None)
        else:
            model.meta[_META_KEY] = previous


def of(model: ir.Model) -> Context:
    """The context attached to ``model`` by the rewrite running on it; a default one (the
    checked-in tables, nothing recorded) when the rules are applied without one."""
    context = model.meta.get(_META_KEY)
    return context if isinstance(context, Context) else Context()


def no_slower(
    target: str,
    op: str,
    hidden: int,
    seq: int,
    batch: int | None,
    direction: str = "forward",
    form: str = "none",
    *,
    table: CostTable | None = None,
) -> Decision:
    """:meth:`CostTable.decide` on ``table``, by default the checked-in table (a form of
    :data:`FORM_TABLES`: on its own table); ``batch`` None is a symbolic batch (every
    measured batch must agree)."""
    if table is None:
        table = load(str(_PATH.with_name(f"{form}.json"))) if form in FORM_TABLES else load()
    return table.decide(target, op, hidden, seq, batch, direction, form)
