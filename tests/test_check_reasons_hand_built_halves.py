"""``--check`` on hand-built bidirectional halves whose states are per-direction 1-D graph
inputs and outputs (a 3-layer stack with peepholes): every pair merges, and a pair left
alone gets the reason on both halves."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from rnn_rewrite_rules.cli import main
from tests.hand_built_stacks import hand_built_stack


def test_the_built_stack_runs() -> None:
    model = hand_built_stack()
    session = ort.InferenceSession(model.SerializeToString())
    feeds = {i.name: np.zeros([3], np.float32) for i in model.graph.input[1:]}
    feeds["x"] = np.ones([5, 4], np.float32)
    assert session.run(["y"], feeds)[0].shape == (5, 6)


def _check(tmp_path, capsys, model: onnx.ModelProto) -> str:
    path = tmp_path / "hand_bidirectional.onnx"
    onnx.save(model, path)
    before = path.read_bytes()
    assert main([str(path), "--check"]) == 0
    assert path.read_bytes() == before
    return capsys.readouterr().out


def test_check_merges_every_pair(tmp_path, capsys) -> None:
    out = _check(tmp_path, capsys, hand_built_stack())
    assert "bidirectional/MergeHandBuiltBidirectional  3" in out, out
    assert "after the rewrite: 0 remain" in out, out
    assert "not improved" not in out, out


@pytest.mark.parametrize(
    ("near_miss", "reason"),
    [
        ("one_peephole", "only one half has an initial state or peepholes"),
        ("cycle", "an input of a half is computed from a half's output"),
    ],
)
def test_check_gives_a_reason_for_every_half(tmp_path, capsys, near_miss, reason) -> None:
    out = _check(tmp_path, capsys, hand_built_stack(near_miss=near_miss))
    assert "RNN nodes not improved (2 of 4)" in out, out
    section = out.split("RNN nodes not improved")[1].split("\nhazards")[0]
    blocks = re.split(r"\n  (?=LSTM ')", section)[1:]
    names = [block.split("\n")[0] for block in blocks]
    assert names == ["LSTM 'l0_f_lstm'", "LSTM 'l0_b_lstm'"], names
    forward, backward = blocks
    assert f"reverse half LSTM 'l0_b_lstm': MergeHandBuiltBidirectional: {reason}" in forward
    assert f"bidirectional/MergeHandBuiltBidirectional: {reason}" in backward
