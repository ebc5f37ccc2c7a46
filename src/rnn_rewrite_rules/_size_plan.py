"""The input sizes a model is run at: one plan for ``--verify``, ``--benchmark`` and
``--quantize``'s check, built once from the original model and passed down.

Every dynamic axis takes at least two different sizes (one per run) and different axes
take different sizes within a run, except where the graph says otherwise
(:mod:`rnn_rewrite_rules._size_facts`): axes it ties take one size whatever their
declared names, axes it fixes take that size, and an input that reaches an RNN's
``sequence_lens`` gets one valid length per batch row (each at most the sequence length,
some shorter). ``--shape NAME=DIMS`` fixes an input's shape, ``--shape AXIS=N,M`` the
sizes of a named dynamic axis.

Where the original rejects a run's sizes, :meth:`SizePlan.resolve` tries others, in
turn: other sizes of the free axes, every free axis one size, the export's own sizes
(declared in the file, or static in the failing node's constant inputs), and larger sizes
along the axes the failing node reads (a reflect ``Pad`` needs more samples than it pads).
Only when none runs does it give up, naming the input, the runtime's message and the
``--shape`` argument that would help. The sizes that ran are kept (:attr:`SizePlan
.accepted`), so that the benchmark times what verify compared.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules._rnn_ops import RNN_OPS
from rnn_rewrite_rules._size_facts import AxisRef, NodeSizes, SizeFacts, evaluate, size_facts
from rnn_rewrite_rules.errors import CannotVerify, UnsupportedInput

__all__ = [
    "MAX_ELEMENTS",
    "InputSpec",
    "SizePlan",
    "Sizes",
    "format_plan",
    "input_specs",
    "make_feeds",
    "parse_shape_overrides",
    "plan_runs",
    "zero_unsafe",
]

#: Input name -> shape, for one run.
Sizes = dict[str, tuple[int, ...]]
#: The name of the size an axis takes: a dim_param, or (input, axis) for an unnamed one.
Key = str | tuple[str, int]
T = TypeVar("T")

_DEFAULT_BASES = (2, 5)
#: Sizes tried, in turn, for a run whose sizes the original model rejects.
_FALLBACK_BASES = (1, 3, 4, 6, 7)
#: Factors by which the axes a failing node reads grow, in turn.
_GROWTH = (8, 64, 512)
#: The largest input fed (elements): more is a mistyped --shape, not a test.
MAX_ELEMENTS = 2**27
#: The largest input a retry of the plan's own makes (elements): a retry stays cheap.
_RETRY_ELEMENTS = 2**22


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """A graph input to feed: static dims are ints, dynamic ones a name or None."""

    name: str
    dtype: ir.DataType
    dims: tuple[int | str | None, ...] | None


def input_specs(model: ir.Model) -> list[InputSpec]:
    """The inputs a caller must feed (inputs with an initializer default are left out)."""
    specs = []
    for value in model.graph.inputs:
        if value.is_initializer():
            continue
        dims = None
        if value.shape is not None:
            dims = tuple(
                d if isinstance(d, int) else getattr(d, "value", None) for d in value.shape
            )
        dtype = value.dtype if value.dtype is not None else ir.DataType.UNDEFINED
        specs.append(InputSpec(value.name or "", dtype, dims))
    return specs


def parse_shape_overrides(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["input=2,7,256", "seq=1,9"]`` -> ``{"input": (2, 7, 256), "seq": (1, 9)}``.

    Raises:
        ValueError: an item is not ``NAME=N,N,...`` with non-negative integers.
    """
    result: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--shape {item!r}: expected NAME=DIMS, e.g. input=1,7,256")
        parts = [p for p in re.split(r"[,x\s]+", dims.strip()) if p]
        try:
            values = tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError(f"--shape {item!r}: dims must be integers") from None
        if any(v < 0 for v in values):
            raise ValueError(f"--shape {item!r}: dims must not be negative")
        result[name.strip()] = values
    return result


def _axis_key(spec: InputSpec, axis: int, dim: int | str | None) -> Key | None:
    """The name of the size an axis takes, or None for a static axis."""
    if isinstance(dim, int) and dim > 0:
        return None
    return dim if isinstance(dim, str) and dim else (spec.name, axis)


def _format_shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def format_plan(plan: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name}={_format_shape(shape)}" for name, shape in plan.items())


def _describe(ref: AxisRef) -> str:
    return f"{ref[0]} axis {ref[1]}"


class _Classes:
    """Union-find over axis keys: the keys the graph ties take one size."""

    def __init__(self) -> None:
        self._parent: dict[Key, Key] = {}

    def find(self, key: Key) -> Key:
        root = key
        while self._parent.get(root, root) != root:
            root = self._parent[root]
        self._parent[key] = root
        return root

    def union(self, a: Key, b: Key) -> bool:
        """Tie ``a`` and ``b``; False when they already were."""
        root_a, root_b = self.find(a), self.find(b)
        if root_a == root_b:
            return False
        self._parent[root_b] = root_a
        return True


class _Planner:
    """Input shapes for a run: every dynamic axis sized from one base number per run,
    tied axes one size, fixed axes their size.

    Raises (on creation):
        ValueError: an override names nothing or contradicts a static dim (a usage error).
        CannotVerify: an input has no declared rank and no override.
    """

    def __init__(
        self,
        specs: Sequence[InputSpec],
        overrides: Mapping[str, tuple[int, ...]],
        known: Mapping[AxisRef, int],
        ties: Sequence[tuple[AxisRef, AxisRef]] = (),
    ) -> None:
        self.specs = specs
        self.overrides = overrides
        self._by_name = {spec.name: spec for spec in specs}
        self.fixed: dict[Key, int] = self._input_overrides()
        self.keys: list[Key] = list(
            dict.fromkeys(k for spec in specs for k in self.input_keys(spec) if k is not None)
        )
        self.axis_sizes = self._axis_overrides()
        for spec in specs:
            if spec.dims is None and spec.name not in overrides:
                raise CannotVerify(
                    f"input {spec.name!r} has no declared shape: give --shape {spec.name}=DIMS"
                )
        self.classes = _Classes()
        #: The ties that joined two classes of keys, as "x axis 0 = h0 axis 0".
        self.tied: list[str] = self._tie(ties)
        #: Axes the graph fixes (and no --shape sets), as "input axis N = size".
        self.graph_fixed: list[str] = self._graph_sizes(known)
        self.runs = max([2, *(len(s) for s in self.axis_sizes.values())])
        self._plans: list[Sizes] | None = None

    def input_keys(self, spec: InputSpec) -> list[Key | None]:
        return [_axis_key(spec, axis, dim) for axis, dim in enumerate(spec.dims or ())]

    def key_of(self, ref: AxisRef) -> Key | None:
        """The key of an input axis, or None (no such input or axis, or a static one)."""
        spec = self._by_name.get(ref[0])
        if spec is None or spec.dims is None or not 0 <= ref[1] < len(spec.dims):
            return None
        return _axis_key(spec, ref[1], spec.dims[ref[1]])

    def _tie(self, ties: Sequence[tuple[AxisRef, AxisRef]]) -> list[str]:
        """Join the classes of each pair; describe the pairs that joined two."""
        described = []
        for a, b in ties:
            key_a, key_b = self.key_of(a), self.key_of(b)
            if key_a is not None and key_b is not None and self.classes.union(key_a, key_b):
                described.append(f"{_describe(a)} = {_describe(b)}")
        return described

    def _input_overrides(self) -> dict[Key, int]:
        fixed: dict[Key, int] = {}
        for spec in self.specs:
            if spec.name not in self.overrides or spec.dims is None:
                continue
            shape = self.overrides[spec.name]
            if len(shape) != len(spec.dims):
                raise ValueError(
                    f"--shape {spec.name}: {len(shape)} dims given, "
                    f"the input has rank {len(spec.dims)}"
                )
            for axis, (dim, size) in enumerate(zip(spec.dims, shape, strict=True)):
                key = _axis_key(spec, axis, dim)
                if key is None and dim != size:
                    raise ValueError(
                        f"--shape {spec.name}: axis {axis} is static {dim}, not {size}"
                    )
                if key is not None:
                    if fixed.get(key, size) != size:
                        raise ValueError(f"--shape {spec.name}: axis {key!r} is given two sizes")
                    fixed[key] = size
        return fixed

    def _axis_overrides(self) -> dict[Key, tuple[int, ...]]:
        axis_sizes: dict[Key, tuple[int, ...]] = {}
        for name, sizes in self.overrides.items():
            if name in self._by_name:
                continue
            if name not in self.keys:
                raise ValueError(f"--shape {name}: no input or named dynamic axis has that name")
            if not sizes:
                raise ValueError(f"--shape {name}: give at least one size")
            if name in self.fixed:
                raise ValueError(f"--shape {name}: the axis is also fixed by an input's --shape")
            axis_sizes[name] = sizes
        return axis_sizes

    def _graph_sizes(self, known: Mapping[AxisRef, int]) -> list[str]:
        """Take the sizes the graph fixes for axes no --shape decides; describe them."""
        described = []
        for spec in self.specs:
            if spec.name in self.overrides:
                continue
            for axis, key in enumerate(self.input_keys(spec)):
                size = known.get((spec.name, axis))
                if key is None or size is None or self._decided(key):
                    continue
                self.fixed[key] = size
                described.append(f"{spec.name} axis {axis} = {size}")
        return described

    def _decided(self, key: Key) -> bool:
        """Whether a --shape or a fixed size decides ``key`` or a key tied to it."""
        root = self.classes.find(key)
        return any(
            self.classes.find(k) == root and (k in self.fixed or k in self.axis_sizes)
            for k in self.keys
        )

    def _size(self, key: Key, run: int) -> int | None:
        """The size --shape or the graph gives ``key`` (or a key tied to it) in ``run``."""
        root = self.classes.find(key)
        for source in (key, *(k for k in self.keys if k != key)):
            if source != key and self.classes.find(source) != root:
                continue
            if source in self.fixed:
                return self.fixed[source]
            if source in self.axis_sizes:
                sizes = self.axis_sizes[source]
                return sizes[run % len(sizes)]
        return None

    def free(self) -> list[Key]:
        """One key per class of axes nothing fixes, in order of first appearance."""
        roots = dict.fromkeys(self.classes.find(k) for k in self.keys if not self._decided(k))
        return list(roots)

    def plan(self, run: int, base: int, chosen: Mapping[Key, int] | None = None) -> Sizes:
        """The shapes of ``run``: free axes ``base`` plus their class's index, or the size
        ``chosen`` gives their class."""
        chosen = chosen or {}
        index = {root: i for i, root in enumerate(dict.fromkeys(map(self.classes.find, self.keys)))}
        sizes: dict[Key, int] = {}
        for key in self.keys:
            root = self.classes.find(key)
            given = self._size(key, run)
            sizes[key] = given if given is not None else chosen.get(root, base + index[root])
        plan: Sizes = {}
        for spec in self.specs:
            if spec.name in self.overrides:
                plan[spec.name] = self.overrides[spec.name]
            else:
                plan[spec.name] = tuple(
                    dim if key is None else sizes[key]  # type: ignore[misc]
                    for dim, key in zip(spec.dims or (), self.input_keys(spec), strict=True)
                )
        for name, shape in plan.items():
            if math.prod(shape) > MAX_ELEMENTS:
                raise ValueError(
                    f"--shape: input {name!r} would have shape {_format_shape(shape)}, "
                    f"over {MAX_ELEMENTS:,} elements; give smaller sizes"
                )
        return plan

    @staticmethod
    def base(run: int) -> int:
        return _DEFAULT_BASES[run] if run < len(_DEFAULT_BASES) else 2 + 3 * run

    def plans(self) -> list[Sizes]:
        """Each run's shapes, distinct (computed once)."""
        if self._plans is None:
            plans: list[Sizes] = []
            for run in range(self.runs):
                plan = self.plan(run, self.base(run))
                if plan not in plans:
                    plans.append(plan)
            self._plans = plans
        return list(self._plans)

    def alternatives(self, run: int) -> list[Sizes]:
        """Other sizes for ``run`` (only axes neither --shape nor the graph fixes change)."""
        return [self.plan(run, base) for base in _FALLBACK_BASES]


def plan_runs(
    specs: Sequence[InputSpec],
    overrides: Mapping[str, tuple[int, ...]],
    *,
    known: Mapping[AxisRef, int] | None = None,
) -> list[Sizes]:
    """Input shapes for each run; each dynamic axis takes a different size in each run.

    Raises:
        ValueError: an override names nothing, contradicts a static dim or is too large
            (a usage error).
        CannotVerify: an input has no declared rank and no override.
    """
    return _Planner(specs, overrides, known or {}).plans()


def _lengths(dtype: ir.DataType, shape: tuple[int, ...], seq: int) -> np.ndarray:
    """One length per row: the first ``seq``, the next each one shorter, down to 1."""
    count = math.prod(shape)
    values = [seq - row % seq if seq > 0 else 0 for row in range(count)]
    return np.asarray(values, dtype=dtype.numpy()).reshape(shape)


def make_feeds(
    specs: Sequence[InputSpec],
    shapes: Mapping[str, tuple[int, ...]],
    rng: np.random.Generator,
    lengths: Mapping[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Random values: floats N(0, 1), integers in [1, smallest dim of the run], booleans;
    an input named in ``lengths`` gets sequence lengths bounded by its value.

    Raises:
        CannotVerify: an input's element type cannot be generated.
    """
    dims = [d for shape in shapes.values() for d in shape if d > 0]
    high = max(1, min(dims)) if dims else 1
    feeds = {}
    for spec in specs:
        try:
            feeds[spec.name] = runtime.make_feed(spec.dtype, shapes[spec.name], rng, high=high)
        except UnsupportedInput:
            raise CannotVerify(
                f"input {spec.name!r} has element type {spec.dtype.name}, not supported"
            ) from None
        if lengths and spec.name in lengths:
            feeds[spec.name] = _lengths(spec.dtype, shapes[spec.name], lengths[spec.name])
    return feeds


def zero_unsafe(model: ir.Model) -> bool:
    """Whether ONNX Runtime may end the process on a size 0 of this model: it has a
    recurrent op (``RNN_OPS``). ONNX Runtime aborts on LSTM, GRU and the contrib
    DynamicQuantizeLSTM at batch 0 and on GRU at seq 0, and 1.22 segfaults on RNN at
    seq 0."""
    return any((node.domain, node.op_type) in RNN_OPS for node in model.graph.all_nodes())


_FAILING_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'")


class SizePlan:
    """The sizes a model runs at (see the module): built once from the original model
    (:meth:`of`), told what the rewrite adds (:meth:`add_rewritten`), passed down to
    ``--verify``, ``--benchmark`` and ``--quantize``'s check.

    Raises (on first use of the runs, :meth:`check`):
        ValueError: ``overrides`` are inconsistent with the inputs (a usage error).
        CannotVerify: an input has no declared rank and no override.
    """

    def __init__(
        self,
        specs: Sequence[InputSpec],
        overrides: Mapping[str, tuple[int, ...]] | None = None,
        facts: SizeFacts | None = None,
        *,
        zero_unsafe: bool = False,
    ) -> None:
        self.specs = list(specs)
        self.overrides = dict(overrides or {})
        self.facts = facts or SizeFacts()
        #: See :func:`zero_unsafe`.
        self.zero_unsafe = zero_unsafe
        #: The sizes the original ran on, once :meth:`resolve` found them.
        self.accepted: list[Sizes] | None = None
        self._planner: _Planner | None = None
        self._runs: list[Sizes] | None = None

    @classmethod
    def of(
        cls, model: ir.Model, overrides: Mapping[str, tuple[int, ...]] | None = None
    ) -> SizePlan:
        """The plan of ``model`` (read before the rewrite) with the --shape ``overrides``."""
        return cls(input_specs(model), overrides, size_facts(model), zero_unsafe=zero_unsafe(model))

    def add_rewritten(self, model: ir.Model) -> None:
        """What the rewritten ``model`` adds: the sizes its weights fix (those already known
        win), and whether a size 0 may abort it (a re-rolled recurrence can abort where the
        unrolled original runs)."""
        self.facts.merge(size_facts(model))
        self.zero_unsafe = self.zero_unsafe or zero_unsafe(model)
        self._planner = None
        self._runs = None

    @property
    def planner(self) -> _Planner:
        if self._planner is None:
            self._planner = _Planner(self.specs, self.overrides, self.facts.fixed, self.facts.ties)
        return self._planner

    def check(self) -> None:
        """Raise now what the runs would raise (a usage error, an unranked input)."""
        self.runs()

    def runs(self) -> list[Sizes]:
        """The sizes of each run before any is tried (:meth:`resolve` may change them):
        planned once (again only after :meth:`add_rewritten`)."""
        if self._runs is None:
            self._runs = self.planner.plans()
        return list(self._runs)

    @property
    def notes(self) -> list[str]:
        """What the reader should know about the sizes: those the graph fixes or ties."""
        notes = []
        if self.planner.graph_fixed:
            notes.append(f"sizes the graph fixes: {', '.join(self.planner.graph_fixed)}")
        if self.planner.tied:
            notes.append(f"axes the graph needs equal: {', '.join(self.planner.tied)}")
        return notes

    def feeds(self, sizes: Sizes, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Random inputs of ``sizes``; sequence lengths where an input reaches an RNN's."""
        lengths = {}
        for name, poly in self.facts.lengths.items():
            seq = evaluate(poly, sizes)
            if seq is not None and name in sizes:
                lengths[name] = seq
        return make_feeds(self.specs, sizes, rng, lengths)

    def resolve(
        self,
        attempt: Callable[[Sizes], T],
        runtime_name: str,
        on_run: Callable[[], None] | None = None,
    ) -> tuple[list[T], list[str]]:
        """Run ``attempt`` (the original, on sizes) once per run, trying other sizes where it
        raises; the outcomes and notes on the sizes replaced. The sizes that ran are kept
        in :attr:`accepted`.

        Raises:
            CannotVerify: a run found no sizes the original accepts, or an input cannot be
                generated.
        """
        outcomes: list[T] = []
        notes: list[str] = []
        accepted: list[Sizes] = []
        defaults = self.runs()
        for run in range(self.planner.runs):
            rejected: list[tuple[Sizes, str]] = []
            found = self._first_accepted(run, defaults, attempt, accepted, rejected)
            if found is None:
                if rejected and not accepted:
                    raise CannotVerify(self._failure(rejected, runtime_name))
                if rejected:
                    notes.append(self._no_more(rejected, len(accepted)))
                break  # every size is fixed and compared already, or none else runs
            sizes, outcome = found
            accepted.append(sizes)
            outcomes.append(outcome)
            if rejected:
                first, error = rejected[0]
                notes.append(
                    f"the original rejects {format_plan(first)} ({error}); "
                    f"compared {format_plan(sizes)} instead"
                )
            if on_run is not None:
                on_run()
        self.accepted = accepted
        return outcomes, notes

    def _first_accepted(
        self,
        run: int,
        defaults: list[Sizes],
        attempt: Callable[[Sizes], T],
        accepted: list[Sizes],
        rejected: list[tuple[Sizes, str]],
    ) -> tuple[Sizes, T] | None:
        for sizes in self._tries(run, defaults, rejected):
            if sizes in accepted or any(sizes == tried for tried, _ in rejected):
                continue
            try:
                return sizes, attempt(sizes)
            except CannotVerify:
                raise
            except Exception as error:  # the runtime's refusal, whatever its class
                rejected.append((sizes, runtime.short_error(error)))
        return None

    def _tries(
        self, run: int, defaults: list[Sizes], rejected: list[tuple[Sizes, str]]
    ) -> Iterator[Sizes]:
        """The sizes to try for ``run``, in turn; those after the first read why the
        first was rejected."""
        if run < len(defaults):
            yield defaults[run]
        planner = self.planner
        yield from planner.alternatives(run)
        free = planner.free()
        base = planner.base(run)
        if len(free) > 1:
            yield planner.plan(run, base, dict.fromkeys(free, base))  # every free axis one size
        error = rejected[0][1] if rejected else ""
        failing = self._failing(error, free)
        yield from self._exported(run, error, failing)
        yield from self._grown(run, base, failing)

    def _failing_node(self, error: str) -> NodeSizes:
        """What the node named in the runtime's ``error`` reads (nothing when none is)."""
        match = _FAILING_NODE.search(error)
        return NodeSizes() if match is None else self.facts.node(match[2], match[1])

    def _failing(self, error: str, free: list[Key]) -> list[Key]:
        """The free axis classes the node named in ``error`` reads (all free ones when
        the error names no node the plan knows)."""
        planner = self.planner
        keys = [planner.key_of(ref) for ref in self._failing_node(error).axes]
        roots = dict.fromkeys(planner.classes.find(k) for k in keys if k is not None)
        return [root for root in roots if root in free] or free

    def _exported(self, run: int, error: str, failing: list[Key]) -> Iterator[Sizes]:
        """The export's own sizes for the failing axes: those the file declares for them
        (together), then each static size the failing node holds."""
        planner = self.planner
        base = planner.base(run)
        declared: dict[Key, int] = {}
        for ref, size in self.facts.declared.items():
            key = planner.key_of(ref)
            if key is not None and planner.classes.find(key) in failing:
                declared.setdefault(planner.classes.find(key), size)
        if declared:
            yield planner.plan(run, base, declared)
        for size in self._failing_node(error).sizes:
            yield planner.plan(run, base, dict.fromkeys(failing, size))

    def _grown(self, run: int, base: int, failing: list[Key]) -> Iterator[Sizes]:
        """Larger sizes along each failing axis class, then along all of them at once;
        none past :data:`_RETRY_ELEMENTS` elements an input."""
        planner = self.planner
        groups = [[root] for root in failing]
        if len(failing) > 1:
            groups.append(failing)
        for group in groups:
            for factor in _GROWTH:
                grown = planner.plan(run, base, dict.fromkeys(group, base * factor))
                if max((math.prod(s) for s in grown.values()), default=0) > _RETRY_ELEMENTS:
                    break
                yield grown

    def _failure(self, rejected: list[tuple[Sizes, str]], runtime_name: str) -> str:
        """Why no size ran: the first sizes and error, what else was tried, what helps."""
        first, error = rejected[0]
        failing = self._failing(error, self.planner.free())
        more = len(rejected) - 1
        tried = f"; {more} other size{'s' if more != 1 else ''} failed too" if more else ""
        return (
            f"the original model fails on {format_plan(first)} in {runtime_name}: {error}"
            f"{tried}; {self._hint(first, failing)}"
        )

    @staticmethod
    def _no_more(rejected: list[tuple[Sizes, str]], runs: int) -> str:
        """Why there are only ``runs`` runs: every other size tried failed."""
        first, error = rejected[0]
        more = len(rejected) - 1
        others = f" and {more} other size{'s' if more != 1 else ''}" if more else ""
        return (
            f"the original rejects {format_plan(first)}{others} ({error}): compared "
            f"{runs} run{'s' if runs != 1 else ''} only (a frozen axis? see --check)"
        )

    def _hint(self, first: Sizes, failing: list[Key]) -> str:
        """The --shape argument that would help: the first input with a failing axis, each
        failing axis a placeholder (its name where it has one)."""
        planner = self.planner
        for spec in self.specs:
            keys = planner.input_keys(spec) if spec.dims is not None else []
            placeholders = [
                None if key is None or planner.classes.find(key) not in failing
                else f"<{key if isinstance(key, str) else 'N'}>"
                for key in keys
            ]  # fmt: skip
            if any(placeholders):
                dims = [p or str(d) for p, d in zip(placeholders, first[spec.name], strict=True)]
                return (
                    f"give sizes it runs on, e.g. --shape {spec.name}={','.join(dims)} "
                    "(a frozen axis? see --check)"
                )
        return "give sizes it runs on with --shape NAME=DIMS (a frozen axis? see --check)"
