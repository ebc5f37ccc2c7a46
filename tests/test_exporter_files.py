"""Every committed real exporter output (``tests/data/exporters/*/manifest.json``): it loads,
runs in ONNX Runtime at the export sizes and at other sizes of each role not frozen, and
the default rewrite gives equal outputs at each of those sizes with never more nodes
(but for an exact zero-step branch, which holds a Loop as written: ``loop_scan``).

Sizes with a 0 run in a child process where the model holds an LSTM or GRU: ONNX Runtime
aborts the process on LSTM/GRU at batch 0 and on GRU at seq 0, and at seq 0 its LSTM
returns Y_h zeros and Y_c from uninitialised memory rather than the initial states. So at
a 0 where either model holds such a node, ORT is not an oracle for values: its shapes are
compared, and the values in ``onnx.reference`` where that runs the original. Where ORT
aborts, ``onnx.reference`` runs the model instead (both, when it is the original); a size
neither runs the original at is skipped. Files marked ``invalid`` must fail the ONNX
checker; files marked ``refuse: ...`` keep every recurrent op; sizes in ``fails_at`` must
still fail on the original.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.testing.fuzz.oracles import reference_evaluator
from tests.exporter_files import DATA, ExporterFile, exporter_files, load_manifests, make_feeds
from tests.exporter_files import size_plans as plans_of
from tests.exporter_support import all_op_counts, rewrite_file_once

FILES = exporter_files()
RUNNABLE = [f for f in FILES if f.expect != "invalid"]
INVALID = [f for f in FILES if f.expect == "invalid"]
RECURRENT = ("LSTM", "GRU", "RNN", "Loop", "Scan", "DynamicQuantizeLSTM")
#: What ONNX Runtime aborts the process on at a size 0.
ABORTS_AT_ZERO = ("LSTM", "GRU", "DynamicQuantizeLSTM")
RTOL, ATOL = 1e-4, 1e-5


def _ids(files: list[ExporterFile]) -> list[str]:
    return [f.id for f in files]


@functools.cache
def _original(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))


@functools.cache
def _rewritten(path: Path) -> onnx.ModelProto:
    return rnn_rewrite_rules.rewrite(_original(path))


def _dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    return {
        i.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
        for i in model.graph.input
    }


_CHILD = """
import sys, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.log_severity_level = 4; o.intra_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
feeds = dict(np.load(sys.argv[2]))
try:
    out = s.run(None, feeds)
except Exception as e:
    print(" ".join(str(e).split())[:300]); sys.exit(3)
np.savez(sys.argv[3], *out)
"""


class Aborted(Exception):
    """ONNX Runtime ended the process."""


class Fails(Exception):
    """ONNX Runtime raised."""


def _run_in_child(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp, n) for n in ("m.onnx", "in.npz", "out.npz")]
        paths[0].write_bytes(model.SerializeToString())
        np.savez(paths[1], **feeds)
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, *map(str, paths)], capture_output=True, text=True
        )
        if child.returncode < 0 or child.returncode not in (0, 3):
            raise Aborted(f"exit {child.returncode}: {child.stderr.strip()[-300:]}")
        if child.returncode == 3:
            raise Fails(child.stdout.strip())
        with np.load(paths[2]) as out:
            return [out[f"arr_{i}"] for i in range(len(out.files))]


class _Runner:
    """One model, run in this process (one session) or, where ORT may abort, in a child."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.aborts_at_zero = any(op in all_op_counts(model) for op in ABORTS_AT_ZERO)
        self._session = None

    def reference(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return [np.asarray(v) for v in reference_evaluator(self.model).run(None, feeds)]
        except Exception as error:
            raise Fails(f"onnx.reference: {' '.join(str(error).split())[:300]}") from None

    def run(self, feeds: dict[str, np.ndarray], has_zero: bool) -> list[np.ndarray]:
        if has_zero and self.aborts_at_zero:
            return _run_in_child(self.model, feeds)
        if self._session is None:
            self._session = runtime.session(self.model, log_level=4)
        try:
            return self._session.run(None, feeds)
        except Exception as error:
            raise Fails(" ".join(str(error).split())[:300]) from None


def _shapes(outputs: list[np.ndarray]) -> list[tuple[int, ...]]:
    return [output.shape for output in outputs]


def _assert_equal(
    expected: list[np.ndarray], actual: list[np.ndarray], sizes: dict, *, values: bool
) -> None:
    assert len(actual) == len(expected)
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got.shape == want.shape, f"output {index} at {sizes}"
        if values:
            np.testing.assert_allclose(
                got, want, rtol=RTOL, atol=ATOL, err_msg=f"output {index} at {sizes}"
            )


def test_every_manifest_lists_its_files_and_inputs() -> None:
    """Each manifest names files that exist, every .onnx in its folder, each graph input,
    and an export size for every role; an exporter folder without a manifest fails."""
    folders = {p.parent for p in DATA.glob("*/*.onnx")}
    manifests = dict(load_manifests())
    assert folders <= {p.parent for p in manifests}, "exporter folders without a manifest"
    for path, manifest in manifests.items():
        listed = [m["file"] for m in manifest["models"]]
        assert len(listed) == len(set(listed)), f"{path}: a file listed twice"
        on_disk = sorted(p.name for p in path.parent.glob("*.onnx"))
        assert sorted(listed) == on_disk, f"{path}: manifest and folder differ"
        assert manifest["exporter"] == path.parent.name
        assert manifest["versions"], f"{path}: no versions recorded"
    for file in FILES:
        declared = [i.name for i in _original(file.path).graph.input]
        assert sorted(file.entry["inputs"]) == sorted(declared), file.id
        assert set(file.roles()) <= set(file.export_sizes), file.id
        assert file.frozen <= set(file.roles()), file.id
        assert file.expect in ("rewrite", "invalid") or file.expect.startswith("refuse: ")


@pytest.mark.parametrize("file", INVALID, ids=_ids(INVALID))
def test_invalid_files_fail_the_checker(file: ExporterFile) -> None:
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(_original(file.path), full_check=True)


def _reference_unless_shared_defect(
    runners: tuple[_Runner, _Runner], feeds: dict[str, np.ndarray], expected: list[np.ndarray]
) -> list[np.ndarray] | None:
    """The rewritten model's outputs in ``onnx.reference`` (ORT aborted on it at a 0);
    None when the reference is no oracle of the original here: it fails on it (which ORT
    ran), or shapes its outputs otherwise than ORT does (``expected``): no engine runs
    the rewrite at this size then. Else it must run the rewrite. The reference's Loop
    stacks its scan outputs (``testing.fuzz.oracles.reference_evaluator``: onnx 1.23's
    concatenates steps of rank 2 on their first axis)."""
    try:
        reference = runners[0].reference(feeds)
    except Fails:
        return None
    if _shapes(reference) != _shapes(expected):
        return None
    return runners[1].reference(feeds)


@pytest.mark.parametrize("file", RUNNABLE, ids=_ids(RUNNABLE))
def test_rewrite_keeps_outputs_at_every_size(file: ExporterFile) -> None:
    """The original runs at every size but 0 (where the runtime may refuse it); the
    rewrite runs wherever it does and gives the same outputs, with never more nodes."""
    original = _original(file.path)
    onnx.checker.check_model(original)
    rewritten = _rewritten(file.path)
    onnx.checker.check_model(rewritten)
    before, after = all_op_counts(original), all_op_counts(rewritten)
    outside = all_op_counts(rewritten, exact=False).total()
    assert outside <= before.total(), f"{before.total()} -> {outside} nodes (exact branches aside)"
    if file.expect.startswith("refuse"):
        kept = {op: (before[op], after[op]) for op in RECURRENT if before[op] or after[op]}
        assert all(b == a for b, a in kept.values()), f"a refused recurrence changed: {kept}"
    dtypes = _dtypes(original)
    runners = _Runner(original), _Runner(rewritten)
    ran = 0
    for seed, sizes in enumerate(plans_of(file)):
        feeds = make_feeds(file, sizes, dtypes, np.random.default_rng(seed))
        has_zero = 0 in sizes.values()
        known = file.fails_at(sizes)
        try:
            expected, engine = runners[0].run(feeds, has_zero), "ort"
        except Fails as error:
            assert has_zero or known, f"the original fails at {sizes}: {error}"
            continue  # the runtime does not run the original at this size
        except Aborted:  # ORT's own defect at a 0: the reference evaluator, where it runs
            try:
                expected, engine = runners[0].reference(feeds), "reference"
            except Fails:
                continue
        assert not known, f"the original runs at {sizes}, recorded as failing: {known}"
        if engine == "reference":
            actual = runners[1].reference(feeds)
        else:
            try:
                actual = runners[1].run(feeds, has_zero)
            except Aborted:
                found = _reference_unless_shared_defect(runners, feeds, expected)
                if found is None:
                    continue
                actual = found
        # ORT's LSTM/GRU at a 0 give no reliable values (see the module docstring): the
        # shapes are ORT's, the values onnx.reference's where it runs the original
        ort_zero = has_zero and engine == "ort" and any(r.aborts_at_zero for r in runners)
        _assert_equal(expected, actual, sizes, values=not ort_zero)
        if ort_zero:
            try:
                reference = runners[0].reference(feeds)
            except Fails:
                reference = None
            # an oracle only where it shapes the original as ORT does (its Loop of no step
            # fails, whatever the declaration)
            if reference is not None and _shapes(reference) == _shapes(expected):
                _assert_equal(reference, runners[1].reference(feeds), sizes, values=True)
        ran += 1
    assert ran >= 2 if set(file.roles()) - file.frozen else ran >= 1


@pytest.mark.parametrize("file", RUNNABLE, ids=_ids(RUNNABLE))
def test_rewrite_file_writes_a_valid_model_or_refuses(file: ExporterFile) -> None:
    """The file path (normalisation, rules, the journal's undo, cleanup, the checker) on
    each file: a checked model written, or NoRecurrence and nothing written; never
    InvalidResult (a jax2onnx one-step LSTM lost its Gemm bias initializer when the undone
    Gemm came back). The rewrite is shared with tests/test_exporter_table.py."""
    done = rewrite_file_once(file.path)
    if done.error is not None:
        raise done.error
    if done.refused:
        assert done.written is None
        return
    assert done.written is not None
    onnx.checker.check_model(done.written, full_check=True)
