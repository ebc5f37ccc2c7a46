"""The Python API: names as strings, errors that name the valid choices, rewrite_file."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules import Report, RewriteOptions, rewrite_file
from rnn_rewrite_rules.rules import families
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from tests.support import assert_equivalent, child_env, op_counts, without_a_runtime

SMALL = RnnConfig(input_size=8, hidden_size=16, num_layers=2, batch_first=True)


def test_a_string_is_one_name() -> None:
    model = build_torchlib_model(SMALL)
    as_string = rnn_rewrite_rules.rewrite(model, "layer_output")
    as_list = rnn_rewrite_rules.rewrite(model, ["layer_output"])
    assert op_counts(as_string) == op_counts(as_list) != op_counts(model)
    assert [r.name for r in rnn_rewrite_rules.rules("layer_output").rules] == [
        r.name for r in families()["layer_output"].rules
    ]
    try:
        rnn_rewrite_rules.install("layer_output")
        assert rnn_rewrite_rules.is_installed()
    finally:
        rnn_rewrite_rules.uninstall()


def test_unknown_names_list_the_families() -> None:
    with pytest.raises(KeyError) as error:
        rnn_rewrite_rules.rules(["nope"])
    message = str(error.value)
    assert "'nope'" in message and all(name in message for name in families())
    with pytest.raises(KeyError, match="'nope'"):
        rnn_rewrite_rules.install("nope")


def test_no_names_is_an_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="at least one") as error:
        rnn_rewrite_rules.rewrite(build_torchlib_model(SMALL), [])
    assert all(name in str(error.value) for name in families())


@pytest.mark.parametrize("model", ["model.onnx", Path("model.onnx"), b"\x08\x07", 42])
def test_rewrite_takes_models_only(model) -> None:
    with pytest.raises(TypeError, match=r"onnx\.ModelProto or an onnx_ir\.Model") as error:
        rnn_rewrite_rules.rewrite(model)
    assert ("rewrite_file" in str(error.value)) == (not isinstance(model, int))


def test_rewrite_file_returns_a_report(tmp_path) -> None:
    onnx.save(build_torchlib_model(SMALL), tmp_path / "in.onnx")
    report = rewrite_file(tmp_path / "in.onnx", tmp_path / "out.onnx", RewriteOptions(verify=True))
    assert isinstance(report, Report) and report.written
    assert report.verify is not None and report.verify.ok
    after = onnx.load(tmp_path / "out.onnx")
    assert report.after.nodes == len(after.graph.node) < report.before.nodes
    assert report.lines()[0] == f"{tmp_path / 'in.onnx'} -> {tmp_path / 'out.onnx'}"
    assert "verify: OK" in report.lines()
    assert_equivalent(onnx.load(tmp_path / "in.onnx"), after, SMALL)
    # nothing to write: the report only
    checked = rewrite_file(tmp_path / "in.onnx", None, RewriteOptions(hazards=True))
    assert not checked.written and checked.hazards_before and checked.verify is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", "out.onnx"]


def test_rewrite_file_raises_with_the_report(tmp_path) -> None:
    from onnx import TensorProto, helper

    model = build_torchlib_model(SMALL)
    model.graph.node.append(helper.make_node("RandomUniformLike", ["input"], ["noise"]))
    model.graph.output.append(helper.make_tensor_value_info("noise", TensorProto.FLOAT, None))
    onnx.save(model, tmp_path / "in.onnx")
    with pytest.raises(rnn_rewrite_rules.VerifyFailed) as error:
        rewrite_file(tmp_path / "in.onnx", tmp_path / "out.onnx", RewriteOptions(verify=True))
    assert not error.value.report.written and not error.value.report.verify.ok
    assert not (tmp_path / "out.onnx").exists()


def test_the_errors_rewrite_file_raises_are_exported(tmp_path) -> None:
    """Callers catch them by the package's names (the command maps them to exit codes)."""
    package = rnn_rewrite_rules
    assert all(getattr(package, name) is not None for name in package.__all__)
    with pytest.raises(package.ModelIOError, match="no such file"):
        rewrite_file(tmp_path / "missing.onnx", None)
    onnx.save(build_torchlib_model(SMALL), tmp_path / "in.onnx")
    with pytest.raises(package.BadOptions, match="add --verify"):
        rewrite_file(tmp_path / "in.onnx", None, RewriteOptions(shapes={"batch": (2,)}))
    with pytest.raises(package.UnknownRule):
        rewrite_file(tmp_path / "in.onnx", None, RewriteOptions(rules="nope"))
    onnx.save(without_a_runtime(build_torchlib_model(SMALL)), tmp_path / "new.onnx")
    with pytest.raises(package.CannotVerify, match="does not load"):
        rewrite_file(tmp_path / "new.onnx", tmp_path / "out.onnx", RewriteOptions(verify=True))
    assert issubclass(package.OnnxRuntimeMissing, Exception)
    assert issubclass(package.InvalidResult, Exception)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", "new.onnx"]


def test_the_rules_do_not_keep_the_last_model_alive() -> None:
    """What the rules keep from their last match (the matcher's graph, a check's plan)
    would keep the model and its folded weights alive: each rewrite builds its own."""
    model = ir.serde.deserialize_model(build_torchlib_model(RnnConfig(num_layers=2)))
    rnn_rewrite_rules.rewrite(model)
    graph = weakref.ref(model.graph)
    del model
    gc.collect()
    assert graph() is None


_PEAK_OF_REWRITE = """
import gc, sys
import onnx
import rnn_rewrite_rules
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model

rnn_rewrite_rules.rewrite(build_torchlib_model(RnnConfig()))  # imports and rules, first

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

model = onnx.load(sys.argv[1])
gc.collect()
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak (VmHWM) starts again from here
result = rnn_rewrite_rules.rewrite(model)
print((status("VmHWM") - before) / model.ByteSize())
"""


@pytest.mark.subprocess
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_rewriting_a_model_proto_holds_one_copy_of_the_weights_besides_it(tmp_path) -> None:
    """rewrite(ModelProto) builds the result while dropping each folded tensor it copied:
    besides the model given, the peak is the result and little more (a 53 MB model:
    measured 1.40x its size, 2.13x when the result was serialized from the whole rewritten
    model). Big models on disk: rewrite_file or the command (one copy at most)."""
    cfg = RnnConfig(input_size=640, hidden_size=640, num_layers=4)
    model = build_torchlib_model(cfg)
    onnx.save(model, tmp_path / "big.onnx")
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_OF_REWRITE, str(tmp_path / "big.onnx")],
        capture_output=True,
        text=True,
        env=child_env(),
        check=True,
    )
    assert float(out.stdout.strip().splitlines()[-1]) <= 1.75, out.stdout


def test_the_rewritten_proto_is_what_serializing_the_rewritten_ir_model_gives() -> None:
    model = build_torchlib_model(RnnConfig(input_size=8, hidden_size=320, num_layers=2))
    expected = ir.serde.serialize_model(
        rnn_rewrite_rules.rewrite(ir.serde.deserialize_model(model))
    )
    assert rnn_rewrite_rules.rewrite(model) == expected
    unchanged = rnn_rewrite_rules.rewrite(expected)  # nothing fires: the very same bytes
    assert unchanged.SerializeToString() == expected.SerializeToString()


def test_exclude_leaves_families_and_rules_out() -> None:
    def names(rules) -> list[str]:  # each call builds its rules anew: compared by name
        return [rule.name for rule in rules]

    everything = names(rnn_rewrite_rules.rules())
    without = names(rnn_rewrite_rules.rules(exclude="initial_state"))
    zero_state_rules = set(names(families()["initial_state"].all_rules))
    assert without == [name for name in everything if name not in zero_state_rules]
    assert names(rnn_rewrite_rules.rules(exclude=[everything[0]])) == everything[1:]
    # the model rewritten without a family keeps what that family would change
    model = build_torchlib_model(SMALL)
    kept = rnn_rewrite_rules.rewrite(model, exclude=["initial_state"])
    assert op_counts(kept)["Expand"] == op_counts(model)["Expand"] > 0
    assert op_counts(rnn_rewrite_rules.rewrite(model))["Expand"] == 0
    assert_equivalent(model, kept, SMALL)
    with pytest.raises(rnn_rewrite_rules.UnknownRule, match="nope"):
        rnn_rewrite_rules.rules(exclude="nope")
    with pytest.raises(rnn_rewrite_rules.BadOptions, match="leaves no rule"):
        rnn_rewrite_rules.rules("layout", exclude="layout")


# rule names ------------------------------------------------------------------------


def test_every_rule_is_selected_by_its_own_name() -> None:
    """Names are what ``--rules`` and the reports use: one per rule, saying its op."""
    from rnn_rewrite_rules.rules import FAMILIES, select_rules

    rules = [rule for family in FAMILIES for rule in family.all_rules]
    for rule in rules:
        assert [r.name for r in select_rules([rule.name])] == [rule.name], rule.name
    names = {rule.name for rule in rules}
    expected = {
        "DropZeroInitialState[GRU]",
        "ShareZeroInitialState[DynamicQuantizeLSTM]",
        "FoldRnnWeights[RNN]",
        "CollapseRnnGlue[Transpose]",
        "RerollCell[GRU]",
        "RerollRnn[Relu]",
        "FoldProvenIf",
        "MergeForwardReverseY[RNN]",
    }
    assert expected <= names, expected - names
