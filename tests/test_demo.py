"""``rnn-rewrite demo``'s options, through the command's entry point."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from rnn_rewrite_rules.cli import main


def test_demo_save_seed_writes_the_seed_and_rewrites_for_the_default_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--save-seed`` writes the model built and leaves the rewrite's target alone (the
    path once replaced the target passed to the rewrite)."""
    seed = tmp_path / "seed.onnx"
    assert main(["demo", "--save-seed", str(seed), "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert f"seed model written to {seed}" in out
    assert "verify: OK" in out
    onnx.checker.check_model(onnx.load(seed), full_check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed.onnx"]
