"""The ``rnn-rewrite`` command: rewrite, verify and check ONNX files on disk; ``demo``."""

from __future__ import annotations

import argparse
import contextlib
import enum
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx
import onnx_ir as ir

from rnn_rewrite_rules import __version__, _compat, _io, _lazy_io, _report, _verify, diagnostics
from rnn_rewrite_rules.rules import families, fixed_by, select_rules

__all__ = ["ExitCode", "main"]

PROG = "rnn-rewrite"
#: Progress is shown (on a terminal) for models with at least this many RNN nodes.
PROGRESS_MIN_RNN_NODES = 8


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL_ERROR = 1
    USAGE = 2
    INPUT_NOT_FOUND = 3
    INPUT_IS_DIRECTORY = 4
    NOT_ONNX = 5
    DAMAGED_MODEL = 6
    UNSUPPORTED_MODEL = 7
    UNKNOWN_RULE = 8
    OUTPUT_NOT_WRITABLE = 9
    OUTPUT_IS_INPUT = 10
    VERIFY_FAILED = 11
    NO_ONNXRUNTIME = 12
    CANNOT_VERIFY = 13
    INVALID_RESULT = 14
    UNSUPPORTED_ONNXSCRIPT = 15
    INTERRUPTED = 130


_EXIT_HELP = {
    ExitCode.OK: "success (--check: whatever hazards were found)",
    ExitCode.INTERNAL_ERROR: "internal error (please report it)",
    ExitCode.USAGE: "bad command line",
    ExitCode.INPUT_NOT_FOUND: "input file not found or unreadable",
    ExitCode.INPUT_IS_DIRECTORY: "input is a directory",
    ExitCode.NOT_ONNX: "input is not an ONNX model",
    ExitCode.DAMAGED_MODEL: "input is truncated or damaged (external data included)",
    ExitCode.UNSUPPORTED_MODEL: "unsupported opset (< 7 or newer than onnx knows) or IR version",
    ExitCode.UNKNOWN_RULE: "unknown rule or family name",
    ExitCode.OUTPUT_NOT_WRITABLE: "output cannot be written (directory missing or unwritable)",
    ExitCode.OUTPUT_IS_INPUT: "output is the input and --in-place was not given",
    ExitCode.VERIFY_FAILED: "--verify: outputs differ beyond --tolerance (nothing written)",
    ExitCode.NO_ONNXRUNTIME: "--verify or demo without onnxruntime installed",
    ExitCode.CANNOT_VERIFY: "--verify: the original model does not run on the chosen inputs",
    ExitCode.INVALID_RESULT: "the rewritten model fails the ONNX checker (nothing written)",
    ExitCode.UNSUPPORTED_ONNXSCRIPT: "the installed onnxscript is outside the tested range",
    ExitCode.INTERRUPTED: "interrupted",
}

_IO_CODES: dict[type[_io.ModelIOError], ExitCode] = {
    _io.ModelNotFound: ExitCode.INPUT_NOT_FOUND,
    _io.ModelIsDirectory: ExitCode.INPUT_IS_DIRECTORY,
    _io.NotOnnx: ExitCode.NOT_ONNX,
    _io.DamagedModel: ExitCode.DAMAGED_MODEL,
    _io.UnsupportedModel: ExitCode.UNSUPPORTED_MODEL,
    _io.OutputNotWritable: ExitCode.OUTPUT_NOT_WRITABLE,
    _io.SameAsInput: ExitCode.OUTPUT_IS_INPUT,
}


class _Fail(Exception):
    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + message
        raise _Fail(ExitCode.USAGE, f"{message} (see {self.prog} --help)")


def _epilog() -> str:
    codes = "\n".join(f"  {int(code):>3}  {text}" for code, text in _EXIT_HELP.items())
    return (
        "examples:\n"
        f"  {PROG} model.onnx -o fast.onnx --verify\n"
        f"  {PROG} model.onnx --check\n"
        f"  {PROG} model.onnx --in-place --rules layer_output,weight_folding\n"
        f"  {PROG} demo\n\n"
        f"exit codes:\n{codes}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        usage="%(prog)s IN.onnx (-o OUT.onnx | --in-place | --check) [options]\n"
        "       %(prog)s --list-rules\n"
        "       %(prog)s demo [--help]",
        description=(
            "Rewrite the LSTM/GRU/RNN parts of an ONNX model so it runs fast and portably.\n"
            "All rule families apply by default; the model is written only once complete."
        ),
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", nargs="?", metavar="IN.onnx", help="the model to rewrite")
    parser.add_argument("-o", "--output", metavar="OUT.onnx", help="where to write the result")
    parser.add_argument(
        "--in-place", action="store_true", help="replace IN (only once the new file is complete)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="report what would change and the RNN hazards found; write nothing",
    )
    parser.add_argument(
        "--rules",
        action="append",
        metavar="NAME,...",
        help="families or rules to apply (default: all, see --list-rules)",
    )
    parser.add_argument("--list-rules", action="store_true", help="list families and rules")
    parser.add_argument(
        "--portable",
        action="store_true",
        help="leave out rules whose output runtimes other than ONNX Runtime reject "
        "(tract 0.23.9: RNNs without initial_h and a symbolic batch)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare IN and the result in ONNX Runtime on random inputs; write nothing if "
        "they differ",
    )
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, metavar="T", help="max abs diff (default 1e-4)"
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=DIMS",
        help="--verify sizes: an input's shape (input=1,7,256) or a dynamic axis' sizes, one "
        "per run (seq=1,9); repeatable",
    )
    parser.add_argument("--seed", type=int, default=0, help="--verify random seed (default 0)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no report")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _demo_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=f"{PROG} demo",
        description=(
            "Build the 4-layer LSTM (input 256, hidden 256, batch_first) exactly as torch's\n"
            "exporter writes it, in memory and without torch; rewrite it, verify it, and time\n"
            "both in ONNX Runtime (1 thread)."
        ),
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rules", action="append", metavar="NAME,...", help="as for rewriting")
    # The mission's case: a decoder step (seq 1) at batch 5, where per-call overhead dominates.
    parser.add_argument("--batch", type=int, default=5, help="latency batch size (default 5)")
    parser.add_argument("--seq", type=int, default=1, help="latency sequence length (default 1)")
    parser.add_argument("--repeat", type=int, default=50, help="timed runs per model (default 50)")
    parser.add_argument(
        "--save-seed", metavar="PATH", help="also write the model built, to try the command on"
    )
    return parser


def _error(message: str) -> None:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)


def _names(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    names = [n.strip() for value in values for n in value.split(",") if n.strip()]
    if not names:
        raise _Fail(ExitCode.USAGE, "--rules: give at least one name")
    return names


def _select(values: Sequence[str] | None, portable: bool = False):
    try:
        return select_rules(_names(values), portable=portable)
    except KeyError as error:
        raise _Fail(
            ExitCode.UNKNOWN_RULE,
            f"unknown rule or family {error.args[0]!r} (see {PROG} --list-rules)",
        ) from None


def _rule_families() -> dict[str, str]:
    return {
        _report.rule_name(rule): family.name
        for family in families().values()
        for rule in family.rules
    }


def _list_rules() -> int:
    available = families()
    if not available:
        print("no rule families are available")
        return ExitCode.OK
    print(f"rule families, in the order they are tried ({PROG} applies them all by default):")
    for family in available.values():
        note = "" if family.install_by_default else "  [not added by install()]"
        print(f"  {family.name}: {family.description}{note}")
        rules = [(_report.rule_name(r), _report.rule_description(r)) for r in family.rules]
        width = max((len(name) for name, _ in rules), default=0)
        for name, description in rules:
            print(f"    {name:<{width}}  {description}".rstrip())
    return ExitCode.OK


class _Task:
    def __init__(self, progress=None, task_id=None) -> None:
        self._progress = progress
        self._id = task_id

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._id)

    def update(self, completed: int, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._id, completed=completed, total=total)

    def done(self) -> None:
        if self._progress is not None:
            task = self._progress.tasks[self._id]
            self._progress.update(self._id, total=task.total or 1, completed=task.total or 1)


class _Progress:
    """rich progress bars on stderr, or nothing (not a terminal, few RNNs, rich missing).

    Each ``with`` block is one display, erased at its end, so that what is printed between
    blocks reaches stdout intact.
    """

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._progress = None

    def __enter__(self) -> _Progress:
        if not self._enabled:
            return self
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )
        except ImportError:
            self._enabled = False
            return self
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def task(self, description: str, total: int | None = None) -> _Task:
        if self._progress is None:
            return _Task()
        return _Task(self._progress, self._progress.add_task(description, total=total))


def _rewrite(
    model: ir.Model, rules: list, progress: _Progress
) -> tuple[_report.ModelStats, _report.ModelStats, dict, list[_report.Unimproved]]:
    before = _report.model_stats(model)
    node_total = sum(1 for _ in model.graph.all_nodes())
    current = [_Task()]

    def on_round(number: int) -> None:
        current[0].done()
        current[0] = progress.task(f"rewriting, round {number + 1}", node_total)

    fired = _report.rewrite_counting(
        model, rules, on_node=lambda: current[0].advance(), on_round=on_round
    )
    current[0].done()
    explain = progress.task("explaining what was not rewritten")
    unimproved = _report.unimproved_rnns(model, rules, _rule_families())
    explain.done()
    return before, _report.model_stats(model), fired, unimproved


def _print(lines: Sequence[str]) -> None:
    print("\n".join(lines))


def _verify_models(
    before: str | bytes,
    after: str | bytes,
    specs: list[_verify.InputSpec],
    overrides: dict,
    *,
    seed: int,
    tolerance: float,
    progress: _Progress,
) -> _verify.VerifyResult:
    task = progress.task("verifying in ONNX Runtime", len(_verify.plan_runs(specs, overrides)))
    try:
        result = _verify.verify(
            before,
            after,
            specs,
            overrides=overrides,
            seed=seed,
            tolerance=tolerance,
            on_run=task.advance,
        )
    except _verify.CannotVerify as error:
        raise _Fail(ExitCode.CANNOT_VERIFY, f"cannot verify: {error}") from None
    task.done()
    return result


def _check_result(path: Path, original: Path) -> None:
    """The ONNX checker on the staged file; tolerated when the original fails it too."""
    try:
        _lazy_io.check_model_file(path)  # the tensors' bytes stay on disk
    except Exception as error:  # onnx raises ValidationError and friends
        try:
            onnx.checker.check_model(str(original))
        except Exception:
            first = " ".join(str(error).split())[:200]
            print(
                f"{PROG}: warning: the result fails the ONNX checker ({first}); "
                "so does the input, writing anyway",
                file=sys.stderr,
            )
            return
        raise _Fail(
            ExitCode.INVALID_RESULT,
            f"the rewritten model is invalid ({str(error).splitlines()[0]}); nothing written",
        ) from None


def _validate_args(args: argparse.Namespace) -> Path | None:
    """The target path, or None for --check."""
    if args.input is None:
        raise _Fail(ExitCode.USAGE, f"give IN.onnx (see {PROG} --help)")
    if args.check:
        if args.output or args.in_place:
            raise _Fail(ExitCode.USAGE, "--check writes nothing: drop -o/--in-place")
        return None
    if args.in_place:
        if args.output and os.path.realpath(args.output) != os.path.realpath(args.input):
            raise _Fail(ExitCode.USAGE, "--in-place writes IN: drop -o or --in-place")
        return Path(args.input)
    if not args.output:
        raise _Fail(ExitCode.USAGE, "give -o OUT.onnx, --in-place or --check")
    return Path(args.output)


def _run(args: argparse.Namespace) -> int:
    rules = _select(args.rules, getattr(args, "portable", False))
    if args.list_rules:
        return _list_rules()
    target = _validate_args(args)
    if not args.tolerance >= 0:  # also rejects NaN
        raise _Fail(ExitCode.USAGE, f"--tolerance must be >= 0, not {args.tolerance}")
    if args.shape and not args.verify:
        raise _Fail(ExitCode.USAGE, "--shape only sets --verify's input sizes: add --verify")
    try:
        overrides = _verify.parse_shape_overrides(args.shape)
    except ValueError as error:
        raise _Fail(ExitCode.USAGE, str(error)) from None
    if args.verify:
        try:
            _verify.require_onnxruntime()
        except _verify.OnnxRuntimeMissing as error:
            raise _Fail(ExitCode.NO_ONNXRUNTIME, f"--verify needs onnxruntime: {error}") from None
    source = Path(args.input)
    loaded = _io.load_model(source)
    with contextlib.ExitStack() as stack:
        staging = None
        if target is not None:
            _io.check_output_path(target, source, in_place=args.in_place)
            # the input's external data must survive unless the input itself is replaced
            same_dir = os.path.realpath(target.parent) == os.path.realpath(source.parent)
            keep = loaded.data_files if same_dir and not args.in_place else frozenset()
            staging = stack.enter_context(_io.Staging(target, keep_away=keep))
        model = loaded.model
        specs = _verify.input_specs(model)
        if args.verify:
            try:
                _verify.plan_runs(specs, overrides)
            except ValueError as error:
                raise _Fail(ExitCode.USAGE, str(error)) from None
            except _verify.CannotVerify as error:
                raise _Fail(ExitCode.CANNOT_VERIFY, f"cannot verify: {error}") from None
        hazards = diagnostics.find_hazards(model) if args.check else []
        rnn_count = sum(1 for n in model.graph.all_nodes() if diagnostics.is_rnn(n))
        show = sys.stderr.isatty() and rnn_count >= PROGRESS_MIN_RNN_NODES and not args.quiet
        progress = _Progress(show)
        with progress:
            before, after, fired, unimproved = _rewrite(model, rules, progress)
        report = [f"{source} -> {target}" if target else f"{source}: --check, nothing written"]
        report += _report.format_report(
            before,
            after,
            fired,
            unimproved,
            rule_families=_rule_families(),
            rules_used=len(rules),
        )
        if args.check:
            report += _hazard_lines(hazards, diagnostics.find_hazards(model))
        if not args.quiet:
            _print(report)
        if staging is None:
            if args.verify:
                with (
                    tempfile.TemporaryDirectory(prefix="rnn-rewrite-") as scratch,
                    _io.Staging(Path(scratch) / source.name) as scratch_stage,
                    progress,
                ):
                    scratch_stage.write(model, external_data=loaded.external_data)
                    result = _verify_models(
                        str(source),
                        str(scratch_stage.model_path),
                        specs,
                        overrides,
                        seed=args.seed,
                        tolerance=args.tolerance,
                        progress=progress,
                    )
                _print(result.lines())
                return ExitCode.OK if result.ok else ExitCode.VERIFY_FAILED
            return ExitCode.OK
        with progress:
            writing = progress.task(f"writing {target}")
            staging.write(model, external_data=loaded.external_data, on_tensor=writing.update)
            writing.done()
            _check_result(staging.model_path, source)
            if args.verify:
                result = _verify_models(
                    str(source),
                    str(staging.model_path),
                    specs,
                    overrides,
                    seed=args.seed,
                    tolerance=args.tolerance,
                    progress=progress,
                )
        if args.verify:
            _print(result.lines())
            if not result.ok:
                raise _Fail(ExitCode.VERIFY_FAILED, f"verification failed; {target} not written")
        staging.commit()
        if not args.quiet:
            print(f"wrote {target}")
    return ExitCode.OK


def _hazard_lines(before: list[diagnostics.Hazard], after: list[diagnostics.Hazard]) -> list[str]:
    if not before:
        return ["hazards: none found"]
    lines = [f"hazards ({len(before)}):"]
    lines += [f"  {hazard}" for hazard in before]
    kinds = {kind: sum(h.kind == kind for h in after) for kind in diagnostics.KINDS}
    remaining = ", ".join(f"{kind} x{count}" for kind, count in kinds.items() if count)
    lines.append(f"after the rewrite: {len(after)} remain" + (f" ({remaining})" if after else ""))
    # the RNN hazards rules target are listed with their reasons under "RNN nodes not improved"
    lines += [f"  {hazard}" for hazard in after if hazard.kind not in fixed_by()]
    return lines


def _latency(
    source: bytes, feeds: dict, repeat: int, *, optimize: bool = True
) -> tuple[float, float]:
    """(session creation, median run) in seconds, ONNX Runtime with 1 thread."""
    from rnn_rewrite_rules import _ort

    start = time.perf_counter()
    session = _ort.session(source, threads=1, optimize=optimize)
    created = time.perf_counter() - start
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return created, statistics.median(times)


def _demo(args: argparse.Namespace) -> int:
    from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model, random_inputs

    rules = _select(args.rules, getattr(args, "portable", False))
    if args.batch < 1 or args.seq < 1 or args.repeat < 1:
        raise _Fail(ExitCode.USAGE, "--batch, --seq and --repeat must be positive")
    try:
        ort_version = _verify.require_onnxruntime()
    except _verify.OnnxRuntimeMissing as error:
        raise _Fail(ExitCode.NO_ONNXRUNTIME, f"demo needs onnxruntime: {error}") from None
    cfg = RnnConfig(input_size=256, hidden_size=256, num_layers=4, batch_first=True)
    proto = build_torchlib_model(cfg)
    before_bytes = proto.SerializeToString()
    if args.save_seed:
        target = _io.check_output_path(args.save_seed, None, in_place=False)
        with _io.Staging(target) as staging:
            staging.write(ir.serde.deserialize_model(proto))
            staging.commit()
    model = ir.serde.deserialize_model(proto)
    specs = _verify.input_specs(model)
    with _Progress(False) as progress:
        before, after, fired, unimproved = _rewrite(model, rules, progress)
    after_bytes = ir.serde.serialize_model(model).SerializeToString()
    lines = [
        "demo: nn.LSTM(256, 256, num_layers=4, batch_first=True) as torch.onnx.export(dynamo=True) "
        "writes it (built in memory)"
    ]
    if args.save_seed:
        lines.append(f"  seed model written to {args.save_seed}")
    lines += _report.format_report(
        before, after, fired, unimproved, rule_families=_rule_families(), rules_used=len(rules)
    )
    _print(lines)
    result = _verify_models(
        before_bytes, after_bytes, specs, {}, seed=0, tolerance=1e-4, progress=progress
    )
    _print(result.lines())
    if not result.ok:
        return ExitCode.VERIFY_FAILED
    feeds = random_inputs(cfg, args.batch, args.seq, rng=0)
    created_b, run_b = _latency(before_bytes, feeds, args.repeat)
    created_a, run_a = _latency(after_bytes, feeds, args.repeat)
    _, plain_b = _latency(before_bytes, feeds, args.repeat, optimize=False)
    _, plain_a = _latency(after_bytes, feeds, args.repeat, optimize=False)
    _print(
        [
            f"latency: onnxruntime {ort_version}, 1 thread, batch {args.batch}, seq {args.seq}, "
            f"median of {args.repeat}",
            f"  {'':<30}  {'before':>9}  {'after':>9}",
            f"  {'nodes':<30}  {before.nodes:>9}  {after.nodes:>9}",
            f"  {'session load':<30}  {created_b * 1e3:>6.1f} ms  {created_a * 1e3:>6.1f} ms",
            f"  {'run':<30}  {run_b * 1e3:>6.2f} ms  {run_a * 1e3:>6.2f} ms"
            f"  ({run_b / run_a:.2f}x)",
            f"  {'run, graph optimizations off':<30}  {plain_b * 1e3:>6.2f} ms  "
            f"{plain_a * 1e3:>6.2f} ms  ({plain_b / plain_a:.2f}x)",
        ]
    )
    return ExitCode.OK


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    """Library warnings and log records would break the one-line error contract."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "onnx")]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rnn-rewrite`` and ``python -m rnn_rewrite_rules``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with _quiet_libraries():
            if argv[:1] == ["demo"]:
                return int(_demo(_demo_parser().parse_args(argv[1:])))
            return int(_run(_parser().parse_args(argv)))
    except _Fail as failure:
        _error(failure.message)
        return int(failure.code)
    except _io.ModelIOError as error:
        _error(str(error))
        return int(_IO_CODES.get(type(error), ExitCode.INTERNAL_ERROR))
    except _compat.UnsupportedVersionError as error:
        _error(str(error))
        return int(ExitCode.UNSUPPORTED_ONNXSCRIPT)
    except KeyboardInterrupt:
        _error("interrupted; nothing written")
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(ExitCode.OK)
    except MemoryError:
        _error("out of memory; nothing written")
        return int(ExitCode.INTERNAL_ERROR)
    except Exception as error:
        message = str(error).splitlines()[0] if str(error) else ""
        _error(f"internal error: {type(error).__name__}: {message}; nothing written")
        return int(ExitCode.INTERNAL_ERROR)
