"""install(): every path that reads onnxscript's default rules applies ours."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import onnxscript.optimizer
import onnxscript.rewriter
import pytest

import rnn_rewrite_rules
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model
from tests.support import assert_equivalent, op_counts

CFG = RnnConfig(num_layers=3, bidirectional=True, hidden_size=12, batch_first=True)


@pytest.fixture(autouse=True)
def _restore_defaults():
    original = onnxscript.rewriter._DEFAULT_REWRITE_RULES
    yield
    rnn_rewrite_rules.uninstall()
    onnxscript.rewriter._DEFAULT_REWRITE_RULES = original


def _optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnxscript.optimizer.optimize(model)


def _optimize_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    ir_model = ir.serde.deserialize_model(model)
    onnxscript.optimizer.optimize_ir(ir_model)
    return ir.serde.serialize_model(ir_model)


def _rewrite_default(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnxscript.rewriter.rewrite(model)


PATHS = [_optimize, _optimize_ir, _rewrite_default]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.__name__)
def test_default_paths_apply_our_rules_only_when_installed(path) -> None:
    model = build_torchlib_model(CFG)
    without = path(model)
    assert op_counts(without)["Shape"] > 0  # onnxscript alone keeps the runtime chains
    rnn_rewrite_rules.install()
    with_rules = path(model)
    # one Shape is left: the batch size the shared zero state reads (the portable form)
    assert op_counts(with_rules)["Shape"] == op_counts(with_rules)["ConstantOfShape"] == 1
    assert op_counts(with_rules)["Mul"] == 0
    assert_equivalent(model, with_rules, CFG)
    rnn_rewrite_rules.uninstall()
    assert op_counts(path(model)) == op_counts(without)


def test_install_is_idempotent_and_uninstall_keeps_others_rules() -> None:
    defaults = onnxscript.rewriter._DEFAULT_REWRITE_RULES
    rnn_rewrite_rules.install()
    once = onnxscript.rewriter._DEFAULT_REWRITE_RULES
    rnn_rewrite_rules.install()
    assert once == onnxscript.rewriter._DEFAULT_REWRITE_RULES
    assert len(once) > len(defaults)
    assert once[len(once) - len(defaults) :] == defaults  # ours go first
    assert rnn_rewrite_rules.is_installed()

    someone_elses = onnxscript.rewriter._DEFAULT_REWRITE_RULES[-1]
    onnxscript.rewriter._DEFAULT_REWRITE_RULES = (*once, someone_elses)
    rnn_rewrite_rules.uninstall()
    assert (*defaults, someone_elses) == onnxscript.rewriter._DEFAULT_REWRITE_RULES
    assert not rnn_rewrite_rules.is_installed()
    rnn_rewrite_rules.uninstall()  # idempotent too


def test_installed_context_manager_restores_state() -> None:
    defaults = onnxscript.rewriter._DEFAULT_REWRITE_RULES
    with rnn_rewrite_rules.installed():
        assert rnn_rewrite_rules.is_installed()
        with rnn_rewrite_rules.installed(["layer_output"]):
            assert rnn_rewrite_rules.is_installed()
        assert rnn_rewrite_rules.is_installed()
        assert len(onnxscript.rewriter._DEFAULT_REWRITE_RULES) > len(defaults) + 1
    assert defaults == onnxscript.rewriter._DEFAULT_REWRITE_RULES


def test_install_rejects_unknown_names() -> None:
    with pytest.raises(KeyError):
        rnn_rewrite_rules.install(["no_such_rule"])
    assert not rnn_rewrite_rules.is_installed()


def test_rules_for_explicit_rewrite() -> None:
    model = build_torchlib_model(CFG)
    after = onnxscript.rewriter.rewrite(model, pattern_rewrite_rules=rnn_rewrite_rules.rules())
    assert op_counts(after)["Shape"] == op_counts(after)["ConstantOfShape"] == 1
    assert op_counts(after)["Mul"] == op_counts(after)["Slice"] == 0
    minimal = onnxscript.rewriter.rewrite(
        model, pattern_rewrite_rules=rnn_rewrite_rules.rules(target="onnxruntime")
    )
    assert op_counts(minimal)["Shape"] == 0
    assert_equivalent(model, after, CFG)


def test_default_target_keeps_explicit_zero_states() -> None:
    """The default (portable) output: no RNN loses its initial_h (tract rejects those), the
    runtime zeros become one shared ConstantOfShape; target="onnxruntime" drops them."""
    cfg = RnnConfig(num_layers=2, hidden_size=8)  # torchlib's runtime zero states
    model = build_torchlib_model(cfg)
    portable = rnn_rewrite_rules.rewrite(model)
    rnns = [n for n in portable.graph.node if n.op_type == "LSTM"]
    assert all(len(n.input) > 6 and n.input[5] for n in rnns)  # initial_h kept
    assert len({n.input[5] for n in rnns} | {n.input[6] for n in rnns}) == 1  # shared
    assert op_counts(portable)["Mul"] == 0  # the layer chains are still gone
    assert op_counts(portable)["ConstantOfShape"] == 1
    assert_equivalent(model, portable, cfg)
    minimal = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    assert all(len(n.input) <= 5 for n in minimal.graph.node if n.op_type == "LSTM")
    assert_equivalent(model, minimal, cfg)
    rnn_rewrite_rules.install()
    names = {r.name or "" for r in onnxscript.rewriter._DEFAULT_REWRITE_RULES}
    assert not any(name.startswith("DropZeroInitialState") for name in names)
    assert any(name.startswith("ShareZeroInitialState") for name in names)
    assert any(name.startswith("FoldRnnWeights") for name in names)
    rnn_rewrite_rules.install(target="onnxruntime")
    names = {r.name or "" for r in onnxscript.rewriter._DEFAULT_REWRITE_RULES}
    assert any(name.startswith("DropZeroInitialState") for name in names)
    assert not any(name.startswith("ShareZeroInitialState") for name in names)


def test_unknown_target_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown target .tract.*portable, onnxruntime"):
        rnn_rewrite_rules.rules(target="tract")
