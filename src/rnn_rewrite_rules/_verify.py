"""Check a rewrite numerically: run both models in ONNX Runtime on seeded random inputs.

The sizes come from one :class:`rnn_rewrite_rules._size_plan.SizePlan`, built from the
original model: every dynamic axis takes several sizes, axes the graph ties take one,
axes it fixes take that size, sequence lengths are valid, and a run whose sizes the
original rejects is retried with others (the result lists the sizes compared and why).

When ONNX Runtime rejects the original model, the reference is the plan's equivalent of it
(:attr:`VerifyPlan.equivalent`: the job gives its ``layout=1`` RNNs made ``layout=0`` by the
``layout`` rules alone), run in ONNX Runtime.
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
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules._size_plan import SizePlan, Sizes, format_plan
from rnn_rewrite_rules.errors import CannotVerify
from rnn_rewrite_rules.runtime import require_onnxruntime

__all__ = [
    "VerifyPlan",
    "VerifyResult",
    "child_pythonpath",
    "require_onnxruntime",
    "verify",
]

Source = str | bytes


@dataclasses.dataclass(frozen=True)
class VerifyPlan:
    """What :func:`verify` compares and how: built once by its caller, read, never unpacked."""

    #: The sizes of each run (planned from the original, before the rewrite).
    sizes: SizePlan
    seed: int = 0
    #: The largest absolute difference allowed on any output.
    tolerance: float = 1e-4
    #: Where ONNX Runtime rejects the original: an equivalent it may load (serialized),
    #: or None. :func:`rnn_rewrite_rules._time_major.time_major_equivalent` gives the
    #: original with its ``layout=1`` RNNs made ``layout=0``. None here: no such fallback.
    equivalent: Callable[[Source], bytes | None] | None = None
    #: What the note says the equivalent is, when it is the reference.
    equivalent_note: str = (
        "ONNX Runtime rejects the original's layout=1 RNNs; reference outputs from an "
        "equivalent layout=0 model (the layout rules alone) in ONNX Runtime"
    )


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


def _reference(
    before: Source, after: Source, plan: VerifyPlan, result: VerifyResult
) -> tuple[runtime.Runner, Source | None]:
    """The runner for the reference outputs, and what a child process loads to run it
    (None: run it in this process)."""
    try:
        return runtime.ort_runner(before, optimize=False, arena=False), before
    except Exception as error:
        rejected = runtime.short_error(error)
    try:
        equivalent = None if plan.equivalent is None else plan.equivalent(before)
    except Exception:
        equivalent = None
    if equivalent is not None:
        try:
            reference = runtime.ort_runner(equivalent, optimize=False, arena=False)
        except Exception:
            pass
        else:
            result.notes.append(plan.equivalent_note)
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
    plan: SizePlan,
    reference: runtime.Runner,
    child_source: Source | None,
    rng: np.random.Generator,
    result: VerifyResult,
    on_run: Callable[[], None] | None,
) -> list[_Case]:
    """Run the reference on each run's sizes (the plan retries sizes it rejects)."""

    def attempt(sizes: Sizes) -> _Case:
        feeds = plan.feeds(sizes, rng)
        if child_source is None or not (plan.zero_unsafe and _has_zero(sizes)):
            return _Case(sizes, feeds, [np.asarray(e) for e in reference.run(feeds)], False)
        try:
            expected, undefined = _run_in_child(child_source, feeds, optimize=False)
        except _Aborted as error:
            return _Case(sizes, feeds, None, True, str(error))
        return _Case(sizes, feeds, expected, True, undefined=undefined)

    cases, notes = plan.resolve(attempt, reference.name, on_run)
    result.notes += notes
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
    plan: VerifyPlan,
    *,
    on_run: Callable[[], None] | None = None,
) -> VerifyResult:
    """Run ``before`` and ``after`` (paths or serialized models) on the same random inputs,
    at the sizes of ``plan.sizes``.

    The original runs first, without ONNX Runtime's graph optimizations (whose constant
    folding would hold extra copies of the weights), and its session is released before
    the result's loads (with the default optimizations, as a user runs it): at most one
    model is in memory at a time. A run whose sizes the original rejects is retried with
    others (:meth:`SizePlan.resolve`); the result lists the sizes compared. With
    ``plan.sizes.zero_unsafe`` (recurrent ops: ONNX Runtime may end the process on batch
    0), sizes with a 0 run in child processes; where the original aborts, the run is noted
    and not compared.

    ``on_run`` is called twice per run: once the original ran, once the result ran.

    Raises:
        OnnxRuntimeMissing: onnxruntime is not installed.
        CannotVerify: ``before`` does not load or run on any sizes tried.
        ValueError: the plan's overrides are inconsistent with the inputs.
    """
    require_onnxruntime()
    sizes = plan.sizes
    sizes.check()  # the usage errors (sizes too large), before loading anything
    result = VerifyResult(plan.tolerance, plan.seed, [], {})
    result.notes += sizes.notes
    reference, child_source = _reference(before, after, plan, result)
    output_names = reference.output_names
    rng = np.random.default_rng(plan.seed)
    cases = _reference_runs(sizes, reference, child_source, rng, result, on_run)
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
