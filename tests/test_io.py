"""Files and signals: special files, symbolic links, external data, interrupts, disk full.

Each fault runs the real command (a subprocess) unless it cannot be timed from outside.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from rnn_rewrite_rules import _load, _save, cli
from rnn_rewrite_rules.cli import ExitCode, main
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from tests.support import (
    BASE_ENV,
    assert_equivalent,
    assert_one_line_error,
    command,
    leftovers,
    run,
)

SMALL = RnnConfig(input_size=8, hidden_size=16, num_layers=2, batch_first=True)
#: Big enough that writing and verifying take a while (about 4 MB, 8 LSTM layers).
BIG = RnnConfig(input_size=64, hidden_size=128, num_layers=8)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("io_models")
    onnx.save(build_torchlib_model(SMALL), root / "small.onnx")
    onnx.save(
        build_torchlib_model(SMALL),
        root / "external.onnx",
        save_as_external_data=True,
        location="external.onnx.data",
        size_threshold=256,
    )
    onnx.save(
        build_torchlib_model(BIG),
        root / "big.onnx",
        save_as_external_data=True,
        location="big.onnx.data",
        size_threshold=1024,
    )
    return root


@pytest.fixture
def work(models, tmp_path) -> Path:
    shutil.copytree(models, tmp_path, dirs_exist_ok=True)
    return tmp_path


def data_files(path: Path) -> set[str]:
    return set(_load.external_files(onnx.load(path, load_external_data=False)))


# --- special files as outputs -----------------------------------------------------------


def test_fifo_output_is_refused_and_kept(work) -> None:
    os.mkfifo(work / "fifo")
    proc = run(work / "small.onnx", "-o", work / "fifo", cwd=work)
    assert_one_line_error(proc, ExitCode.OUTPUT_NOT_WRITABLE, "FIFO")
    assert stat.S_ISFIFO(os.lstat(work / "fifo").st_mode)
    assert leftovers(work) == []


def test_device_output_is_refused_and_kept(work) -> None:
    null = work / "null"
    try:  # our own /dev/null: a regression must not replace the machine's
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        null = Path("/dev/null")
        if os.geteuid() == 0:
            pytest.fail("root could not create a device node to test with")
    proc = run(work / "small.onnx", "-o", null, cwd=work)
    assert_one_line_error(proc, ExitCode.OUTPUT_NOT_WRITABLE, "a device")
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_stdout_link_output_is_refused_and_kept(work) -> None:
    """``-o /dev/stdout`` with stdout a pipe (a link of our own to the same place)."""
    link = work / "stdout"
    link.symlink_to("/proc/self/fd/1")
    proc = run(work / "small.onnx", "-o", link, cwd=work)
    assert_one_line_error(proc, ExitCode.OUTPUT_NOT_WRITABLE, "FIFO")
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


# --- symbolic links are written through -------------------------------------------------


def test_output_link_is_written_through(work) -> None:
    (work / "real.onnx").write_bytes(b"old")
    (work / "link.onnx").symlink_to("real.onnx")
    proc = run(work / "small.onnx", "-o", work / "link.onnx", "-q", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (work / "link.onnx").is_symlink()
    assert_equivalent(onnx.load(work / "small.onnx"), onnx.load(work / "real.onnx"), SMALL)


def test_in_place_on_a_link_writes_the_file(work) -> None:
    (work / "current.onnx").symlink_to("external.onnx")
    proc = run(work / "current.onnx", "--in-place", "-q", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (work / "current.onnx").is_symlink()
    rewritten = work / "external.onnx"
    (data,) = data_files(rewritten)
    assert data.startswith("external.onnx.")  # named after the file, not the link
    assert len(onnx.load(rewritten).graph.node) < len(build_torchlib_model(SMALL).graph.node)
    assert_equivalent(build_torchlib_model(SMALL), onnx.load(work / "current.onnx"), SMALL)
    assert leftovers(work) == []


# --- files the input uses ---------------------------------------------------------------


def test_output_on_the_inputs_data_file_is_refused(work) -> None:
    before = (work / "external.onnx.data").read_bytes()
    proc = run(work / "external.onnx", "-o", work / "external.onnx.data", cwd=work)
    assert_one_line_error(proc, ExitCode.OUTPUT_IS_INPUT, "external data")
    assert (work / "external.onnx.data").read_bytes() == before


def test_no_empty_data_file_when_every_tensor_is_small(work) -> None:
    """An external-data input whose folded tensors all fall under the threshold: the
    result embeds them and no empty ``out.onnx.<run>.data`` is left next to it."""
    tiny = RnnConfig(input_size=4, hidden_size=4, num_layers=2)  # W and R: 256 bytes
    model = build_torchlib_model(tiny)
    copy = onnx.ModelProto.FromString(model.SerializeToString())
    onnx.save(copy, work / "tiny.onnx", save_as_external_data=True, size_threshold=0)
    proc = run(work / "tiny.onnx", "-o", work / "out.onnx", "--quiet", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert not [p.name for p in work.iterdir() if p.name.startswith("out.onnx.")]
    assert data_files(work / "out.onnx") == set()
    assert_equivalent(model, onnx.load(work / "out.onnx"), tiny)


def test_concurrent_writers_pair_their_own_files(work) -> None:
    """Two runs with different rules write the same output; the survivor is consistent."""
    out = work / "out.onnx"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = [
            pool.submit(run, work / "external.onnx", "-o", out, "-q", *extra, cwd=work)
            for extra in ([], ["--rules", "layer_output"])
        ]
        procs = [job.result() for job in jobs]
    assert [p.returncode for p in procs] == [0, 0], [p.stderr for p in procs]
    (data,) = data_files(out)
    assert_equivalent(onnx.load(work / "external.onnx"), onnx.load(out), SMALL)
    assert leftovers(work) == []
    # the loser's data file was removed once the winner replaced its model file, or the
    # loser never won: either way no data file of ours is left unreferenced but one at most
    ours = [p.name for p in work.iterdir() if re.fullmatch(r"out\.onnx\.[0-9a-f]{8}\.data", p.name)]
    assert data in ours and len(ours) <= 2


# --- inputs that are not regular files --------------------------------------------------


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_special_input_is_refused(work, kind) -> None:
    source = Path("/dev/zero") if kind == "device" else work / "in.fifo"
    if kind == "fifo":
        os.mkfifo(source)  # nobody writes: opening it would block forever
    proc = run(source, "-o", work / "out.onnx", cwd=work, timeout=60)
    assert_one_line_error(proc, ExitCode.NOT_ONNX, "not an ONNX file")
    assert not (work / "out.onnx").exists()


# --- bad command lines ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["--seed", "-1"], ["--verify", "--shape", "seq=100000000000"], ["--seed", str(2**40)]],
    ids=["negative seed", "absurd shape", "huge seed"],
)
def test_bad_numbers_are_usage_errors(work, args) -> None:
    proc = run(work / "small.onnx", "-o", work / "out.onnx", *args, cwd=work)
    assert_one_line_error(proc, ExitCode.USAGE)
    assert not (work / "out.onnx").exists()


# --- signals ----------------------------------------------------------------------------


def _wait_for_staged_file(directory: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the staging directory holds a file (the write has begun)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in directory.iterdir():
            if entry.name.startswith(".out.onnx.") and entry.is_dir() and any(entry.iterdir()):
                return
        assert proc.poll() is None, "the command finished before it was interrupted"
        time.sleep(0.002)
    pytest.fail("no staged file appeared")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_mid_write_leaves_nothing(work, signum) -> None:
    proc = subprocess.Popen(
        # long sequences: verification keeps the staged files for a second or more
        command(work / "big.onnx", "-o", work / "out.onnx", "--verify", "--shape", "seq=300,400"),
        cwd=work,
        env=BASE_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_staged_file(work, proc)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert_one_line_error(
        subprocess.CompletedProcess([], proc.returncode, "", stderr),
        ExitCode.INTERRUPTED,
        "interrupted",
        "nothing written",
    )
    assert leftovers(work) == []
    assert sorted(p.name for p in work.iterdir()) == sorted(
        ["small.onnx", "external.onnx", "external.onnx.data", "big.onnx", "big.onnx.data"]
    )


def _wait_until_loaded(proc: subprocess.Popen, fragment: str, timeout: float = 60) -> None:
    """Until the child has mapped a file whose path holds ``fragment`` (Linux' /proc)."""
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            if fragment in maps.read_text():
                return
        time.sleep(0.005)
    pytest.fail(f"the child never loaded {fragment!r} (exit code {proc.poll()})")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux' /proc")
@pytest.mark.parametrize("after", [0.0, 0.3])
def test_ctrl_c_during_start_up_prints_no_traceback(work, after: float) -> None:
    """Start-up (importing onnx, onnxscript, onnxruntime) takes about a second; interrupt it.

    The signal goes once the command runs its own code: onnx is imported inside ``main``
    (the interpreter's own start-up, before any of ours, is not the command's to handle;
    on a loaded machine it alone takes longer than any fixed delay)."""
    proc = subprocess.Popen(
        command(work / "small.onnx", "-o", work / "out.onnx", script=True),
        cwd=work,
        env=BASE_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until_loaded(proc, "onnx_cpp2py_export")
        time.sleep(after)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "Traceback" not in stderr, stderr
    if proc.returncode == ExitCode.OK:  # done before the signal came: nothing to interrupt
        return
    assert_one_line_error(
        subprocess.CompletedProcess([], proc.returncode, "", stderr),
        ExitCode.INTERRUPTED,
        "interrupted",
    )
    assert not (work / "out.onnx").exists()


def test_interrupt_between_the_final_renames(work, monkeypatch) -> None:
    """SIGINT right after the data file is moved: deferred until the model file is too.

    In process: no outside timing can hit the gap between two renames.
    """
    replace = os.replace
    calls = []

    def replace_then_interrupt(src, dst):
        replace(src, dst)
        if Path(dst).parent != work:  # onnx_ir's own renames inside the staging directory
            return
        calls.append(dst)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler would run here, were the signal not deferred

    monkeypatch.setattr(_save.os, "replace", replace_then_interrupt)
    code = main([str(work / "external.onnx"), "-o", str(work / "out.onnx"), "-q"])
    assert code == ExitCode.INTERRUPTED
    assert len(calls) == 2  # both renames happened, then the interrupt was delivered
    (data,) = data_files(work / "out.onnx")
    assert Path(calls[0]).name == data
    ours = [p.name for p in work.iterdir() if p.name.startswith("out.onnx.")]
    assert ours == [data]
    assert_equivalent(onnx.load(work / "external.onnx"), onnx.load(work / "out.onnx"), SMALL)
    assert leftovers(work) == []


def test_interrupt_before_the_renames_writes_nothing(work, monkeypatch) -> None:
    fsync = _save._fsync

    def fsync_then_interrupt(path):
        fsync(path)
        if path.name == "out.onnx":
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(_save, "_fsync", fsync_then_interrupt)
    code = main([str(work / "external.onnx"), "-o", str(work / "out.onnx"), "-q"])
    assert code == ExitCode.INTERRUPTED
    assert not any(p.name.startswith("out.onnx") for p in work.iterdir())
    assert leftovers(work) == []


# --- disk full --------------------------------------------------------------------------


def test_disk_full_says_so(work) -> None:
    """The output directory is a 256 KiB tmpfs in a private mount namespace (root only)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a small file system")
    full = work / "full"
    full.mkdir()
    script = 'mount -t tmpfs -o size=256k tmpfs "$1" && shift && exec "$@"'
    args = command(work / "big.onnx", "-o", full / "out.onnx")
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(full), *args],
        cwd=work,
        env=BASE_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "mount:" in proc.stderr or "unshare:" in proc.stderr:
        pytest.skip(f"cannot mount here: {proc.stderr.strip()}")
    assert_one_line_error(proc, ExitCode.OUTPUT_NOT_WRITABLE, "No space left on device")


def test_python_m_has_no_import_time_dependency_on_onnx() -> None:
    """The command's modules import only the standard library at start-up."""
    code = (
        "import sys, rnn_rewrite_rules.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'onnx', 'onnxscript', "
        "'onnx_ir', 'numpy'}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=BASE_ENV, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(("signum", "how"), [(signal.SIGINT, ""), (signal.SIGHUP, " by SIGHUP")])
def test_an_interrupt_a_library_turns_into_another_error_is_the_interrupt(
    work, monkeypatch, capsys, signum, how
) -> None:
    """A library that catches the interrupt and fails otherwise (an import cut off half way
    is an ImportError later; the SIGHUP of test_signal_mid_write_leaves_nothing once came
    out of onnx's writer as a TypeError): exit 130, not an internal error."""

    def run_then_interrupted_inside_a_library(args) -> int:
        try:
            os.kill(os.getpid(), signum)
            time.sleep(1)
        except KeyboardInterrupt:
            raise ImportError("cannot import name 'x' from partially initialized module") from None
        return 0

    monkeypatch.setattr(cli, "_run", run_then_interrupted_inside_a_library)
    code = main([str(work / "small.onnx"), "-o", str(work / "out.onnx")])
    assert code == ExitCode.INTERRUPTED
    assert capsys.readouterr().err == f"rnn-rewrite: error: interrupted{how}; nothing written\n"
    assert not (work / "out.onnx").exists()
