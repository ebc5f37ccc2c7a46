"""Check a rewrite numerically: run both models in ONNX Runtime on seeded random inputs.

Every dynamic axis takes at least two different sizes (one per run), different axes take
different sizes within a run, and an axis shared by several inputs (``batch`` of ``input``
and ``h0``) takes the same size in all of them. ``--shape NAME=DIMS`` fixes an input's
shape, ``--shape AXIS=N,M`` the sizes of a named dynamic axis.

Axes the weights fix (a symbolic feature axis is W's last dim) take that size. A run
whose sizes the original rejects is retried with other sizes, and the result lists the
sizes compared.

When ONNX Runtime rejects the original model's ``layout=1`` RNNs, the reference is an
equivalent ``layout=0`` model made by the ``layout`` rules alone, run in ONNX Runtime.
When it rejects the original otherwise but loads the result, the reference outputs come
from ``onnx.reference`` (a partial check, said so); when it loads neither (an IR version
too new, say), there is nothing to compare: :class:`CannotVerify`.

Memory: one model is loaded at a time (the original without graph optimizations, whose
constant folding copies the weights), so a big model's check peaks near what running it
takes. Sizes of 0 on models with a recurrent op, on which ONNX Runtime may end the
process, run in child processes: a size the original aborts on is noted, not compared.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules._ir import const_array
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules._rnn_ops import RNN_OPS
from rnn_rewrite_rules.diagnostics import is_rnn
from rnn_rewrite_rules.errors import CannotVerify, UnsupportedInput
from rnn_rewrite_rules.runtime import require_onnxruntime

__all__ = [
    "InputSpec",
    "VerifyPlan",
    "VerifyResult",
    "child_pythonpath",
    "input_specs",
    "make_feeds",
    "parse_shape_overrides",
    "plan_runs",
    "require_onnxruntime",
    "verify",
    "weight_fixed_sizes",
    "zero_unsafe",
]

Source = str | bytes
_DEFAULT_BASES = (2, 5)
#: The largest input fed (elements): more is a mistyped --shape, not a test.
MAX_ELEMENTS = 2**27


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


def _axis_key(spec: InputSpec, axis: int, dim: int | str | None) -> str | tuple[str, int] | None:
    """The name of the size an axis takes, or None for a static axis."""
    if isinstance(dim, int) and dim > 0:
        return None
    return dim if isinstance(dim, str) and dim else (spec.name, axis)


#: Sizes tried, in turn, for a run whose sizes the original model rejects.
_FALLBACK_BASES = (1, 3, 4, 6, 7)
#: (graph input name, axis) -> the size the model's weights fix it to.
Known = Mapping[tuple[str, int], int]


def _graph_input_axis(value: ir.Value | None, axis: int) -> tuple[str, int] | None:
    """The graph input axis that becomes ``value``'s ``axis`` (through Identity, Cast,
    Transpose), or None."""
    while value is not None and value.producer() is not None:
        node = value.producer()
        if node.domain != "" or node.op_type not in (  # onnx_ir spells ai.onnx ""
            "Identity",
            "Cast",
            "Transpose",
        ):
            return None
        if node.op_type == "Transpose":
            perm_attr = node.attributes.get("perm")
            rank = value.shape.rank() if value.shape is not None else None
            if perm_attr is not None:
                perm = list(perm_attr.as_ints())
            elif rank is not None:
                perm = list(range(rank))[::-1]
            else:
                return None
            if axis >= len(perm):
                return None
            axis = perm[axis]
        value = node.inputs[0] if node.inputs else None
    if value is None or not value.is_graph_input() or value.is_initializer():
        return None
    return (value.name or "", axis)


def weight_fixed_sizes(model: ir.Model) -> dict[tuple[str, int], int]:
    """Graph input axes whose size the RNN weights fix: X's feature axis (W's last dim),
    the directions and hidden axes of ``initial_h`` / ``initial_c``."""
    known: dict[tuple[str, int], int] = {}
    for node in model.graph:
        if not is_rnn(node) or node.domain != "":
            continue
        facts = rnn_facts(node)
        if isinstance(facts, str):
            continue
        w = const_array(node.inputs[1] if len(node.inputs) > 1 else None)
        if w is not None and w.ndim == 3:
            found = _graph_input_axis(node.inputs[0], 2)
            if found is not None:
                known.setdefault(found, int(w.shape[2]))
        directions_axis = 1 if facts.layout == 1 else 0
        for index in (5, 6):  # initial_h, and an LSTM's initial_c (GRU and RNN have 6 inputs)
            state = node.inputs[index] if len(node.inputs) > index else None
            if state is None:
                continue
            for axis, size in ((directions_axis, facts.num_directions), (2, facts.hidden_size)):
                found = _graph_input_axis(state, axis)
                if found is not None:
                    known.setdefault(found, size)
    return known


class _Planner:
    """Input shapes for a run: every dynamic axis sized from one base number per run.

    Raises (on creation):
        ValueError: an override names nothing or contradicts a static dim (a usage error).
        CannotVerify: an input has no declared rank and no override.
    """

    def __init__(
        self,
        specs: Sequence[InputSpec],
        overrides: Mapping[str, tuple[int, ...]],
        known: Known,
    ) -> None:
        self.specs = specs
        self.overrides = overrides
        by_name = {spec.name: spec for spec in specs}
        fixed: dict[object, int] = {}
        for spec in specs:
            if spec.name not in overrides:
                continue
            shape = overrides[spec.name]
            if spec.dims is not None:
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
                            raise ValueError(
                                f"--shape {spec.name}: axis {key!r} is given two sizes"
                            )
                        fixed[key] = size
        keys: list[object] = []
        for spec in specs:
            for axis, dim in enumerate(spec.dims or ()):
                key = _axis_key(spec, axis, dim)
                if key is not None and key not in keys:
                    keys.append(key)
        axis_sizes: dict[object, tuple[int, ...]] = {}
        for name, sizes in overrides.items():
            if name in by_name:
                continue
            if name not in keys:
                raise ValueError(f"--shape {name}: no input or named dynamic axis has that name")
            if not sizes:
                raise ValueError(f"--shape {name}: give at least one size")
            if name in fixed:
                raise ValueError(f"--shape {name}: the axis is also fixed by an input's --shape")
            axis_sizes[name] = sizes
        for spec in specs:
            if spec.dims is None and spec.name not in overrides:
                raise CannotVerify(
                    f"input {spec.name!r} has no declared shape: give --shape {spec.name}=DIMS"
                )
        #: Axes the weights fix (and no --shape sets), as "input axis N = size".
        self.weight_fixed: list[str] = []
        for spec in specs:
            if spec.name in overrides:
                continue
            for axis, dim in enumerate(spec.dims or ()):
                key = _axis_key(spec, axis, dim)
                size = known.get((spec.name, axis))
                if key is None or size is None or key in fixed or key in axis_sizes:
                    continue
                fixed[key] = size
                self.weight_fixed.append(f"{spec.name} axis {axis} = {size}")
        self.keys, self.fixed, self.axis_sizes = keys, fixed, axis_sizes
        self.runs = max([2, *(len(s) for s in axis_sizes.values())])

    def plan(self, run: int, base: int) -> dict[str, tuple[int, ...]]:
        sizes = {}
        for index, key in enumerate(self.keys):
            if key in self.fixed:
                sizes[key] = self.fixed[key]
            elif key in self.axis_sizes:
                sizes[key] = self.axis_sizes[key][run % len(self.axis_sizes[key])]
            else:
                sizes[key] = base + index
        plan = {}
        for spec in self.specs:
            if spec.name in self.overrides:
                plan[spec.name] = self.overrides[spec.name]
            else:
                plan[spec.name] = tuple(
                    dim if key is None else sizes[key]
                    for axis, dim in enumerate(spec.dims or ())
                    for key in [_axis_key(spec, axis, dim)]
                )
        for name, shape in plan.items():
            if math.prod(shape) > MAX_ELEMENTS:
                raise ValueError(
                    f"--shape: input {name!r} would have shape {_format_shape(shape)}, "
                    f"over {MAX_ELEMENTS:,} elements; give smaller sizes"
                )
        return plan

    def plans(self) -> list[dict[str, tuple[int, ...]]]:
        plans: list[dict[str, tuple[int, ...]]] = []
        for run in range(self.runs):
            base = _DEFAULT_BASES[run] if run < len(_DEFAULT_BASES) else 2 + 3 * run
            plan = self.plan(run, base)
            if plan not in plans:
                plans.append(plan)
        return plans

    def alternatives(self, run: int) -> list[dict[str, tuple[int, ...]]]:
        """Other sizes for ``run`` (only axes neither --shape nor the weights fix change)."""
        return [self.plan(run, base) for base in _FALLBACK_BASES]


def plan_runs(
    specs: Sequence[InputSpec],
    overrides: Mapping[str, tuple[int, ...]],
    *,
    known: Known | None = None,
) -> list[dict[str, tuple[int, ...]]]:
    """Input shapes for each run; each dynamic axis takes a different size in each run.

    Args:
        known: sizes the model's weights fix (see :func:`weight_fixed_sizes`).

    Raises:
        ValueError: an override names nothing, contradicts a static dim or is too large
            (a usage error).
        CannotVerify: an input has no declared rank and no override.
    """
    return _Planner(specs, overrides, known or {}).plans()


def make_feeds(
    specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Random values: floats N(0, 1), integers in [1, smallest dim of the run], booleans.

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
    return feeds


def _format_shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def format_plan(plan: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name}={_format_shape(shape)}" for name, shape in plan.items())


@dataclasses.dataclass
class VerifyResult:
    tolerance: float
    seed: int
    #: The input shapes compared, one dict per run.
    runs: list[dict[str, tuple[int, ...]]]
    #: Output name -> max abs diff over all runs.
    max_diff: dict[str, float]
    reference: str = "onnxruntime"
    #: What the reader should know about how the comparison was made.
    notes: list[str] = dataclasses.field(default_factory=list)
    #: A failure other than the tolerance (rewritten model does not run, shapes differ).
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and all(d <= self.tolerance for d in self.max_diff.values())

    @property
    def worst(self) -> float:
        return max(self.max_diff.values(), default=0.0)


def zero_unsafe(model: ir.Model) -> bool:
    """Whether ONNX Runtime may end the process on a size 0 of this model: it has a
    recurrent op (``RNN_OPS``). ONNX Runtime aborts on LSTM, GRU and the contrib
    DynamicQuantizeLSTM at batch 0 and on GRU at seq 0, and 1.22 segfaults on RNN at
    seq 0. :func:`verify` runs such sizes in child processes."""
    return any((node.domain, node.op_type) in RNN_OPS for node in model.graph.all_nodes())


@dataclasses.dataclass
class VerifyPlan:
    """What a model fixes about :func:`verify`'s runs, read from the original before the
    rewrite (which may fold weights that fix more sizes: :meth:`add_rewritten`)."""

    specs: list[InputSpec]
    #: Input axis -> the size the weights fix (:func:`weight_fixed_sizes`).
    known: dict[tuple[str, int], int]
    #: See :func:`zero_unsafe`.
    zero_unsafe: bool

    @classmethod
    def of(cls, model: ir.Model) -> VerifyPlan:
        return cls(input_specs(model), weight_fixed_sizes(model), zero_unsafe(model))

    def add_rewritten(self, model: ir.Model) -> None:
        """What the rewritten ``model`` adds: the sizes its weights fix (those already known
        win), and whether a size 0 may abort it (a re-rolled recurrence can abort where the
        unrolled original runs)."""
        self.known = {**weight_fixed_sizes(model), **self.known}
        self.zero_unsafe = self.zero_unsafe or zero_unsafe(model)

    def runs(self, overrides: Mapping[str, tuple[int, ...]]) -> list[dict[str, tuple[int, ...]]]:
        """:func:`plan_runs` for these inputs.

        Raises:
            ValueError: ``overrides`` are inconsistent with the inputs.
        """
        return plan_runs(self.specs, overrides, known=self.known)


def _time_major_equivalent(before: Source) -> bytes | None:
    """``before`` with its layout=1 RNNs made layout=0 by the ``layout`` rules alone
    (serialized, external data inlined), or None when it has none or they stay."""
    from rnn_rewrite_rules import _api

    def batch_first(model: ir.Model) -> bool:
        return any(
            is_rnn(node) and node.attributes.get_int("layout", 0) == 1
            for node in model.graph.all_nodes()
        )

    if isinstance(before, bytes):
        model = ir.serde.deserialize_model(onnx.load_from_string(before))
    else:
        model = ir.load(before)
    if not batch_first(model):
        return None
    _api.rewrite(model, ["layout"])
    if batch_first(model):
        return None
    ir.external_data.load_to_model(model)
    return ir.serde.serialize_model(model).SerializeToString()


def _reference(
    before: Source, after: Source, result: VerifyResult
) -> tuple[runtime.Runner, Source | None]:
    """The runner for the reference outputs, and what a child process loads to run it
    (None: run it in this process)."""
    try:
        return runtime.ort_runner(before, optimize=False, arena=False), before
    except Exception as error:
        rejected = runtime.short_error(error)
    try:
        equivalent = _time_major_equivalent(before)
    except Exception:
        equivalent = None
    if equivalent is not None:
        try:
            reference = runtime.ort_runner(equivalent, optimize=False, arena=False)
        except Exception:
            pass
        else:
            result.notes.append(
                "ONNX Runtime rejects the original's layout=1 RNNs; reference outputs from an "
                "equivalent layout=0 model (the layout rules alone) in ONNX Runtime"
            )
            return reference, equivalent
    try:
        # released at once: only whether it loads matters here
        runtime.ort_runner(after, arena=False)
    except Exception:
        raise CannotVerify(
            f"ONNX Runtime {runtime.require_onnxruntime()} does not load the original model "
            f"(nor the result): {rejected}"
        ) from None
    try:
        reference = runtime.reference_runner(before)
    except Exception:
        raise CannotVerify(
            f"the original model does not load in ONNX Runtime: {rejected}"
        ) from None
    result.reference = reference.name
    result.notes.append(
        f"ONNX Runtime rejects the original model ({rejected}); reference outputs from "
        "onnx.reference: a partial check (it ignores sequence_lens and clip on RNNs)"
    )
    return reference, None


class _Aborted(Exception):
    """ONNX Runtime ended the child process running a model (on LSTM/GRU batch 0, say)."""


#: A child process: load a model in ONNX Runtime, run it twice on the pickled feeds, pickle
#: both outputs (or the error) into the file named by ``argv[1]``.
_CHILD = """
import pickle, sys
from rnn_rewrite_rules import runtime
source, optimize, feeds = pickle.load(sys.stdin.buffer)
try:
    runner = runtime.ort_runner(source, optimize=optimize, arena=False)
    outcome = ("ok", [list(runner.run(feeds)) for _ in range(2)])
except Exception as error:
    outcome = ("error", runtime.short_error(error))
with open(sys.argv[1], "wb") as out:
    pickle.dump(outcome, out)
"""


def child_pythonpath(pythonpath: str | None) -> str:
    """``PYTHONPATH`` for a child that must import this very copy of the package: its
    root first, then ``pythonpath``."""
    package_root = str(Path(__file__).resolve().parent.parent)
    return os.pathsep.join(p for p in (package_root, pythonpath) if p)


def _run_in_child(
    source: Source, feeds: Mapping[str, np.ndarray], *, optimize: bool
) -> tuple[list[np.ndarray], set[int]]:
    """Run ``source`` twice on ``feeds`` in ONNX Runtime in a child process: the outputs
    and the indices of those the two runs disagree on (at size 0, ONNX Runtime's LSTM
    leaves ``Y_h`` and ``Y_c`` uninitialized).

    Raises:
        _Aborted: the child died (ONNX Runtime aborted it).
        RuntimeError: ONNX Runtime raised an error (its text).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = child_pythonpath(env.get("PYTHONPATH"))
    with tempfile.TemporaryDirectory(prefix="rnn-rewrite-verify-") as scratch:
        out = Path(scratch) / "outputs.pickle"
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(out)],
            input=pickle.dumps((source, optimize, dict(feeds))),
            capture_output=True,
            env=env,
            check=False,
        )
        if not out.exists():
            if done.returncode < 0:
                raise _Aborted(f"killed by {signal.Signals(-done.returncode).name}")
            last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
            raise _Aborted(f"exit code {done.returncode}: {last[0][:200]}")
        status, value = pickle.loads(out.read_bytes())
    if status != "ok":
        raise RuntimeError(value)
    first, second = ([np.asarray(o) for o in run] for run in value)
    unstable = {
        index
        for index, (a, b) in enumerate(zip(first, second, strict=True))
        if a.shape != b.shape or runtime.diff(a, b) != 0
    }
    return first, unstable


@dataclasses.dataclass
class _Case:
    """One run: the sizes, the inputs and the reference outputs (None: the original aborts)."""

    plan: dict[str, tuple[int, ...]]
    feeds: dict[str, np.ndarray]
    expected: list[np.ndarray] | None
    in_child: bool
    aborted: str = ""
    #: Outputs two runs of the original disagree on (ONNX Runtime leaves them undefined).
    undefined: set[int] = dataclasses.field(default_factory=set)


def _has_zero(plan: Mapping[str, tuple[int, ...]]) -> bool:
    return any(0 in shape for shape in plan.values())


def _reference_runs(
    planner: _Planner,
    specs: Sequence[InputSpec],
    reference: runtime.Runner,
    child_source: Source | None,
    *,
    zero_unsafe: bool,
    seed: int,
    result: VerifyResult,
    on_run: Callable[[], None] | None,
) -> list[_Case]:
    """Run the reference on each run's sizes (retrying sizes it rejects)."""
    rng = np.random.default_rng(seed)
    defaults = planner.plans()
    cases: list[_Case] = []
    tried: list[dict] = []
    for run in range(planner.runs):
        tries = [defaults[run]] if run < len(defaults) else []
        tries += planner.alternatives(run)
        rejected: list[tuple[dict, str]] = []
        for plan in tries:
            if plan in tried or any(plan == p for p, _ in rejected):
                continue
            feeds = make_feeds(specs, plan, rng)
            in_child = zero_unsafe and child_source is not None and _has_zero(plan)
            undefined: set[int] = set()
            try:
                if in_child:
                    expected, undefined = _run_in_child(child_source, feeds, optimize=False)
                else:
                    expected = reference.run(feeds)
            except _Aborted as error:
                cases.append(_Case(plan, feeds, None, in_child, str(error)))
                break
            except Exception as error:
                rejected.append((plan, runtime.short_error(error)))
                continue
            expected = [np.asarray(e) for e in expected]
            cases.append(_Case(plan, feeds, expected, in_child, undefined=undefined))
            break
        else:
            if not rejected:  # every size is fixed: nothing else to try
                break
            plan, error = rejected[0]
            more = len(rejected) - 1
            others = f" (and {more} other size{'s' if more > 1 else ''})" if more else ""
            raise CannotVerify(
                f"the original model fails on {format_plan(plan)}{others} in {reference.name}: "
                f"{error} (a frozen axis? see --check; or fix sizes with --shape)"
            )
        tried.append(cases[-1].plan)
        if rejected:
            result.notes.append(
                f"the original rejects {format_plan(rejected[0][0])} ({rejected[0][1]}); "
                f"compared {format_plan(cases[-1].plan)} instead"
            )
        if on_run is not None:
            on_run()
    if cases and all(case.expected is None for case in cases):
        raise CannotVerify(
            f"ONNX Runtime aborts on the original model at every size given "
            f"({'; '.join(format_plan(case.plan) for case in cases)}): give sizes other than 0"
        )
    return cases


def _compare(
    case: _Case,
    candidate: runtime.Runner,
    after: Source,
    output_names: list[str],
    result: VerifyResult,
) -> None:
    """Run the result on ``case`` and record the differences (or the failure)."""
    undefined = set(case.undefined)
    try:
        if case.in_child:
            actual, unstable = _run_in_child(after, case.feeds, optimize=True)
            undefined |= unstable
        else:
            actual = candidate.run(case.feeds)
    except _Aborted as error:
        if case.expected is None:
            result.notes.append(
                f"ONNX Runtime aborts on both models at {format_plan(case.plan)} (not compared)"
            )
        else:
            result.failure = (
                f"ONNX Runtime aborts on the rewritten model at {format_plan(case.plan)} "
                f"({error}), not on the original"
            )
        return
    except Exception as error:
        result.failure = (
            f"the rewritten model fails on {format_plan(case.plan)}: {runtime.short_error(error)}"
        )
        return
    if case.expected is None:
        result.notes.append(
            f"ONNX Runtime aborts on the original model at {format_plan(case.plan)} "
            f"({case.aborted}); the result runs there (not compared)"
        )
        return
    result.runs.append(case.plan)
    if undefined:
        names = ", ".join(output_names[index] for index in sorted(undefined))
        result.notes.append(
            f"ONNX Runtime gives different values for {names} on two identical runs at "
            f"{format_plan(case.plan)} (left undefined at this size): compared shapes only"
        )
    for index, (name, e, a) in enumerate(zip(output_names, case.expected, actual, strict=True)):
        e, a = np.asarray(e), np.asarray(a)
        if index in undefined and e.shape == a.shape:
            result.max_diff.setdefault(name, 0.0)
            continue
        if e.shape != a.shape:
            result.failure = (
                f"run {len(result.runs)}: output {name!r} has shape {a.shape}, expected {e.shape}"
            )
            return
        result.max_diff[name] = max(result.max_diff.get(name, 0.0), runtime.diff(e, a))


def verify(
    before: Source,
    after: Source,
    specs: Sequence[InputSpec],
    *,
    overrides: Mapping[str, tuple[int, ...]] | None = None,
    known: Known | None = None,
    zero_unsafe: bool = False,
    seed: int = 0,
    tolerance: float = 1e-4,
    on_run: Callable[[], None] | None = None,
) -> VerifyResult:
    """Run ``before`` and ``after`` (paths or serialized models) on the same random inputs.

    The original runs first, without ONNX Runtime's graph optimizations (whose constant
    folding would hold extra copies of the weights), and its session is released before
    the result's loads (with the default optimizations, as a user runs it): at most one
    model is in memory at a time. A run whose sizes the original rejects is retried with
    other sizes of the axes no ``--shape`` and no weight fixes; the result lists the sizes
    compared. With ``zero_unsafe`` (recurrent ops: ONNX Runtime may end the process on batch
    0), sizes with a 0 run in child processes; where the original aborts, the run is
    noted and not compared.

    ``on_run`` is called twice per run: once the original ran, once the result ran.

    Raises:
        OnnxRuntimeMissing: onnxruntime is not installed.
        CannotVerify: ``before`` does not load or run on any sizes tried.
        ValueError: ``overrides`` are inconsistent with the inputs.
    """
    require_onnxruntime()
    overrides = overrides or {}
    planner = _Planner(specs, overrides, known or {})
    planner.plans()  # the usage errors (sizes too large), before loading anything
    result = VerifyResult(tolerance, seed, [], {})
    if planner.weight_fixed:
        result.notes.append(f"sizes the weights fix: {', '.join(planner.weight_fixed)}")
    reference, child_source = _reference(before, after, result)
    output_names = reference.output_names
    cases = _reference_runs(
        planner,
        specs,
        reference,
        child_source,
        zero_unsafe=zero_unsafe,
        seed=seed,
        result=result,
        on_run=on_run,
    )
    del reference  # its session and weights, before the result's are loaded
    gc.collect()
    try:
        candidate = runtime.ort_runner(after, arena=False)
    except Exception as error:
        result.failure = (
            f"the rewritten model does not load in ONNX Runtime: {runtime.short_error(error)}"
        )
        return result
    if candidate.output_names != output_names:
        result.failure = f"outputs differ: {output_names} before, {candidate.output_names} after"
        return result
    for case in cases:
        _compare(case, candidate, after, output_names, result)
        if result.failure:
            return result
        if on_run is not None:
            on_run()
    return result
