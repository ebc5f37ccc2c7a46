"""Which kernel-changing rewrites are no slower, per target, from a measured table.

``measured.json`` beside this module is written by ``python -m benchmarks.cost_grid`` (the
one-layer builders) and ``python -m benchmarks.export_costs`` (torch's own exports), on the
benchmark machine; the versions they ran are in the file. Each point is one
rewrite's latency ratio (rewritten / original, best of interleaved rounds, ONNX Runtime or
OpenVINO at one thread) for one op, form of the initial state, direction, hidden size,
sequence length and batch, with the spread of that ratio over repeats.

A point's spread is the range of its repeats' ratios once glitches are dropped: a repeat
is a glitch when its modified z-score (0.6745 |r - median| / MAD over the repeats) is above
:data:`GLITCH` (3.5), the MAD floored at 2% of the median, so a repeat within about 10% of
the median of tight repeats is never dropped; with fewer than 5 repeats none is. Where the
table is the median of independent runs, their ratios join the spread; a point measured
before issue 41 kept only its lowest and highest repeat, glitches included, so its spread
is its runs' ratios alone (or that lowest and highest, where it had one run). A point
is *slower* when its ratio is above ``1 + NOISE``, or above 1 with its whole spread above
1; *clear* when its ratio and whole spread are at or below 1; else *within noise*. For the
one-step forms (:data:`PARITY_FORMS`: one streaming step as one node) parity within noise
counts as no slower, as issue 42 asks: a point is slower there only when its ratio is
above ``1 + NOISE``.
A measured cell (hidden, seq, batch) takes the worst of its points over the target's
runtimes and every model measured there (the one-layer builders and torch's own exports,
``Point.model``). A runtime of the target with points in the table but none at a cell
refuses the rewrite there; the reason names a slower runtime first, where one is.

A cell fires when no point is slower there and, where one is within noise, no neighbouring
cell (the next measured size along one axis) is slower: at a boundary only a clear cell
fires. Between measured sizes the rewrite fires only when every measured cell around the
size (the measured hidden sizes, sequence lengths and batches just below and just above
it) fires, so where two neighbours disagree nothing between them fires; outside the
measured range the nearest measured size stands in; a symbolic batch needs every measured
batch. The reason names the model's own sizes and the measured cells it relied on.

Targets and the runtimes they are checked on: ``onnxruntime``: ONNX Runtime with default
optimizations and with ``ORT_DISABLE_ALL``; ``portable``: those, OpenVINO and tract (each
where the table has its points: only the one-step table, ``one_step.json``, has tract's).
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
    "GLITCH",
    "NOISE",
    "RUNTIMES",
    "TIMED_RUNTIMES",
    "Context",
    "CostTable",
    "Decision",
    "Declined",
    "Point",
    "attached",
    "glitches",
    "load",
    "median_kept",
    "no_slower",
    "of",
    "slower",
]

#: A ratio up to 1 + NOISE with a repeat at or below 1 is noise, not a slowdown.
NOISE = 0.05
#: A repeat is a glitch when its modified z-score (0.6745 |r - median| / MAD) is above this.
GLITCH = 3.5
#: Fewer repeats than this: none is dropped (a robust centre needs a few).
GLITCH_MIN_REPEATS = 5
#: The MAD is floored at this fraction of the median.
MAD_FLOOR = 0.02
#: Runtime key -> how users and the reasons name it.
RUNTIMES: dict[str, str] = {
    "ort": "ONNX Runtime",
    "ort_noopt": "ONNX Runtime (ORT_DISABLE_ALL)",
    "openvino": "OpenVINO",
    "tract": "tract",
}
#: Target -> the timed runtimes a rewrite must be no slower on (which runtimes its output
#: must run on at all: ``rules._kernels.TARGET_RUNTIMES``).
TIMED_RUNTIMES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("ort", "ort_noopt"),
    "portable": ("ort", "ort_noopt", "openvino", "tract"),
}
#: Forms of the rewritten node's initial state: ``none`` (dropped, ONNX's zeros) or
#: ``zeros`` (an explicit shared zero state, what ``portable`` needs for a symbolic batch).
FORMS = ("none", "zeros")
_PATH = pathlib.Path(__file__).with_name("measured.json")
#: Forms measured by a grid of their own, not by ``benchmarks.cost_grid``: form -> the
#: command that writes ``<form>.json`` beside this module. ``batch_first``: the re-rolled
#: node between the two ``Transpose``s a batch-first cell loop needs, against the steps.
#: ``exact_zero_step``: jax2onnx's scan Loops against their exact zero-step guard (the
#: committed files themselves, lengths 0 to 64: ``loop_scan.exact_cost``).
#: ``exact_broadcast``: jax2onnx's scan Loops whose initial states' batch is not proven
#: ``X``'s against their exact guard and the broadcast (the committed files).
#: Forms where parity within :data:`NOISE` counts as no slower, whatever the spread: one
#: streaming step as one node (issue 42), where a call is mostly the runtime's per-call
#: overhead and the gain is the node count, the other runtimes and int8.
PARITY_FORMS = frozenset({"one_step", "one_step_guarded", "one_step_broadcast"})
FORM_TABLES: dict[str, str] = {
    "batch_first": "python -m benchmarks.batch_first_costs",
    "seq1_chain": "python -m benchmarks.seq1_chain_costs",
    "one_step": "python -m benchmarks.one_step_costs",
    "one_step_guarded": "python -m benchmarks.one_step_costs",
    "one_step_broadcast": "python -m benchmarks.one_step_costs",
    "exact_zero_step": "python -m benchmarks.exact_zero_step_costs",
    "exact_broadcast": "python -m benchmarks.exact_zero_step_costs --broadcast",
}


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
    #: what was timed: ``builder`` (``testing.unrolled``) or a real export (``torch_dynamo 2L bf``)
    model: str = "builder"
    #: every repeat's ratio (a table before issue 41 kept only ``low`` and ``high``)
    repeats: tuple[float, ...] = ()
    #: the original's best seconds per call, in microseconds (0: not recorded)
    original_us: float = 0.0
    #: the date it was measured, where not the table's (a point merged in later)
    measured: str = ""

    @property
    def kept(self) -> tuple[float, ...]:
        """The repeats' ratios, glitches dropped (:func:`glitches`)."""
        dropped = glitches(self.repeats)
        return tuple(r for i, r in enumerate(self.repeats) if i not in dropped)

    @property
    def spread(self) -> tuple[float, float]:
        """Lowest and highest ratio of the repeats kept and of the independent runs (a point
        measured before issue 41 kept no repeats: its runs' ratios, else ``low``, ``high``)."""
        values = list(self.kept) + list(self.ratios if len(self.ratios) > 1 else ())
        return (min(values), max(values)) if values else (self.low, self.high)

    @property
    def no_slower(self) -> bool:
        if self.form in PARITY_FORMS:
            return self.ratio <= 1.0 + NOISE
        return not slower(self.ratio, self.spread[0])

    @property
    def clear(self) -> bool:
        """The whole spread is at or below 1."""
        return self.ratio <= 1.0 and self.spread[1] <= 1.0

    def describe(self) -> str:
        low, high = self.spread
        model = "" if self.model == "builder" else f", {self.model}"
        return f"{self.ratio:.2f}x [{low:.2f}-{high:.2f}]{model}"


def glitches(repeats: Sequence[float]) -> set[int]:
    """Indices of repeats far outside the others: modified z-score above :data:`GLITCH`."""
    if len(repeats) < GLITCH_MIN_REPEATS:
        return set()
    values = sorted(repeats)
    median = _median(values)
    mad = max(_median(sorted(abs(r - median) for r in repeats)), MAD_FLOOR * abs(median))
    if mad == 0:
        return set()
    return {i for i, r in enumerate(repeats) if 0.6745 * abs(r - median) / mad > GLITCH}


def median_kept(repeats: Sequence[float]) -> float:
    """The median of ``repeats`` once glitches are dropped."""
    dropped = glitches(repeats)
    return _median(sorted(r for i, r in enumerate(repeats) if i not in dropped))


def _median(ordered: Sequence[float]) -> float:
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether a rewrite fires, and why (the reason a declining rule reports)."""

    fires: bool
    reason: str

    def __iter__(self) -> Iterator[bool | str]:  # ``fires, reason = no_slower(...)``
        return iter((self.fires, self.reason))


Cell = tuple[int, int, int]  # hidden, seq, batch


@dataclasses.dataclass(frozen=True)
class _Verdict:
    """A measured cell on one target: its worst point over the runtimes measured there,
    whether it is slower or clear, and which runtime of the target was not measured."""

    cell: Cell
    worst: Point | None  # None: no runtime of the target measured there
    missing: str = ""

    @property
    def slower(self) -> bool:
        return self.worst is not None and not self.worst.no_slower

    @property
    def clear(self) -> bool:
        return not self.missing and self.worst is not None and self.worst.clear


class CostTable:
    """The measured points, indexed for :meth:`decide`."""

    def __init__(self, points: Sequence[Point], versions: Mapping[str, str]) -> None:
        self.points = tuple(points)
        self.versions = dict(versions)
        #: (runtime, op, form, direction, hidden, seq, batch) -> the builder's point (or
        #: the only model's)
        self._index: dict[tuple, Point] = {}
        #: the same key -> every model's point
        self._models: dict[tuple, list[Point]] = {}
        for p in points:
            key = (p.runtime, p.op, p.form, p.direction, p.hidden, p.seq, p.batch)
            self._models.setdefault(key, []).append(p)
            if p.model == "builder" or key not in self._index:
                self._index[key] = p

    @classmethod
    def from_json(cls, data: Mapping) -> CostTable:
        points = [
            Point(
                **{
                    **p,
                    "ratios": tuple(p.get("ratios", ())),
                    "repeats": tuple(p.get("repeats", ())),
                }
            )
            for p in data["points"]
        ]
        return cls(points, data.get("versions", {}))

    def runtimes(self) -> set[str]:
        return {p.runtime for p in self.points}

    def lengths(self, op: str, form: str, direction: str = "forward") -> list[int]:
        """The sequence lengths measured for ``op`` in ``form``, ascending."""
        return self._axis(op, form, direction, "seq")

    def _axis(self, op: str, form: str, direction: str, axis: str) -> list[int]:
        return sorted(
            {
                getattr(p, axis)
                for p in self.points
                if (p.op, p.form, p.direction) == (op, form, direction)
            }
        )

    def _verdict(
        self, runtimes: Sequence[str], op: str, form: str, direction: str, cell: Cell
    ) -> _Verdict:
        worst: Point | None = None
        missing = ""
        for runtime in runtimes:
            found = self._models.get((runtime, op, form, direction, *cell), [])
            if not found and not missing:
                h, s, b = cell
                missing = (
                    f"{RUNTIMES[runtime]}'s {op} kernel not measured at hidden {h}, seq {s}, "
                    f"batch {b}"
                )
            for point in found:
                if worst is None or _rank(point) > _rank(worst):
                    worst = point
        return _Verdict(cell, worst, missing)

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
        sizes = f"hidden {hidden}, seq {seq}, batch {'symbolic' if batch is None else batch}"
        axes = [self._axis(op, form, direction, a) for a in ("hidden", "seq", "batch")]
        if not all(axes):
            return Decision(
                False, f"{sizes}: no measurement of the {direction} {op} kernel ({form} state)"
            )
        hiddens, seqs, batches = axes
        around = [
            _around(hiddens, hidden),
            _around(seqs, seq),
            batches if batch is None else _around(batches, batch),
        ]
        relied = "measured " + ", ".join(
            f"{name} {'/'.join(map(str, values))}"
            for name, values in zip(("hidden", "seq", "batch"), around, strict=True)
        )
        runtimes = [r for r in TIMED_RUNTIMES[target] if r in self.runtimes()]

        def verdict(cell: Cell) -> _Verdict:
            return self._verdict(runtimes, op, form, direction, cell)

        verdicts = [verdict(cell) for cell in itertools.product(around[0], around[1], around[2])]
        slow = [v for v in verdicts if v.slower]
        if slow:  # the most telling reason first, whether or not a runtime is missing
            worst = max(slow, key=lambda v: _rank(v.worst))
            return Decision(False, f"{sizes}: {_slower_text(op, worst)} ({relied})")
        for v in verdicts:
            if v.missing:
                return Decision(False, f"{sizes}: {v.missing}")
        for v in verdicts:
            point = v.worst  # never None here: a cell without points is missing one
            if v.clear or point is None:
                continue
            for cell in _neighbours(axes, v.cell):
                near = verdict(cell)
                if near.slower:
                    return Decision(
                        False,
                        f"{sizes}: {RUNTIMES[point.runtime]}'s {op} kernel is within noise at "
                        f"{_cell_text(v.cell)} ({point.describe()}), next to "
                        f"{_slower_text(op, near)} ({relied})",
                    )
        names = ", ".join(RUNTIMES[r] for r in runtimes)
        return Decision(True, f"{sizes}: no slower on {names} ({relied})")


def _rank(point: Point | None) -> tuple[int, float]:
    """Worse first: slower, then within noise, then clear; then the higher ratio."""
    if point is None:
        return (3, 0.0)
    return (2 if not point.no_slower else 0 if point.clear else 1, point.ratio)


def _cell_text(cell: Cell) -> str:
    return "hidden {}, seq {}, batch {}".format(*cell)


def _slower_text(op: str, v: _Verdict) -> str:
    assert v.worst is not None
    where = _cell_text(v.cell)
    return f"{RUNTIMES[v.worst.runtime]}'s {op} kernel is slower at {where} ({v.worst.describe()})"


def _neighbours(axes: Sequence[list[int]], cell: Cell) -> Iterator[Cell]:
    """The measured cells next to ``cell``: one step along one axis."""
    for axis, values in enumerate(axes):
        i = values.index(cell[axis])
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                near = list(cell)
                near[axis] = values[j]
                yield (near[0], near[1], near[2])


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

    def table_for(self, form: str) -> CostTable:
        """The table decisions on ``form`` read: this context's, else the checked-in one."""
        return self.table if self.table is not None else _checked_in(form)

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
        table = _checked_in(form)
    return table.decide(target, op, hidden, seq, batch, direction, form)


def _checked_in(form: str) -> CostTable:
    """The checked-in table of ``form``: its own (:data:`FORM_TABLES`), else the main one."""
    return load(str(_PATH.with_name(f"{form}.json"))) if form in FORM_TABLES else load()
