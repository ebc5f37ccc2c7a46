"""The ``rnn-rewrite`` command: a thin layer over :func:`rnn_rewrite_rules.rewrite_file`.

Parsing, exit codes, the progress display and signals live here; the work is the library's.
Only the standard library is imported at start-up, so that Ctrl-C while onnx loads (the
first seconds) is handled like any other interrupt. SIGTERM and SIGHUP interrupt like
Ctrl-C: whatever was staged is removed and the exit code is 130.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import logging
import os
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rnn_rewrite_rules import __version__, errors

if TYPE_CHECKING:
    from onnxscript.rewriter import RewriteRule

    from rnn_rewrite_rules._rewrite_file import RewriteOptions

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
    NO_RECURRENCE = 16
    SLOWER = 17
    INTERRUPTED = 130


_EXIT_HELP = {
    ExitCode.OK: "success (--check: whatever hazards were found)",
    ExitCode.INTERNAL_ERROR: "internal error (please report it)",
    ExitCode.USAGE: "bad command line",
    ExitCode.INPUT_NOT_FOUND: "input file not found or unreadable",
    ExitCode.INPUT_IS_DIRECTORY: "input is a directory",
    ExitCode.NOT_ONNX: "input is not an ONNX model, or not a valid one (the ONNX checker)",
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
    ExitCode.NO_RECURRENCE: "no RNN, LSTM, GRU or recurrence found (nothing written; "
    "--allow-no-rnn writes it anyway)",
    ExitCode.SLOWER: "--benchmark: the result is slower than the original beyond noise "
    "(nothing written; --keep-slower writes it anyway)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C, SIGTERM or SIGHUP); nothing written",
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
        f"  {PROG} model.onnx -o fast.onnx --exclude reroll\n"
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
    _add_what_to_rewrite(parser)
    _add_target(parser)
    _add_checks(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="print no report")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _add_what_to_rewrite(parser: argparse.ArgumentParser) -> None:
    """IN, where the result goes, and which rules apply."""
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
    parser.add_argument(
        "--exclude",
        action="append",
        metavar="NAME,...",
        help="families or rules to leave out (e.g. --exclude reroll)",
    )
    parser.add_argument(
        "--allow-no-rnn",
        action="store_true",
        help="write the result even when the model has no RNN, LSTM, GRU or recurrence",
    )
    parser.add_argument("--list-rules", action="store_true", help="list families and rules")


def _add_checks(parser: argparse.ArgumentParser) -> None:
    """What is checked before the result is written: --verify, --quantize, --benchmark."""
    from rnn_rewrite_rules.benchmark import BUDGET_S

    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare IN and the result in ONNX Runtime on random inputs; write nothing if "
        "they differ",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        metavar="T",
        help="max abs diff (default 1e-4; 0.05 with --quantize int8)",
    )
    parser.add_argument(
        "--quantize",
        choices=["int8"],
        help="after the rewrite, ONNX Runtime's dynamic quantization (quantize_dynamic: "
        "LSTM -> DynamicQuantizeLSTM; GRU and RNN stay float)",
    )
    parser.add_argument(
        "--benchmark",
        action="store_true",
        help="time IN and the result side by side (ONNX Runtime, OpenVINO when installed) at "
        "--verify's sizes, repeating while the difference is within noise; write nothing if "
        "the result is slower beyond noise",
    )
    parser.add_argument(
        "--benchmark-budget",
        type=float,
        default=BUDGET_S,
        metavar="S",
        help=f"with --benchmark: seconds each size may take for more repeats while the "
        f"difference is within noise (default {BUDGET_S:g})",
    )
    parser.add_argument(
        "--keep-slower",
        action="store_true",
        help="with --benchmark: write the result even when it measured slower",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=DIMS",
        help="--verify and --benchmark sizes: an input's shape (input=1,7,256) or a dynamic "
        "axis' sizes, one per run (seq=1,9); repeatable",
    )
    parser.add_argument("--seed", type=int, default=0, help="--verify random seed (default 0)")


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
    # A decoder step (seq 1) at batch 5: where per-call overhead dominates.
    parser.add_argument("--batch", type=int, default=5, help="latency batch size (default 5)")
    parser.add_argument("--seq", type=int, default=1, help="latency sequence length (default 1)")
    parser.add_argument("--repeat", type=int, default=50, help="timed runs per model (default 50)")
    parser.add_argument(
        "--save-seed", metavar="PATH", help="also write the model built, to try the command on"
    )
    _add_target(parser)
    return parser


def _add_target(parser: argparse.ArgumentParser) -> None:
    from rnn_rewrite_rules.rules import DEFAULT_TARGET, TARGETS

    parser.add_argument(
        "--target",
        choices=list(TARGETS),
        default=DEFAULT_TARGET,
        help=f"what the result must run on (default {DEFAULT_TARGET}): "
        + "; ".join(f"{name}: {text}" for name, text in TARGETS.items()),
    )


def _error(message: str) -> None:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)


def _names(values: Sequence[str] | None, option: str = "--rules") -> list[str] | None:
    if not values:
        return None
    names = [n.strip() for value in values for n in value.split(",") if n.strip()]
    if not names:
        raise _Fail(ExitCode.USAGE, f"{option}: give at least one name")
    return names


def _select(
    values: Sequence[str] | None, target: str, exclude: Sequence[str] | None
) -> list[RewriteRule]:
    """The rules chosen, once: an unknown rule name fails early (before any file is read)."""
    from rnn_rewrite_rules._rewrite_file import select

    return select(_names(values), target=target, exclude=_names(exclude, "--exclude"))


def _list_rules() -> int:
    from rnn_rewrite_rules import _api, _report
    from rnn_rewrite_rules.rules import families

    available = families()
    if not available:
        print("no rule families are available")
        return ExitCode.OK
    print(f"rule families, in the order they are tried ({PROG} applies them all by default):")
    for family in available.values():
        note = "" if family.install_by_default else "  [not added by install()]"
        print(f"  {family.name}: {family.description}{note}")
        rules = [(_api.rule_name(r), _report.rule_description(r)) for r in family.rules]
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

    The display starts when :func:`rewrite_file` says how many RNN nodes the model has,
    and is erased when the ``with`` block ends, before the report is printed.
    """

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        #: rich's ``Progress`` once started (rich is optional: not imported to type it)
        self._progress: Any = None

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def started(self, rnn_nodes: int) -> None:
        if not self._enabled or rnn_nodes < PROGRESS_MIN_RNN_NODES or self._progress is not None:
            return
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
            return
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

    def task(self, description: str, total: int | None = None) -> _Task:
        if self._progress is None:
            return _Task()
        return _Task(self._progress, self._progress.add_task(description, total=total))


def _print(lines: Sequence[str]) -> None:
    print("\n".join(lines))


def _options(
    args: argparse.Namespace, progress: _Progress, rules: list[RewriteRule]
) -> RewriteOptions:
    from rnn_rewrite_rules._rewrite_file import RewriteOptions
    from rnn_rewrite_rules._size_plan import parse_shape_overrides

    try:
        shapes = parse_shape_overrides(args.shape)
    except ValueError as error:
        raise _Fail(ExitCode.USAGE, str(error)) from None
    return RewriteOptions(
        rules=_names(args.rules),
        exclude=_names(args.exclude, "--exclude"),
        selected=rules,
        allow_no_rnn=args.allow_no_rnn,
        target=args.target,
        in_place=args.in_place,
        hazards=args.check,
        verify=args.verify,
        tolerance=args.tolerance,
        shapes=shapes,
        seed=args.seed,
        progress=progress,
        quantize=args.quantize,
        benchmark=args.benchmark,
        keep_slower=args.keep_slower,
        benchmark_budget=args.benchmark_budget,
    )


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
    from rnn_rewrite_rules._rewrite_file import rewrite_file

    rules = _select(args.rules, args.target, args.exclude)
    if args.list_rules:
        return _list_rules()
    target = _validate_args(args)
    progress = _Progress(sys.stderr.isatty() and not args.quiet)
    with progress:
        report = rewrite_file(args.input, target, _options(args, progress, rules))
    for warning in report.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if not args.quiet:
        _print(report.lines())
        if report.written:
            print(f"wrote {target}")
    return ExitCode.OK


def _demo(args: argparse.Namespace) -> int:
    from rnn_rewrite_rules import _demo as _demo_module

    target = args.target
    _select(args.rules, target, None)
    if args.batch < 1 or args.seq < 1 or args.repeat < 1:
        raise _Fail(ExitCode.USAGE, "--batch, --seq and --repeat must be positive")
    _print(
        _demo_module.run(
            _names(args.rules),
            target=target,
            batch=args.batch,
            seq=args.seq,
            repeat=args.repeat,
            save_seed=args.save_seed,
        )
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


class _Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is so that clean-up code runs."""


#: The signals received during :func:`main` (names). A library may catch the
#: ``KeyboardInterrupt`` a handler raises and fail otherwise (an import interrupted half
#: way is an ``ImportError`` later; a writer cut off mid-call a ``TypeError``): an error
#: after a signal is the interrupt, never an internal error.
_received: list[str] = []


def _raise_signalled(signum: int, frame: object) -> None:
    name = signal.Signals(signum).name
    _received.append(name)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise _Signalled(name)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt``, SIGTERM and SIGHUP :class:`_Signalled`, each
    recorded in :data:`_received` (main thread only)."""
    names = [n for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    _received.clear()
    try:
        previous = {n: signal.signal(getattr(signal, n), _raise_signalled) for n in names}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def _import_libraries() -> None:
    """Import onnx, onnx-ir and onnxscript (what every command needs) with SIGINT, SIGTERM
    and SIGHUP blocked, delivered once they are in: a ``KeyboardInterrupt`` raised while
    a compiled extension initialises can crash the process (SIGSEGV, seen with onnx's).
    A signal waits for the imports (about a second) and then interrupts as usual."""
    blocked = {getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)}
    if not hasattr(signal, "pthread_sigmask"):  # no signal masks here
        importlib.import_module("rnn_rewrite_rules._rewrite_file")
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        importlib.import_module("rnn_rewrite_rules._rewrite_file")  # onnx, onnxscript
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _interrupted(how: str) -> int:
    _error(f"interrupted{how}; nothing written")
    return int(ExitCode.INTERRUPTED)


#: Each library error the command reports -> its exit code. A class not listed here, nor
#: any of its bases, is an internal error.
_EXIT_CODES: dict[type[Exception], ExitCode] = {
    errors.ModelNotFound: ExitCode.INPUT_NOT_FOUND,
    errors.ModelIsDirectory: ExitCode.INPUT_IS_DIRECTORY,
    errors.NotOnnx: ExitCode.NOT_ONNX,
    errors.DamagedModel: ExitCode.DAMAGED_MODEL,
    errors.UnsupportedModel: ExitCode.UNSUPPORTED_MODEL,
    errors.OutputNotWritable: ExitCode.OUTPUT_NOT_WRITABLE,
    errors.SameAsInput: ExitCode.OUTPUT_IS_INPUT,
    errors.ModelIOError: ExitCode.INTERNAL_ERROR,
    errors.UnsupportedVersionError: ExitCode.UNSUPPORTED_ONNXSCRIPT,
    errors.VerifyFailed: ExitCode.VERIFY_FAILED,
    errors.BadOptions: ExitCode.USAGE,
    errors.UnknownRule: ExitCode.UNKNOWN_RULE,
    errors.OnnxRuntimeMissing: ExitCode.NO_ONNXRUNTIME,
    errors.CannotVerify: ExitCode.CANNOT_VERIFY,
    errors.InvalidResult: ExitCode.INVALID_RESULT,
    errors.NoRecurrence: ExitCode.NO_RECURRENCE,
    errors.SlowerResult: ExitCode.SLOWER,
}

#: How the message of an error of these exit codes is shown (``{error}``: the error's own
#: message); every other one shows the error's message alone.
_MESSAGES: dict[ExitCode, str] = {
    ExitCode.USAGE: "{error} (see " + PROG + " --help)",
    ExitCode.NO_ONNXRUNTIME: "needs onnxruntime: {error}",
    ExitCode.CANNOT_VERIFY: "cannot verify: {error}",
}


def _failure(error: Exception) -> tuple[ExitCode, str] | None:
    """The exit code and message for a library error, None for an internal error."""
    for cls in type(error).__mro__:
        if cls in _EXIT_CODES:
            code = _EXIT_CODES[cls]
            return code, _MESSAGES.get(code, "{error}").format(error=error)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rnn-rewrite`` and ``python -m rnn_rewrite_rules``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    demo = argv[:1] == ["demo"]
    try:
        with _signals_interrupt(), _quiet_libraries():
            try:
                _import_libraries()  # the parser reads the targets from the rules too
                if demo:
                    return int(_demo(_demo_parser().parse_args(argv[1:])))
                return int(_run(_parser().parse_args(argv)))
            except _Fail:
                raise
            except Exception as error:
                failure = _failure(error)
                if failure is None:
                    raise
                if isinstance(error, errors.ReportedError):
                    _print(error.report.lines(header=not demo))
                code, message = failure
                if code == ExitCode.NO_ONNXRUNTIME:
                    message = f"{'demo' if demo else '--verify'} {message}"
                raise _Fail(code, message) from None
    except _Fail as failure:
        _error(failure.message)
        return int(failure.code)
    except KeyboardInterrupt as interrupt:
        return _interrupted(f" by {interrupt.args[0]}" if isinstance(interrupt, _Signalled) else "")
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(ExitCode.OK)
    except MemoryError:
        _error("out of memory; nothing written")
        return int(ExitCode.INTERNAL_ERROR)
    except Exception as error:
        if _received:  # a library turned the interrupt into another error
            return _interrupted("" if _received[0] == "SIGINT" else f" by {_received[0]}")
        message = str(error).splitlines()[0] if str(error) else ""
        _error(f"internal error: {type(error).__name__}: {message}; nothing written")
        return int(ExitCode.INTERNAL_ERROR)
