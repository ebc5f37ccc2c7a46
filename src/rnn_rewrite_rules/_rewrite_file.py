"""Rewrite a model file on disk: load, rewrite, check, verify, write (the ``rnn-rewrite`` job).

:func:`rewrite_file` is the one call behind the command; tests and benchmarks call it too.
Nothing is written unless every step succeeded: the result is staged next to the target and
moved into place last (see :mod:`rnn_rewrite_rules._save`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import importlib.util
import os
import secrets
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import RewriteRule, RewriteRuleSet

from rnn_rewrite_rules import _load, _report, _save, _verify, costs, diagnostics, runtime
from rnn_rewrite_rules._api import Refused, apply_rounds, select
from rnn_rewrite_rules._compat import check_onnxscript
from rnn_rewrite_rules._report import Report
from rnn_rewrite_rules._size_plan import SizePlan, Sizes
from rnn_rewrite_rules._time_major import time_major_equivalent
from rnn_rewrite_rules.benchmark import BUDGET_S, BenchmarkResult, plan_feeds
from rnn_rewrite_rules.benchmark import benchmark as run_benchmark
from rnn_rewrite_rules.errors import (
    BadOptions,
    CannotVerify,
    InvalidResult,
    NoRecurrence,
    OutputNotWritable,
    SlowerResult,
    VerifyFailed,
)
from rnn_rewrite_rules.quantize import INT8_TOLERANCE, QuantizeResult, quantize_file
from rnn_rewrite_rules.rules import DEFAULT_TARGET

__all__ = [
    "Progress",
    "RewriteOptions",
    "rewrite_file",
    "select",
]


class Task(Protocol):
    def advance(self) -> None: ...

    def update(self, completed: int, total: int) -> None: ...

    def done(self) -> None: ...


class Progress(Protocol):
    """Where :func:`rewrite_file` reports progress (the command draws bars on a terminal)."""

    def started(self, rnn_nodes: int) -> None:
        """The model is loaded and has this many RNN nodes (small ones need no display)."""

    def task(self, description: str, total: int | None = None) -> Task: ...


class _NoTask:
    def advance(self) -> None:
        pass

    def update(self, completed: int, total: int) -> None:
        pass

    def done(self) -> None:
        pass


class _NoProgress:
    def started(self, rnn_nodes: int) -> None:
        pass

    def task(self, description: str, total: int | None = None) -> Task:
        return _NoTask()


@dataclasses.dataclass(frozen=True)
class RewriteOptions:
    """What :func:`rewrite_file` does besides rewriting with every family."""

    #: Family or rule names (a string is one name); None for all.
    rules: Sequence[str] | str | None = None
    #: Family or rule names left out of ``rules``.
    exclude: Sequence[str] | str | None = None
    #: The rules ``rules``, ``exclude`` and ``target`` choose, when the caller chose them
    #: already (the CLI, to fail on a bad name before reading a file); None: chosen here.
    selected: Sequence[RewriteRule] | None = None
    #: Write the result even where the model has no recurrence to rewrite.
    allow_no_rnn: bool = False
    #: What the result must run on: ``"portable"`` (everywhere the input runs) or
    #: ``"onnxruntime"`` (see ``rnn_rewrite_rules.rules.TARGETS``).
    target: str = DEFAULT_TARGET
    #: Allow ``dst`` to be ``src`` (replaced only once the new file is complete).
    in_place: bool = False
    #: Also find the RNN hazards, before and after.
    hazards: bool = False
    #: Compare the input and the result in ONNX Runtime; write nothing if they differ.
    verify: bool = False
    #: ``verify``'s max abs difference; None: 1e-4, or ``quantize.INT8_TOLERANCE`` with
    #: ``quantize="int8"``.
    tolerance: float | None = None
    #: ``--verify`` and ``--benchmark`` sizes: an input's shape or a named dynamic axis'
    #: sizes (one per run).
    shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    seed: int = 0
    progress: Progress | None = None
    #: ``"int8"``: ONNX Runtime's ``quantize_dynamic`` after the rewrite (``rnn_rewrite_rules
    #: .quantize``); ``verify`` then compares the float input with the int8 result.
    quantize: str | None = None
    #: Time the input and the result side by side at ``verify``'s sizes (ONNX Runtime, and
    #: OpenVINO when installed); write nothing if the result is slower beyond noise.
    benchmark: bool = False
    #: With ``benchmark``: write the result even when it measured slower.
    keep_slower: bool = False
    #: With ``benchmark``: seconds each latency may spend on more repeats while the
    #: difference is within noise (``rnn_rewrite_rules.benchmark.BUDGET_S``).
    benchmark_budget: float = BUDGET_S

    @property
    def effective_tolerance(self) -> float:
        if self.tolerance is not None:
            return self.tolerance
        return INT8_TOLERANCE if self.quantize == "int8" else 1e-4


def _check_options(options: RewriteOptions) -> None:
    if not options.effective_tolerance >= 0:  # also rejects NaN
        raise BadOptions(f"--tolerance must be >= 0, not {options.tolerance}")
    if options.quantize not in (None, "int8"):
        raise BadOptions(f"--quantize takes int8, not {options.quantize!r}")
    if options.keep_slower and not options.benchmark:
        raise BadOptions("--keep-slower only matters with --benchmark: add --benchmark")
    if not options.benchmark_budget >= 0:  # also rejects NaN
        raise BadOptions(f"--benchmark-budget must be >= 0, not {options.benchmark_budget}")
    if options.shapes and not (options.verify or options.benchmark):
        raise BadOptions(
            "--shape only sets the sizes --verify and --benchmark run at: add --verify"
        )
    if not 0 <= options.seed < 2**32:
        raise BadOptions(f"--seed must be in [0, 2**32), not {options.seed}")


def _check_result(path: Path) -> None:
    """The ONNX checker on the staged file (the input passed it when it was loaded)."""
    try:
        _load.check_model_file(path)  # the tensors' bytes stay on disk
    except Exception as error:  # onnx raises ValidationError and friends
        raise InvalidResult(
            f"the rewritten model is invalid ({str(error).splitlines()[0]}); nothing written"
        ) from None


def _rewrite(model: ir.Model, rules: list, progress: Progress, target: str) -> Report:
    before = _report.model_stats(model)
    node_total = sum(1 for _ in model.graph.all_nodes())
    current: list[Task] = [_NoTask()]

    def on_round(number: int) -> None:
        current[0].done()
        current[0] = progress.task(f"rewriting, round {number + 1}", node_total)

    fired: collections.Counter[str] = collections.Counter()
    check_onnxscript()
    context = costs.Context()
    refusals: list[Refused] = []
    apply_rounds(
        model,
        RewriteRuleSet(rules),
        on_round,
        counts=fired,
        on_node=lambda: current[0].advance(),
        context=context,
        refusals=refusals,
        target=target,
    )
    current[0].done()
    unimproved = _report.unimproved_rnns(model, rules, _report.rule_families(), refusals)
    after = _report.model_stats(model)
    report = Report(Path(), None, before, after, fired, unimproved, len(rules))
    report.kept_unrolled = context.declined
    return report


def _save_for_quantizer(loaded: _load.LoadedModel, scratch: Path) -> tuple[Path, bool]:
    """``loaded`` written into ``scratch`` for ONNX Runtime's quantizer (which reads and
    writes files, and a shape-inferred copy next to its input); whether it takes external
    data (the input had it, or it is too big for one protobuf)."""
    # a name of the run's own: above 2 GB the quantizer writes <target>.data, and onnx
    # refuses when a file of that name exists in the working directory (the input's own
    # model.onnx.data, say)
    source = scratch / "float" / f"rnn-rewrite-{secrets.token_hex(4)}.onnx"
    source.parent.mkdir()
    external = loaded.external_data or _save.tensor_bytes(loaded.model) > _save.EMBED_LIMIT_BYTES
    try:
        _save.save_model(loaded.model, source, f"{source.name}.data" if external else None)
    except OSError as error:
        raise OutputNotWritable(f"{scratch}: cannot write: {error.strerror or error}") from None
    return source, external


def _quantize(source: Path, external: bool) -> tuple[_load.LoadedModel, QuantizeResult]:
    """The model at ``source`` through ONNX Runtime's quantizer into a folder beside it;
    the quantized model, its tensors left on disk."""
    target = source.parent.parent / "int8" / source.name
    target.parent.mkdir()
    result = quantize_file(source, target)
    return _load.LoadedModel(ir.load(target), target, external, frozenset()), result


def _benchmark_sizes(before: str, plan: SizePlan, seed: int) -> tuple[list[Sizes], list[str]]:
    """The sizes to time: those verify compared, else those the original runs at (found
    as verify finds them); notes on sizes replaced or why none were found."""
    if plan.accepted is not None:
        return plan.accepted, []
    try:
        original = runtime.ort_runner(before, arena=False)
    except Exception as error:
        return plan.runs(), [f"the original does not load: {runtime.short_error(error)}"]
    rng = np.random.default_rng(seed)

    def attempt(sizes: Sizes) -> None:
        if not any(0 in shape for shape in sizes.values()):  # never timed, never run
            original.run(plan.feeds(sizes, rng))

    try:
        _, notes = plan.resolve(attempt, original.name)
    except CannotVerify as error:
        return plan.runs(), [str(error)]
    return plan.accepted or [], notes


def _run_benchmark(
    before: str, after: str, plan: SizePlan, options: RewriteOptions, progress: Progress
) -> BenchmarkResult:
    sizes, notes = _benchmark_sizes(before, plan, options.seed)
    feeds = plan_feeds(plan, sizes, seed=options.seed)
    openvino = importlib.util.find_spec("openvino") is not None
    steps = (1 + len(feeds)) * (2 if openvino else 1)
    task = progress.task("benchmarking (interleaved rounds)", steps)
    # target onnxruntime promises nothing about OpenVINO: its ratios are shown, not judged
    judged = ("onnxruntime",) if options.target == "onnxruntime" else None
    result = run_benchmark(
        before,
        after,
        feeds,
        openvino=openvino,
        judged=judged,
        progress=lambda _: task.advance(),
        budget=options.benchmark_budget,
    )
    result.notes += notes
    task.done()
    return result


def _run_verify(
    before: str, after: str, plan: _verify.VerifyPlan, progress: Progress
) -> _verify.VerifyResult:
    task = progress.task("verifying in ONNX Runtime", 2 * len(plan.sizes.runs()))  # both
    result = _verify.verify(before, after, plan, on_run=task.advance)
    task.done()
    return result


def rewrite_file(
    src: str | os.PathLike,
    dst: str | os.PathLike | None,
    options: RewriteOptions | None = None,
) -> Report:
    """Rewrite the model at ``src`` and write it to ``dst`` (None: write nothing).

    ``dst`` may be ``src`` with ``options.in_place``. The file appears only once complete,
    checked and (with ``options.verify``) verified.

    With ``options.verify``, the rewritten model is released before the comparison, which
    loads one model at a time in ONNX Runtime (see :func:`rnn_rewrite_rules._verify.verify`):
    the peak memory stays near what running the original takes.

    Raises (all exported by ``rnn_rewrite_rules``; nothing is written when one is raised):
        BadOptions: contradictory options (``--shape`` without ``--verify``, say).
        NoRecurrence: ``dst`` given, the model has no recurrence to rewrite, and
            ``options.allow_no_rnn`` is not set.
        UnknownRule: ``options.rules`` names something that does not exist.
        OnnxRuntimeMissing: ``options.verify`` without onnxruntime.
        ModelIOError: the input cannot be read or the output cannot be written (a subclass
            of :class:`rnn_rewrite_rules.errors.ModelIOError` says which).
        CannotVerify: ONNX Runtime loads neither model, or the original does not run on
            any sizes tried (or aborts on every size given).
        VerifyFailed: the outputs differ (its ``report`` says how).
        InvalidResult: the result fails the ONNX checker.
        SlowerResult: ``options.benchmark`` measured the result slower than the original
            beyond noise (``dst`` given, ``options.keep_slower`` not set; its ``report``
            has the numbers).

    The input must pass the ONNX checker (:class:`rnn_rewrite_rules.errors.InvalidModel`,
    a ``ModelIOError``, otherwise). ``--verify``, ``--benchmark`` and ``--quantize``'s
    check share one size plan, read from the input before the rewrite.
    """
    options = options or RewriteOptions()
    job = _Job.start(Path(src), Path(dst) if dst is not None else None, options)
    with contextlib.ExitStack() as stack:
        job.load(stack)
        job.rewrite()
        job.quantize(stack)
        if job.staging is None and not options.verify and not options.benchmark:
            return job.done()  # --check: nothing to write or run
        job.write(stack)
        job.verify()
        job.benchmark()
        job.commit()
    return job.done()


@dataclasses.dataclass
class _Job:
    """One :func:`rewrite_file` call, as stages run in order: :meth:`load` (the input, the
    output's staging, the size plan), :meth:`rewrite` (hazards, the rules, the report),
    :meth:`quantize`, :meth:`write` (the staged file, checked), :meth:`verify` (both files
    in ONNX Runtime), :meth:`benchmark`, :meth:`commit` (the file moved into place). Each
    stage reads what the earlier ones left here; a stage that fails raises, and nothing is
    written."""

    source: Path
    target: Path | None
    options: RewriteOptions
    rules: list
    progress: Progress
    loaded: _load.LoadedModel | None = None
    #: The sizes ``--verify`` and ``--benchmark`` run at (None: neither runs).
    plan: SizePlan | None = None
    staging: _save.Staging | None = None
    report: Report | None = None

    @classmethod
    def start(cls, source: Path, target: Path | None, options: RewriteOptions) -> _Job:
        """Options checked and rules chosen before any file is read."""
        _check_options(options)
        rules = (
            list(options.selected)
            if options.selected is not None
            else select(options.rules, target=options.target, exclude=options.exclude)
        )
        if options.verify or options.benchmark or options.quantize:
            runtime.require_onnxruntime()
        return cls(source, target, options, rules, options.progress or _NoProgress())

    def load(self, stack: contextlib.ExitStack) -> None:
        self.loaded = _load.load_model(self.source)
        if self.options.verify or self.options.benchmark:
            # read before the rewrite; the usage errors before the work
            self.plan = SizePlan.of(self.loaded.model, self.options.shapes)
            try:
                self.plan.check()
            except ValueError as error:
                raise BadOptions(str(error)) from None
        if self.target is not None:
            self.staging = stack.enter_context(
                _save.output_staging(self.target, self.loaded, in_place=self.options.in_place)
            )

    def done(self) -> Report:
        """The report :meth:`rewrite` made."""
        assert self.report is not None, "rewrite() first"
        return self.report

    def _staged(self) -> _save.Staging:
        assert self.staging is not None, "write() first"
        return self.staging

    def _model(self) -> _load.LoadedModel:
        assert self.loaded is not None, "load() first (and not after write())"
        return self.loaded

    def _sizes(self) -> SizePlan:
        assert self.plan is not None, "load() with verify or benchmark"
        return self.plan

    def rewrite(self) -> None:
        model = self._model().model
        hazards = diagnostics.find_hazards(model) if self.options.hazards else None
        self.progress.started(sum(1 for n in model.graph.all_nodes() if diagnostics.is_rnn(n)))
        report = _rewrite(model, self.rules, self.progress, self.options.target)
        if self.plan is not None:
            self.plan.add_rewritten(model)
        report.source, report.target = self.source, self.target
        if hazards is not None:
            report.hazards_before = hazards
            report.hazards_after = diagnostics.find_hazards(model)
        self.report = report
        unasked = self.target is not None and not self.options.allow_no_rnn
        if unasked and report.found_no_recurrence:
            report.target = None
            raise NoRecurrence(
                f"{self.source}: no RNN, LSTM, GRU or recurrence found; {self.target} not "
                "written (--allow-no-rnn writes it anyway)",
                report,
            )

    def quantize(self, stack: contextlib.ExitStack) -> None:
        """``--quantize int8``: ONNX Runtime's quantizer on the rewritten model, by files in
        the staging directory (or a temporary one for ``--check``)."""
        if not self.options.quantize:
            return
        where = None if self.staging is None else self.staging.directory
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="int8-", dir=where))
        task = self.progress.task("quantizing (onnxruntime quantize_dynamic)")
        source, external = _save_for_quantizer(self._model(), Path(scratch))
        self.loaded = None
        gc.collect()  # the float model, before the quantizer reads its own copy
        self.loaded, self.done().quantized = _quantize(source, external)
        task.done()

    def write(self, stack: contextlib.ExitStack) -> None:
        """The result to the staging file (a scratch one for ``--check --verify``)."""
        if self.staging is None:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="rnn-rewrite-"))
            self.staging = stack.enter_context(_save.Staging(Path(scratch) / self.source.name))
        writing = self.progress.task(f"writing {self.target or 'a scratch copy'}")
        loaded = self._model()
        self.staging.write(
            loaded.model, external_data=loaded.external_data, on_tensor=writing.update
        )
        del loaded
        writing.done()
        if self.target is not None:
            _check_result(self.staging.model_path)
        self.loaded = None  # the folded weights: verify loads one model at a time from disk
        gc.collect()

    def verify(self) -> None:
        if not self.options.verify:
            return
        plan = _verify.VerifyPlan(
            self._sizes(),
            seed=self.options.seed,
            tolerance=self.options.effective_tolerance,
            equivalent=time_major_equivalent,
        )
        report = self.done()
        report.verify = _run_verify(
            str(self.source), str(self._staged().model_path), plan, self.progress
        )
        if not report.verify.ok:
            where = f"; {self.target} not written" if self.target else ""
            raise VerifyFailed(f"verification failed{where}", report)

    def benchmark(self) -> None:
        """``--benchmark``: both files timed side by side; a slower result is not written
        unless ``keep_slower``."""
        if not self.options.benchmark:
            return
        report = self.done()
        report.benchmark = _run_benchmark(
            str(self.source),
            str(self._staged().model_path),
            self._sizes(),
            self.options,
            self.progress,
        )
        if report.benchmark.slower and not self.options.keep_slower and self.target:
            raise SlowerResult(
                f"the result is slower than the original beyond noise; {self.target} not "
                "written (--keep-slower writes it anyway)",
                report,
            )

    def commit(self) -> None:
        if self.target is not None:
            self._staged().commit()
            self.done().written = True
