"""The ``rnn-rewrite`` command, run as a real subprocess (console script and ``python -m``).

Plus in-process tests of what the command is built from (load/save, verification plans,
hazard detection, the report's reasons).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet

import rnn_rewrite_rules
from rnn_rewrite_rules import _api, _load, _report, _save, diagnostics, errors
from rnn_rewrite_rules._size_plan import input_specs, plan_runs
from rnn_rewrite_rules.cli import ExitCode, main
from rnn_rewrite_rules.rules import families
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from tests.support import (
    BASE_ENV,
    assert_equivalent,
    assert_one_line_error,
    layout1_model,
    leftovers,
    op_counts,
    run,
)

SMALL = RnnConfig(input_size=8, hidden_size=16, num_layers=2, batch_first=True)
#: Enough RNN nodes for the progress display (cli.PROGRESS_MIN_RNN_NODES).
DEEP = RnnConfig(input_size=4, hidden_size=4, num_layers=10)


def in_process(code: int, capsys) -> subprocess.CompletedProcess:
    """main()'s result in the shape of a subprocess'."""
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([], code, captured.out, captured.err)


def frozen_model() -> onnx.ModelProto:
    """SMALL with layer 0's output Reshape frozen to seq=3, as torch's exporter does."""
    model = build_torchlib_model(SMALL)
    producers = {out: node for node in model.graph.node for out in node.output}
    reshape = next(
        node
        for node in model.graph.node
        if node.op_type == "Reshape" and producers[node.input[0]].op_type == "Transpose"
    )
    target = np.array([3, -1, SMALL.hidden_size], dtype=np.int64)
    model.graph.initializer.append(numpy_helper.from_array(target, "frozen_target"))
    reshape.input[1] = "frozen_target"
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    onnx.save(build_torchlib_model(SMALL), root / "small.onnx")
    onnx.save(build_torchlib_model(DEEP), root / "deep.onnx")
    onnx.save(layout1_model(), root / "layout1.onnx")
    onnx.save(frozen_model(), root / "frozen.onnx")
    onnx.save(
        build_torchlib_model(SMALL),
        root / "external.onnx",
        save_as_external_data=True,
        location="external.onnx.data",
        size_threshold=256,
    )
    return root


def report_op_table(stdout: str) -> tuple[collections.Counter, collections.Counter]:
    before, after = collections.Counter(), collections.Counter()
    for match in re.finditer(r"^  (\S+)\s+(\d+)\s+(\d+)(?:\s+[+-]\d+)?$", stdout, re.M):
        before[match[1]], after[match[1]] = int(match[2]), int(match[3])
    return +before, +after


def fired_rules(stdout: str) -> dict[str, int]:
    block = stdout.split("rules fired", 1)[1].split("initializer bytes", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^  (\S+/\S+)\s+(\d+)$", block, re.M)}


def mtimes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}


def _blocking(directory: Path, module: str) -> dict[str, str]:
    """An environment where ``import module`` fails."""
    stub = directory / f"block_{module}" / module
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise ImportError('{module} blocked for this test')\n")
    path = os.pathsep.join(filter(None, [str(stub.parent), BASE_ENV.get("PYTHONPATH")]))
    return {"PYTHONPATH": path}


def _run_on_terminal(args, cwd: Path, env: dict | None = None) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal; returns (exit code, what the terminal got)."""
    import pty

    master, slave = pty.openpty()
    full_env = {**BASE_ENV, "TERM": "xterm-256color", "COLUMNS": "120", **(env or {})}
    with open(cwd / "stdout.txt", "w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rnn_rewrite_rules", *map(str, args)],
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=slave,
        )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO once the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode(errors="replace")


# --- subprocess jobs --------------------------------------------------------------------
# Every command takes ~2 s, most of it importing onnx: the jobs run concurrently, each in
# its own copy of the models, as soon as the first test asks for one; tests check results.

JOBS: dict = {}


def job(function):
    JOBS[function.__name__.removeprefix("_")] = function
    return function


@job
def _rewrite(work: Path):
    return run(work / "small.onnx", "-o", work / "out.onnx", "--verify", cwd=work, script=True)


@job
def _rules_option(work: Path):
    return run(work / "small.onnx", "-o", work / "out.onnx", "--rules", "layer_output", cwd=work)


@job
def _list_rules(work: Path):
    return run("--list-rules", cwd=work, script=True)


@job
def _check_frozen(work: Path):
    before = mtimes(work)
    return before, run(work / "frozen.onnx", "--check", cwd=work, script=True)


@job
def _in_place(work: Path):
    return run(work / "small.onnx", "--in-place", "--verify", "-q", cwd=work)


@job
def _external_in_place(work: Path):
    shutil.copy(work / "external.onnx", work / "copy.onnx")  # an earlier copy of the input
    return run(work / "external.onnx", "--in-place", "-q", cwd=work, script=True)


@job
def _without_onnxruntime(work: Path):
    env = _blocking(work, "onnxruntime")
    return run(work / "small.onnx", "-o", work / "out.onnx", "--verify", cwd=work, env=env)


@job
def _progress(work: Path):
    args = [work / "deep.onnx", "-o", work / "out.onnx", "--verify"]
    code, terminal = _run_on_terminal(args, work)
    return code, terminal, (work / "stdout.txt").read_text()


def _unwritable(work: Path) -> Path:
    if os.geteuid() == 0:
        return Path("/proc")  # root writes through permission bits
    locked = work / "locked"
    locked.mkdir(mode=0o555)
    return locked


BAD = {
    "missing file": (["nope.onnx", "-o", "out.onnx"], ExitCode.INPUT_NOT_FOUND, "no such file"),
    "directory": (["adir", "-o", "out.onnx"], ExitCode.INPUT_IS_DIRECTORY, "directory"),
    "not onnx": (["text.onnx", "-o", "out.onnx"], ExitCode.NOT_ONNX, "not an ONNX model"),
    "truncated": (["truncated.onnx", "-o", "out.onnx"], ExitCode.DAMAGED_MODEL, "truncated"),
    "opset too old": (["opset5.onnx", "-o", "out.onnx"], ExitCode.UNSUPPORTED_MODEL, "opset 5"),
    "opset too new": (["opset99.onnx", "-o", "out.onnx"], ExitCode.UNSUPPORTED_MODEL, "99"),
    "unknown rule": (
        ["small.onnx", "-o", "out.onnx", "--rules", "layer_output,bogus"],
        ExitCode.UNKNOWN_RULE,
        "'bogus'",
    ),
    "unwritable dir": (
        ["small.onnx", "-o", "UNWRITABLE/out.onnx"], ExitCode.OUTPUT_NOT_WRITABLE, "cannot write"
    ),
    "out is in": (["small.onnx", "-o", "./small.onnx"], ExitCode.OUTPUT_IS_INPUT, "--in-place"),
}  # fmt: skip
#: More bad input, run in-process (the same main(); no interpreter start-up).
MORE_BAD = {
    "empty": (["empty.onnx", "-o", "out.onnx"], ExitCode.NOT_ONNX, "empty"),
    "external data cut": (["cut.onnx", "-o", "out.onnx"], ExitCode.DAMAGED_MODEL, "too short"),
    "no output dir": (["small.onnx", "-o", "no/out.onnx"], ExitCode.OUTPUT_NOT_WRITABLE, "exist"),
    "output is a dir": (["small.onnx", "-o", "adir"], ExitCode.OUTPUT_NOT_WRITABLE, "directory"),
    "no output": (["small.onnx"], ExitCode.USAGE, "-o OUT.onnx"),
    "bad flag": (["small.onnx", "-o", "out.onnx", "--fast"], ExitCode.USAGE, "--fast"),
    "bad tolerance": (["small.onnx", "-o", "out.onnx", "--tolerance", "-1"], ExitCode.USAGE, ""),
    "bad shape": (
        ["small.onnx", "-o", "out.onnx", "--verify", "--shape", "input=1,2"],
        ExitCode.USAGE,
        "rank 3",
    ),
    "check and -o": (["small.onnx", "--check", "-o", "out.onnx"], ExitCode.USAGE, "--check"),
    # paddle2onnx's nn.SimpleRNN: graph outputs naming values no node produces
    "invalid graph": (
        ["invalid.onnx", "--check"],
        ExitCode.NOT_ONNX,
        "invalid.onnx: input is not a valid ONNX model: Graph output 'ghost' is not an output "
        "of any node in graph.",
    ),
}


def _bad_files(work: Path) -> None:
    seed = (work / "small.onnx").read_bytes()
    (work / "out.onnx").write_bytes(b"sentinel")
    (work / "adir").mkdir()
    (work / "text.onnx").write_text("this is not a model\n")
    (work / "empty.onnx").write_bytes(b"")
    (work / "truncated.onnx").write_bytes(seed[: len(seed) // 2])
    proto = onnx.load_from_string(seed)
    for version, name in ((5, "opset5.onnx"), (99, "opset99.onnx")):
        proto.opset_import[0].version = version
        onnx.save(proto, work / name)
    onnx.save(
        onnx.load_from_string(seed),
        work / "cut.onnx",
        save_as_external_data=True,
        location="cut.onnx.data",
        size_threshold=256,
    )
    data = work / "cut.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    invalid = onnx.load_from_string(seed)
    invalid.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, [2]))
    onnx.save(invalid, work / "invalid.onnx")


for _index, _case in enumerate(BAD):

    def _bad(work: Path, case: str = _case, index: int = _index):
        _bad_files(work)
        args = [
            str(_unwritable(work)) + arg.removeprefix("UNWRITABLE") if "UNWRITABLE" in arg else arg
            for arg in BAD[case][0]
        ]
        return run(*args, cwd=work, script=index % 2 == 0)  # both entry points

    JOBS[f"bad: {_case}"] = _bad


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, models):
    """name -> (work directory, a future of the job's result)."""
    root = tmp_path_factory.mktemp("jobs")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=3)
    started = {}
    for name, function in JOBS.items():
        work = root / re.sub(r"\W+", "_", name)
        shutil.copytree(models, work)
        started[name] = (work, pool.submit(function, work))
    yield started
    pool.shutdown(wait=True)


def result(jobs, name: str):
    work, future = jobs[name]
    return work, future.result(timeout=300)


# --- the main path ----------------------------------------------------------------------


def test_rewrite_verify_report_and_equivalence(jobs) -> None:
    work, proc = result(jobs, "rewrite")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # not a terminal: no progress
    before, after = onnx.load(work / "small.onnx"), onnx.load(work / "out.onnx")
    onnx.checker.check_model(after, full_check=True)
    assert_equivalent(before, after, SMALL)  # at sizes other than --verify's
    # the report describes the two files
    assert f"nodes: {len(before.graph.node)} -> {len(after.graph.node)}" in proc.stdout
    assert report_op_table(proc.stdout) == (op_counts(before), op_counts(after))
    fired = fired_rules(proc.stdout)
    known = {f"{f.name}/{_api.rule_name(r)}" for f in families().values() for r in f.rules}
    assert fired and set(fired) <= known
    tensors = sum(numpy_helper.to_array(t).nbytes for t in after.graph.initializer)
    assert f"-> {tensors:,} (" in proc.stdout
    # --verify ran at two sizes per dynamic axis and compared every output
    runs = re.findall(r"^  run \d: input=(\d+)x(\d+)x8$", proc.stdout, re.M)
    assert len(runs) == 2 and len({r[0] for r in runs}) == 2 and len({r[1] for r in runs}) == 2
    for name in ("output", "h_n", "c_n"):
        assert re.search(rf"^    {name}\s+[0-9.e+-]+$", proc.stdout, re.M), name
    assert "verify: OK" in proc.stdout and "wrote " in proc.stdout
    assert leftovers(work) == []


def test_rules_option_restricts_what_fires(jobs) -> None:
    work, proc = result(jobs, "rules_option")
    assert proc.returncode == 0, proc.stderr
    fired = fired_rules(proc.stdout)
    assert fired and all(name.startswith("layer_output/") for name in fired)
    after = onnx.load(work / "out.onnx")
    assert op_counts(after)["Expand"] == 1  # initial_state did not run
    assert_equivalent(onnx.load(work / "small.onnx"), after, SMALL)


def test_list_rules(jobs) -> None:
    _, listed = result(jobs, "list_rules")
    assert listed.returncode == 0, listed.stderr
    for family in families().values():
        assert f"  {family.name}: {family.description}" in listed.stdout
        for rule in family.rules:
            name = re.escape(_api.rule_name(rule))
            assert re.search(rf"^    {name}(\s|$)", listed.stdout, re.M), name
    # GRU and RNN have no cell state: their rules do not speak of one
    for line in listed.stdout.splitlines():
        if re.search(r"\[(GRU|RNN)/\d\]", line):
            assert "initial_c" not in line and "Y_c" not in line, line


def test_help_documents_every_exit_code(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    usage = capsys.readouterr().out
    for code in ExitCode:
        assert re.search(rf"^\s+{int(code)}\s+\S", usage, re.M), code


def test_shape_overrides_set_the_verify_runs(models, tmp_path, capsys) -> None:
    args = [models / "small.onnx", "-o", tmp_path / "out.onnx", "--verify", "--shape", "seq=1,4,9"]
    assert main(map(str, args)) == 0
    runs = re.findall(r"^  run \d: input=(\d+)x(\d+)x8$", capsys.readouterr().out, re.M)
    assert [int(seq) for _, seq in runs] == [1, 4, 9]
    assert len({batch for batch, _ in runs}) == 3


@pytest.mark.parametrize(
    ("args", "explicit_states"), [([], True), (["--target", "onnxruntime"], False)]
)
def test_target_decides_the_zero_states(models, tmp_path, args, explicit_states) -> None:
    """Default: every LSTM keeps an explicit initial_h (tract rejects RNNs without one);
    --target onnxruntime drops it. The rest fires either way."""
    out = tmp_path / "out.onnx"
    assert main([str(models / "small.onnx"), "-o", str(out), "-q", *args]) == 0
    result = onnx.load(out)
    lstms = [n for n in result.graph.node if n.op_type == "LSTM"]
    assert lstms and all((len(n.input) > 5 and n.input[5] != "") == explicit_states for n in lstms)
    assert op_counts(result)["Mul"] == 0
    assert_equivalent(build_torchlib_model(SMALL), result, SMALL)


# --- check ------------------------------------------------------------------------------


def test_check_reports_a_frozen_axis_and_writes_nothing(jobs) -> None:
    work, (files, proc) = result(jobs, "check_frozen")
    assert proc.returncode == 0, proc.stderr
    found, remaining = proc.stdout.split("after the rewrite:")
    frozen = [line for line in found.splitlines() if "[frozen-axis]" in line]
    assert len(frozen) == 1, proc.stdout
    assert "Reshape" in frozen[0] and "'seq' to 3" in frozen[0] and "'input'" in frozen[0]
    assert "1 remain (frozen-axis x1)" in remaining  # no rule can unfreeze it
    assert "[runtime-shape-chain]" in proc.stdout
    assert "nothing written" in proc.stdout
    assert mtimes(work) == files


def test_check_reports_layout1(models, capsys) -> None:
    assert main([str(models / "layout1.onnx"), "--check"]) == 0
    assert "[layout-1] LSTM 'lstm_bf'" in capsys.readouterr().out


# --- verification (more in test_verify.py) ----------------------------------------------


def test_verify_of_a_frozen_model_says_why(models, tmp_path, capsys) -> None:
    """seq frozen to 3: the sizes the original runs on are compared (2x3), the others it
    rejects are named with the frozen axis as the likely cause."""
    code = main([str(models / "frozen.onnx"), "-o", str(tmp_path / "out.onnx"), "--verify"])
    proc = in_process(code, capsys)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "  run 1: input=2x3x8" in proc.stdout and "  run 2:" not in proc.stdout
    assert "compared 1 run only (a frozen axis? see --check)" in proc.stdout


# --- in place and external data ---------------------------------------------------------


def test_in_place(jobs, models) -> None:
    work, proc = result(jobs, "in_place")
    assert proc.returncode == 0, proc.stderr
    original, rewritten = onnx.load(models / "small.onnx"), onnx.load(work / "small.onnx")
    assert len(rewritten.graph.node) < len(original.graph.node)
    assert_equivalent(original, rewritten, SMALL)
    assert leftovers(work) == []


def data_files(path: Path) -> set[str]:
    """The external data files the ONNX file at ``path`` names."""
    return set(_load.external_files(onnx.load(path, load_external_data=False)))


def test_external_data_is_kept(models, tmp_path, capsys) -> None:
    assert main([str(models / "external.onnx"), "-o", str(tmp_path / "out.onnx")]) == 0
    (data,) = data_files(tmp_path / "out.onnx")
    assert re.fullmatch(r"out\.onnx\.[0-9a-f]{8}\.data", data)  # a name unique to the run
    assert (tmp_path / data).stat().st_size > 0
    assert_equivalent(onnx.load(models / "external.onnx"), onnx.load(tmp_path / "out.onnx"), SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.onnx", data])


def test_in_place_switches_external_data_files(jobs, models) -> None:
    work, proc = result(jobs, "external_in_place")
    assert proc.returncode == 0, proc.stderr
    # the new data went to a name unique to the run; the input's data file is unchanged,
    # so an earlier copy of the input still loads its own weights
    (data,) = data_files(work / "external.onnx")
    assert re.fullmatch(r"external\.onnx\.[0-9a-f]{8}\.data", data)
    assert (work / "external.onnx.data").read_bytes() == (
        models / "external.onnx.data"
    ).read_bytes()
    assert_equivalent(onnx.load(models / "external.onnx"), onnx.load(work / "copy.onnx"), SMALL)
    assert_equivalent(onnx.load(models / "external.onnx"), onnx.load(work / "external.onnx"), SMALL)
    assert leftovers(work) == []
    # a second run replaces the data file the first one wrote, and only that one
    assert main([str(work / "external.onnx"), "--in-place", "-q"]) == 0
    (second,) = data_files(work / "external.onnx")
    assert second != data and not (work / data).exists()
    assert (work / "external.onnx.data").exists()
    assert_equivalent(onnx.load(models / "external.onnx"), onnx.load(work / "external.onnx"), SMALL)


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case, jobs) -> None:
    work, proc = result(jobs, f"bad: {case}")
    _, code, fragment = BAD[case]
    assert_one_line_error(proc, code, fragment)
    assert (work / "out.onnx").read_bytes() == b"sentinel"
    assert leftovers(work) == []
    assert proc.stdout == ""


@pytest.mark.parametrize("case", list(MORE_BAD))
def test_more_bad_input(case, models, tmp_path, monkeypatch, capsys) -> None:
    shutil.copytree(models, tmp_path, dirs_exist_ok=True)
    _bad_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    args, code, fragment = MORE_BAD[case]
    assert_one_line_error(in_process(main(args), capsys), code, fragment)
    assert (tmp_path / "out.onnx").read_bytes() == b"sentinel"
    assert leftovers(tmp_path) == []


def test_exit_codes_are_distinct() -> None:
    assert len({int(code) for code in ExitCode}) == len(ExitCode)
    # each class of bad input has its own code, and every one of them is exercised here
    exercised = {code for _, code, _ in [*BAD.values(), *MORE_BAD.values()]}
    assert exercised == set(ExitCode) & set(range(2, 11))


# --- optional dependencies, progress, demo ----------------------------------------------


def test_without_onnxruntime(jobs, monkeypatch, capsys) -> None:
    work, verify = result(jobs, "without_onnxruntime")
    assert_one_line_error(verify, ExitCode.NO_ONNXRUNTIME, "onnxruntime", "pip install")
    assert not (work / "out.onnx").exists()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    code = main(["demo"])
    assert_one_line_error(in_process(code, capsys), ExitCode.NO_ONNXRUNTIME, "demo needs")


def test_progress_on_a_terminal(jobs) -> None:
    pytest.importorskip("rich", reason="the progress display needs the optional rich")
    _, (code, terminal, stdout) = result(jobs, "progress")
    assert code == 0, terminal
    assert "rewriting, round 1" in terminal and "verifying" in terminal
    assert "verify: OK" in stdout and "wrote " in stdout  # the report still goes to stdout


def test_no_progress_without_rich(models, tmp_path, monkeypatch, capsys) -> None:
    for name in ("rich", "rich.console", "rich.progress"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main([str(models / "deep.onnx"), "-o", str(tmp_path / "out.onnx")]) == 0
    assert capsys.readouterr().err == ""


def test_demo(tmp_path) -> None:
    """The demo rewrites, verifies and times the seed model, and leaves nothing behind. How
    long it takes is not asserted: speed claims live in benchmarks, not in unit tests."""
    proc = run("demo", cwd=tmp_path, script=True)
    assert proc.returncode == 0, proc.stderr
    assert "nodes: 103 -> " in proc.stdout and "verify: OK" in proc.stdout
    assert re.search(r"^  session load\s+[\d.]+ ms\s+[\d.]+ ms$", proc.stdout, re.M)
    assert re.search(r"^  run\s+[\d.]+ ms\s+[\d.]+ ms\s+\([\d.]+x\)$", proc.stdout, re.M)
    assert list(tmp_path.iterdir()) == []


# --- in-process: the parts ----------------------------------------------------------------


def test_truncations_are_damage_not_garbage(tmp_path) -> None:
    data = build_torchlib_model(SMALL).SerializeToString()
    for cut in (3, 40, len(data) // 3, len(data) - 1):
        (tmp_path / "m.onnx").write_bytes(data[:cut])
        with pytest.raises(errors.DamagedModel):
            _load.load_model(tmp_path / "m.onnx")
    for seed in range(5):
        (tmp_path / "m.onnx").write_bytes(np.random.default_rng(seed).bytes(4096))
        with pytest.raises(errors.NotOnnx):
            _load.load_model(tmp_path / "m.onnx")


def test_large_models_switch_to_external_data(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_save, "EMBED_LIMIT_BYTES", 1000)  # stands in for protobuf's 2 GB
    proto = build_torchlib_model(SMALL)
    target = tmp_path / "big.onnx"
    with _save.Staging(target) as staging:
        staging.write(ir.serde.deserialize_model(proto))
        assert not target.exists()  # nothing visible before the commit
        staging.commit()
    loaded = _load.load_model(target)
    (data,) = loaded.data_files
    assert loaded.external_data and data.startswith("big.onnx.") and data.endswith(".data")
    assert (tmp_path / data).stat().st_size > 1000
    assert_equivalent(proto, onnx.load(target), SMALL)
    assert leftovers(tmp_path) == []


def test_verify_plans_vary_every_dynamic_axis() -> None:
    cfg = dataclasses.replace(SMALL, initial_states=True)
    specs = input_specs(ir.serde.deserialize_model(build_torchlib_model(cfg)))
    plans = plan_runs(specs, {})
    assert len(plans) == 2
    for plan in plans:  # batch is shared by input, h0 and c0, and differs from seq
        batch, seq, _ = plan["input"]
        assert plan["h0"][1] == plan["c0"][1] == batch != seq
    assert plans[0]["input"][:2] != plans[1]["input"][:2]
    assert all(a != b for a, b in zip(plans[0]["input"][:2], plans[1]["input"][:2], strict=True))
    fixed = plan_runs(specs, {"input": (3, 7, 8)})
    assert fixed == [{"input": (3, 7, 8), "h0": (2, 3, 16), "c0": (2, 3, 16)}]
    with pytest.raises(ValueError, match="static 8"):
        plan_runs(specs, {"input": (3, 7, 9)})


def test_counting_rewrite_matches_the_api() -> None:
    proto = build_torchlib_model(dataclasses.replace(SMALL, fold_limit=0))
    model = ir.serde.deserialize_model(proto)
    fired: collections.Counter[str] = collections.Counter()
    _api.apply_rounds(model, rnn_rewrite_rules.rules(), counts=fired)
    assert sum(fired.values()) > 0
    expected = rnn_rewrite_rules.rewrite(proto)
    assert op_counts(model) == op_counts(expected)


class _RefuseUnsqueeze(RewriteRuleClassBase):
    """Refuses every Unsqueeze, with a reason."""

    def pattern(self, op, x, axes):
        return op.Unsqueeze(x, axes)

    def check(self, context, x, axes, **_):
        return MatchResult().fail("toy condition says no")

    def rewrite(self, op, x, axes):
        return op.Unsqueeze(x, axes)


def test_unimproved_rnns_carry_the_conditions_reason() -> None:
    model = ir.serde.deserialize_model(
        build_torchlib_model(dataclasses.replace(SMALL, fold_limit=0))
    )
    rule = _RefuseUnsqueeze.rule()
    names = {rule.name: "weight_folding", "SomeLayerOutputRule": "layer_output"}
    refusals: list[_api.Refused] = []
    _api.apply_rounds(model, RewriteRuleSet([rule]), refusals=refusals)
    unimproved = _report.unimproved_rnns(model, [rule], names, refusals)
    assert len(unimproved) == SMALL.num_layers
    for item in unimproved:
        assert any(h.startswith("runtime-weight-prep") for h in item.hazards)
        assert f"weight_folding/{rule.name}: toy condition says no" in item.reasons
    assert all("layer_output: not selected" in " ".join(i.reasons) for i in unimproved)


def test_hazards_of_the_seed() -> None:
    cfg = RnnConfig(input_size=256, hidden_size=256, num_layers=4, batch_first=True)
    model = ir.serde.deserialize_model(build_torchlib_model(cfg))
    kinds = collections.Counter(h.kind for h in diagnostics.find_hazards(model))
    # W and R (256x1024) exceed the exporter's fold limit; the biases were folded
    assert kinds == {"runtime-shape-chain": 4, "runtime-weight-prep": 4}
    assert diagnostics.find_hazards(ir.serde.deserialize_model(layout1_model()))[0].kind == (
        "layout-1"
    )


# --- choosing what runs ----------------------------------------------------------------


def test_list_rules_describes_each_rule_in_full(capsys) -> None:
    assert main(["--list-rules"]) == 0
    rules = [line for line in capsys.readouterr().out.splitlines() if line.startswith("    ")]
    assert rules
    for line in rules:  # a description wrapped in its docstring is one line here
        assert not line.rstrip().endswith("->"), line
    zero_states = [line for line in rules if "ShareZeroInitialState[GRU]" in line]
    assert zero_states and "-> GRU(..., z) with z = ConstantOfShape" in zero_states[0]


def test_exclude_leaves_a_family_out(models, tmp_path, capsys) -> None:
    out = tmp_path / "out.onnx"
    assert main([str(models / "small.onnx"), "-o", str(out), "--exclude", "layer_output"]) == 0
    fired = fired_rules(capsys.readouterr().out)
    assert fired and not any(rule.startswith("layer_output/") for rule in fired), fired
    assert main([str(models / "small.onnx"), "-o", str(out)]) == 0
    assert any(rule.startswith("layer_output/") for rule in fired_rules(capsys.readouterr().out))


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--exclude", "bogus"], ExitCode.UNKNOWN_RULE, "'bogus'"),
        (["--exclude", ","], ExitCode.USAGE, "--exclude: give at least one name"),
        (["--rules", "layout", "--exclude", "layout"], ExitCode.USAGE, "leaves no rule"),
    ],
)
def test_exclude_refuses_what_it_cannot_do(models, tmp_path, capsys, args, code, fragment):
    out = tmp_path / "out.onnx"
    assert main([str(models / "small.onnx"), "-o", str(out), *args]) == code
    error = capsys.readouterr().err
    assert fragment in error and error.count("\n") == 1, error
    assert not out.exists()


def _plain_model() -> onnx.ModelProto:
    """A model with no recurrence at all."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def test_a_model_without_recurrence_is_said_so_and_not_written(tmp_path, capsys) -> None:
    source, out = tmp_path / "plain.onnx", tmp_path / "out.onnx"
    onnx.save(_plain_model(), source)
    assert main([str(source), "-o", str(out)]) == ExitCode.NO_RECURRENCE
    captured = capsys.readouterr()
    assert "no RNN, LSTM or GRU node and no recurrence" in captured.out
    assert "--allow-no-rnn" in captured.err and captured.err.count("\n") == 1
    assert not out.exists() and leftovers(tmp_path) == []
    assert main([str(source), "--check"]) == ExitCode.OK  # --check writes nothing anyway
    assert "no RNN, LSTM or GRU node" in capsys.readouterr().out
    assert main([str(source), "-o", str(out), "--allow-no-rnn"]) == ExitCode.OK
    assert out.exists()
    capsys.readouterr()
    # a model with an RNN node but nothing to improve is not such a model
    assert main([str(models_small(tmp_path)), "-o", str(out), "--rules", "layout"]) == 0
    assert "no RNN, LSTM or GRU node" not in capsys.readouterr().out


def models_small(directory: Path) -> Path:
    path = directory / "small.onnx"
    onnx.save(build_torchlib_model(SMALL), path)
    return path
