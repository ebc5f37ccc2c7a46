"""The default rewrite on real third-party models (the corpus of ``tools/corpus``).

For every corpus file present (``python tools/corpus/fetch.py`` downloads them into
``build/corpus/`` or ``$RNN_CORPUS_DIR``; absent files are skipped, saying so):

* ``rewrite_file(..., verify=True)`` (``rnn-rewrite --verify``): the outputs are equal
  in ONNX Runtime at every run of the entry's sizes (each dynamic axis at sizes other
  than the export's, 0 where the model has one: ``verify`` runs those in child processes,
  where ONNX Runtime may abort on LSTM/GRU batch 0 or GRU seq 0, and notes it);
* the result passes ``onnx.checker`` (full check) and keeps the outputs' names and types;
* rewriting the result again fires no rule and changes no node count;
* ``rnn-rewrite --check`` reports on the file without an error;
* portability: where OpenVINO or tract runs the original with ONNX Runtime's outputs,
  it runs the result with them too; where the original runs there but differs, the
  result must still run.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules._report import verify_lines
from tests.support import run

# tools/ is not in every copy of the tests (mutmut's mutants/ has none of it)
manifest = pytest.importorskip("tools.corpus.manifest", reason="tools/corpus is not here")
runtimes = pytest.importorskip("tools.corpus.runtimes", reason="tools/corpus is not here")

pytestmark = pytest.mark.corpus

ENTRIES = list(manifest.CORPUS)
ATOL = 1e-4
_rewritten: dict[str, tuple[rnn_rewrite_rules.Report, Path]] = {}


def _source(entry: manifest.Entry) -> Path:
    directory = manifest.corpus_dir()
    path = manifest.present(entry, directory)
    if path is None:
        pytest.skip(
            f"{entry.filename} is not in {directory}: run `{manifest.FETCH_COMMAND}` "
            "(or set RNN_CORPUS_DIR)"
        )
    found = manifest.sha256_file(path)
    assert found == entry.sha256, (
        f"{path} has sha256 {found}, not the pinned {entry.sha256}: "
        f"run `{manifest.FETCH_COMMAND}` to replace it"
    )
    return path


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def _rewrite(entry: manifest.Entry, scratch: Path) -> tuple[rnn_rewrite_rules.Report, Path]:
    """The entry rewritten and verified once per session (shared by the tests below)."""
    if entry.name not in _rewritten:
        source = _source(entry)
        target = scratch / entry.filename
        options = rnn_rewrite_rules.RewriteOptions(
            verify=True,
            shapes=dict(entry.sizes),
            tolerance=entry.tolerance,
            allow_no_rnn=True,  # a Loop-held LSTM counts as no recurrence (mk8dx)
        )
        try:
            report = rnn_rewrite_rules.rewrite_file(source, target, options)
        except rnn_rewrite_rules.VerifyFailed as error:
            pytest.fail("\n".join(verify_lines(error.report.verify)))
        _rewritten[entry.name] = (report, target)
    return _rewritten[entry.name]


def _outputs(path: Path) -> list[tuple[str, int]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [(o.name, o.type.tensor_type.elem_type) for o in graph.output]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_outputs_stay_equal_at_other_sizes(entry: manifest.Entry, scratch: Path) -> None:
    report, target = _rewrite(entry, scratch)
    result = report.verify
    assert report.written and result is not None and result.ok, "\n".join(report.lines())
    for axis, sizes in entry.sizes.items():
        compared = {size for plan in result.runs for size in _axis_sizes(target, plan, axis)}
        assert len(compared) >= 2, f"{axis} compared at {sorted(compared)} only"
        if 0 in sizes:  # compared at 0, or ONNX Runtime aborts there (noted)
            aborted = any("aborts" in note for note in result.notes)
            assert 0 in compared or aborted, "\n".join(verify_lines(result))


def _axis_sizes(path: Path, plan: dict[str, tuple[int, ...]], axis: str) -> set[int]:
    """The sizes ``axis`` took in ``plan`` (one run's input shapes)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    found = set()
    for value in graph.input:
        for index, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param == axis and value.name in plan:
                found.add(plan[value.name][index])
    return found


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_result_is_valid_and_keeps_the_outputs(entry: manifest.Entry, scratch: Path) -> None:
    report, target = _rewrite(entry, scratch)
    onnx.checker.check_model(str(target), full_check=True)
    assert _outputs(target) == _outputs(report.source)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_rewriting_twice_equals_once(entry: manifest.Entry, scratch: Path) -> None:
    report, target = _rewrite(entry, scratch)
    again = rnn_rewrite_rules.rewrite_file(target, None)
    assert not again.fired, f"rules fired on the result: {dict(again.fired)}"
    assert again.after.op_counts == report.after.op_counts


@pytest.mark.command
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_check_reports_on_the_file(entry: manifest.Entry, tmp_path: Path) -> None:
    source = _source(entry)
    done = run(source, "--check", cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "nodes:" in done.stdout and "Traceback" not in done.stderr


#: Known failures (strict: the test says when one is fixed).
KNOWN_ZERO_ABORTS: dict[tuple[str, str], str] = {}
ZERO_CASES = [
    pytest.param(
        e,
        axis,
        id=f"{e.name}-{axis}",
        marks=[pytest.mark.xfail(strict=True, reason=KNOWN_ZERO_ABORTS[(e.name, axis)])]
        if (e.name, axis) in KNOWN_ZERO_ABORTS
        else [],
    )
    for e in ENTRIES
    for axis in e.zero_apart
]


@pytest.mark.parametrize(("entry", "axis"), ZERO_CASES)
def test_a_size_0_aborts_no_more_than_in_the_original(
    entry: manifest.Entry, axis: str, scratch: Path
) -> None:
    """Each model in its own process: where the original runs at 0, so must the result."""
    report, target = _rewrite(entry, scratch)
    sizes = {**runtimes.run_sizes(entry.sizes)[0], axis: 0}
    feeds = runtimes.feeds(report.source, sizes)
    original = runtimes.onnxruntime_child(report.source, feeds)
    if isinstance(original, str):
        pytest.skip(f"the original does not run at {axis}=0 either: {original}")
    result = runtimes.onnxruntime_child(target, feeds)
    assert not isinstance(result, str), f"the original runs at {axis}=0, the result: {result}"
    assert runtimes.agree(result, original, ATOL)


@pytest.mark.tract
@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_the_result_runs_wherever_the_original_runs(entry: manifest.Entry, scratch: Path) -> None:
    pytest.importorskip("openvino", reason="openvino (part of the test extra) is not installed")
    pytest.importorskip("tract", reason="tract (part of the test extra) is not installed")
    report, target = _rewrite(entry, scratch)
    source = report.source
    runs = [
        runtimes.feeds(source, sizes, seed)
        for seed, sizes in enumerate(runtimes.run_sizes(entry.sizes, zero=False))
    ]
    truth = runtimes.onnxruntime(source, runs)
    rewritten = runtimes.onnxruntime(target, runs)
    problems = [
        f"onnxruntime, run {i}: the rewrite differs from the original"
        for i, (t, r) in enumerate(zip(truth, rewritten, strict=True))
        if not runtimes.agree(r, t, ATOL)
    ]
    before, after = runtimes.tract([source, target], runs)
    outcomes = {
        "openvino": (runtimes.openvino(source, runs), runtimes.openvino(target, runs)),
        "tract": (before, after),
    }
    for name, (original, result) in outcomes.items():
        for index, (t, o, r) in enumerate(zip(truth, original, result, strict=True)):
            if isinstance(o, str):
                continue  # the original does not run there: nothing asked
            if isinstance(r, str):
                problems.append(f"{name}, run {index}: the original runs, the rewrite fails: {r}")
            elif runtimes.agree(o, t, ATOL) and not runtimes.agree(r, t, ATOL):
                problems.append(f"{name}, run {index}: the original is right, the rewrite wrong")
    assert not problems, "\n".join(problems)
