"""``rnn-rewrite`` and ``rewrite_file`` on the cost model: recurrences kept unrolled are
reported (not "no recurrence"), ``--benchmark`` / ``--keep-slower``, ``--quantize int8``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import onnx
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import _rewrite_file
from rnn_rewrite_rules.benchmark import BenchmarkResult, Latency
from rnn_rewrite_rules.cli import ExitCode, main
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from rnn_rewrite_rules.testing.unrolled import UnrolledRnnConfig, build_unrolled_rnn
from tests.support import assert_one_line_error, op_counts

pytest.importorskip("onnxruntime")

RNN = UnrolledRnnConfig(hidden_size=8, input_size=4, seq=3, num_layers=2)
LSTM = RnnConfig(num_layers=2, hidden_size=64, input_size=32)


def _cli(argv: list[str], capsys) -> subprocess.CompletedProcess:
    code = main(argv)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, captured.out, captured.err)


@pytest.fixture
def rnn_file(tmp_path: Path) -> Path:
    path = tmp_path / "rnn.onnx"
    onnx.save(build_unrolled_rnn(RNN), path)
    return path


def test_portable_reports_the_recurrences_it_kept_unrolled(rnn_file, tmp_path, capsys) -> None:
    out = tmp_path / "out.onnx"
    proc = _cli([str(rnn_file), "-o", str(out)], capsys)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "recurrences kept unrolled (2):" in proc.stdout
    assert "2 x re-roll kept unrolled: rten has no RNN op" in proc.stdout
    assert "no RNN, LSTM or GRU node" not in proc.stdout
    assert op_counts(onnx.load(out))["RNN"] == 0


def test_benchmark_reports_ratios_for_each_verify_size(rnn_file, tmp_path, capsys) -> None:
    out = tmp_path / "out.onnx"
    argv = [str(rnn_file), "-o", str(out), "--target", "onnxruntime", "--verify", "--benchmark"]
    proc = _cli([*argv, "--keep-slower"], capsys)  # whatever this machine measures
    assert proc.returncode == ExitCode.OK, proc.stderr
    lines = proc.stdout.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("benchmark: one thread")))
    sizes = [line.split("  run ")[1].split(": ")[1] for line in lines if line.startswith("  run ")]
    latency = [line for line in lines[first:] if " latency at " in line]
    assert [line.split(" latency at ")[1].split(":")[0] for line in latency[: len(sizes)]] == sizes
    assert lines[-2].startswith("benchmark: ")
    assert out.exists()
    assert all("not judged" in line for line in latency if "OpenVINO" in line and "SLOWER" in line)


def _slower(*_args, **_kwargs) -> BenchmarkResult:
    result = BenchmarkResult(repeats=3, rounds=7)
    result.latencies.append(Latency("onnxruntime", "x=3x2x4", 1e-4, 2e-4, 2.0, 1.9, 2.1, 8))
    return result


def test_a_slower_result_is_not_written_unless_kept(
    rnn_file, tmp_path, capsys, monkeypatch
) -> None:
    """The measurement is replaced by one that is slower beyond its spread: what the
    command does with it, not a timing, is tested here."""
    monkeypatch.setattr(_rewrite_file, "run_benchmark", _slower)
    out = tmp_path / "out.onnx"
    argv = [str(rnn_file), "-o", str(out), "--target", "onnxruntime", "--benchmark"]
    proc = _cli(argv, capsys)
    assert_one_line_error(proc, ExitCode.SLOWER, "slower than the original", "--keep-slower")
    assert "2.00x (1.90-2.10, 8 repeats): SLOWER" in proc.stdout
    assert not out.exists()
    proc = _cli([*argv, "--keep-slower"], capsys)
    assert proc.returncode == ExitCode.OK and out.exists()
    assert "the result is SLOWER than the original" in proc.stdout
    with pytest.raises(rnn_rewrite_rules.SlowerResult) as raised:
        rnn_rewrite_rules.rewrite_file(
            rnn_file, tmp_path / "api.onnx", rnn_rewrite_rules.RewriteOptions(benchmark=True)
        )
    assert raised.value.report.benchmark.slower


def test_keep_slower_needs_benchmark(rnn_file, tmp_path, capsys) -> None:
    proc = _cli([str(rnn_file), "-o", str(tmp_path / "o.onnx"), "--keep-slower"], capsys)
    assert_one_line_error(proc, ExitCode.USAGE, "--keep-slower", "--benchmark")


def test_quantize_int8_is_verified_against_its_stated_tolerance(tmp_path, capsys) -> None:
    pytest.importorskip("onnxruntime.quantization")
    source, out = tmp_path / "lstm.onnx", tmp_path / "int8.onnx"
    onnx.save(build_torchlib_model(LSTM), source)
    proc = _cli([str(source), "-o", str(out), "--quantize", "int8", "--verify"], capsys)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "quantize int8 (onnxruntime quantize_dynamic): 2 DynamicQuantizeLSTM" in proc.stdout
    assert "tolerance 0.05" in proc.stdout and "verify: OK" in proc.stdout
    assert op_counts(onnx.load(out))["DynamicQuantizeLSTM"] == 2
    out.unlink()
    argv = [str(source), "-o", str(out), "--quantize", "int8", "--verify", "--tolerance", "1e-6"]
    proc = _cli(argv, capsys)
    assert_one_line_error(proc, ExitCode.VERIFY_FAILED, "verification failed")
    assert not out.exists()


def test_a_gru_stays_float_and_the_report_says_why(tmp_path, capsys) -> None:
    pytest.importorskip("onnxruntime.quantization")
    source, out = tmp_path / "gru.onnx", tmp_path / "int8.onnx"
    onnx.save(build_torchlib_model(RnnConfig(op_type="GRU", hidden_size=16)), source)
    proc = _cli([str(source), "-o", str(out), "--quantize", "int8"], capsys)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "  1 GRU stay float: ONNX Runtime has no quantized GRU" in proc.stdout
