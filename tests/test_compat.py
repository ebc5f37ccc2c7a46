"""_compat: the version range, the clear failure outside it, and each private access it wraps.

These run on every onnxscript / onnx-ir CI tests (the lowest and the highest supported):
each wrapped access is exercised for real, not mocked.
"""

from __future__ import annotations

import ast
import pathlib
import re
import warnings

import onnx
import onnx_ir as ir
import onnxscript.rewriter
import pytest
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet

import rnn_rewrite_rules
import rnn_rewrite_rules._install
from rnn_rewrite_rules import _compat, _report
from rnn_rewrite_rules.cli import ExitCode, main
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model

SRC = pathlib.Path(rnn_rewrite_rules.__file__).resolve().parent
PYPROJECT = SRC.parents[1] / "pyproject.toml"


@pytest.fixture
def _restore_defaults():
    original = onnxscript.rewriter._DEFAULT_REWRITE_RULES
    yield
    rnn_rewrite_rules.uninstall()
    onnxscript.rewriter._DEFAULT_REWRITE_RULES = original


@pytest.fixture
def old_onnxscript(monkeypatch) -> str:
    """Make the installed onnxscript report a release below the range."""
    monkeypatch.setattr(_compat, "onnxscript_version", lambda: "0.4.3")
    return "0.4.3"


# --- the range ------------------------------------------------------------------------------


def test_installed_onnxscript_is_in_range() -> None:
    _compat.check_onnxscript()  # CI installs only supported versions: this must not raise


@pytest.mark.parametrize("version", ["0.5.0", "0.5.7", "0.6.2", "0.7.2", "0.8.0rc1", "0.8.9"])
def test_versions_in_range(version: str) -> None:
    _compat.check_onnxscript(version)


@pytest.mark.parametrize("version", ["0.4.9", "0.3.2", "0.9.0", "0.9.0.dev20270101", "1.0", ""])
def test_versions_outside_range(version: str) -> None:
    with pytest.raises(_compat.UnsupportedVersionError) as error:
        _compat.check_onnxscript(version)
    message = str(error.value)
    assert f"onnxscript {version} is installed" in message
    assert _compat.ONNXSCRIPT_RANGE in message
    assert "\n" not in message
    assert isinstance(error.value, RuntimeError)  # what install() raised before


def _padded(version: str) -> tuple[int, ...]:
    numbers = tuple(int(part) for part in version.split("."))
    return numbers + (0,) * (3 - len(numbers))


def test_range_agrees_with_pyproject_and_the_low_pins() -> None:
    """The run-time range, pyproject's lower bounds and the versions CI tests them with agree."""
    if not PYPROJECT.exists():
        pytest.skip("an installed wheel: no pyproject.toml next to the package")
    text = PYPROJECT.read_text()
    assert f'"onnxscript{_compat.ONNXSCRIPT_RANGE}"' in text
    pins = dict(
        line.split("==")
        for line in (PYPROJECT.parent / ".ci" / "constraints-low.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert _padded(pins["onnxscript"]) == _compat.ONNXSCRIPT_MIN
    for name, version in pins.items():
        bounds = re.findall(rf'"{re.escape(name)}>=([0-9.]+)', text)
        assert bounds, f"{name} has no lower bound in pyproject.toml"
        assert {_padded(b) for b in bounds} == {_padded(version)}, (name, bounds, version)


# --- the clear failure outside the range ----------------------------------------------------


@pytest.mark.usefixtures("_restore_defaults")
def test_install_refuses_an_unsupported_onnxscript(old_onnxscript: str) -> None:
    defaults = onnxscript.rewriter._DEFAULT_REWRITE_RULES
    with pytest.raises(_compat.UnsupportedVersionError, match=f"onnxscript {old_onnxscript} "):
        rnn_rewrite_rules.install()
    assert onnxscript.rewriter._DEFAULT_REWRITE_RULES is defaults
    assert not rnn_rewrite_rules.is_installed()
    rnn_rewrite_rules.uninstall()  # nothing installed: still fine


def test_rewrite_refuses_an_unsupported_onnxscript(old_onnxscript: str) -> None:
    proto = build_torchlib_model(RnnConfig(num_layers=2))
    model = ir.serde.deserialize_model(proto)
    before = ir.serde.serialize_model(model).SerializeToString()
    with pytest.raises(_compat.UnsupportedVersionError, match=_compat.ONNXSCRIPT_RANGE):
        rnn_rewrite_rules.rewrite(model)
    assert ir.serde.serialize_model(model).SerializeToString() == before
    with pytest.raises(_compat.UnsupportedVersionError):
        rnn_rewrite_rules.rewrite(proto)


def test_cli_prints_one_line_and_its_own_exit_code(old_onnxscript, tmp_path, capsys) -> None:
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(build_torchlib_model(RnnConfig()), source)
    code = main([str(source), "-o", str(target)])
    captured = capsys.readouterr()
    assert code == ExitCode.UNSUPPORTED_ONNXSCRIPT == 15
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("rnn-rewrite: error: onnxscript 0.4.3 is installed")
    assert _compat.ONNXSCRIPT_RANGE in lines[0]
    assert not target.exists()


# --- each wrapped private access, on the installed versions ---------------------------------


@pytest.mark.usefixtures("_restore_defaults")
def test_default_rewrite_rules_are_what_onnxscript_reads() -> None:
    defaults = _compat.default_rewrite_rules()
    assert defaults == onnxscript.rewriter._DEFAULT_REWRITE_RULES
    assert defaults, "onnxscript ships default rules"
    _compat.set_default_rewrite_rules(defaults[:1])
    assert defaults[:1] == onnxscript.rewriter._DEFAULT_REWRITE_RULES
    assert isinstance(onnxscript.rewriter._DEFAULT_REWRITE_RULES, tuple)


class _CopyWithAttribute(RewriteRuleClassBase):
    """Re-emits a custom-domain node through emit_node, with one more attribute."""

    def __init__(self, num_outputs: int) -> None:
        super().__init__(name=f"copy{num_outputs}")
        self.num_outputs = num_outputs

    def pattern(self, op, x):
        return op.Custom(
            x,
            _domain="test.compat",
            _allow_other_attributes=True,
            _outputs=[f"out{i}" for i in range(self.num_outputs)],
        )

    def check(self, context, out0, **_) -> MatchResult:
        node = out0.producer()
        if "copied" in node.attributes:
            return MatchResult().fail("already copied", node)
        return MatchResult()

    def rewrite(self, op, out0, **_):
        node = out0.producer()
        attributes = {**node.attributes, "copied": ir.AttrInt64("copied", 1)}
        outputs = _compat.emit_node(
            op, node.op_type, list(node.inputs), attributes,
            domain=node.domain, num_outputs=self.num_outputs,
        )  # fmt: skip
        assert isinstance(outputs, list) and len(outputs) == self.num_outputs
        return outputs if self.num_outputs > 1 else outputs[0]


@pytest.mark.parametrize("num_outputs", [1, 3])
def test_emit_node_keeps_domain_attributes_and_outputs(num_outputs: int) -> None:
    outputs = [f"y{i}" for i in range(num_outputs)]
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(
            [
                onnx.helper.make_node(
                    "Custom", ["x"], outputs, domain="test.compat", alpha=0.5, mode="m"
                )
            ],
            "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
            [onnx.helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, None) for y in outputs],
        ),
        opset_imports=[
            onnx.helper.make_opsetid("", 18),
            onnx.helper.make_opsetid("test.compat", 1),
        ],
    )
    model = ir.serde.deserialize_model(proto)
    assert RewriteRuleSet([_CopyWithAttribute.rule(num_outputs)]).apply_to_model(model) == 1
    (node,) = model.graph
    assert (node.domain, node.op_type, len(node.outputs)) == ("test.compat", "Custom", num_outputs)
    assert node.attributes.get_float("alpha") == 0.5
    assert node.attributes.get_string("mode") == "m"
    assert node.attributes.get_int("copied") == 1
    assert [v.name for v in model.graph.outputs] == outputs


def test_rule_callables_find_the_rule_class() -> None:
    rule = rnn_rewrite_rules.rules(["layout"]).rules[0]
    condition, replacement = _compat.rule_callables(rule)
    assert condition is not None and replacement is not None
    assert type(condition.__self__).__name__ == "LayoutToTimeMajor"
    assert "(X, ..., layout=1) -> Transpose(" in _report.rule_description(rule)


def test_rewrite_names_empty_outputs_flag_matches_the_version() -> None:
    release = _compat._release(_compat.onnxscript_version())
    assert (release >= (0, 7, 1)) == _compat.REWRITE_NAMES_EMPTY_OUTPUTS


# --- one place for private access -----------------------------------------------------------

_UPSTREAM = ("onnxscript", "onnx_ir")


def _private_accesses(path: pathlib.Path) -> list[str]:
    """Imports of private onnxscript/onnx-ir modules or names, and reads of private attributes."""
    tree = ast.parse(path.read_text())
    ours = {"self", "cls"} | {  # names bound to this package's own modules
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rnn_rewrite_rules")
        for alias in node.names
    }
    ours |= {  # classes and functions the file defines itself
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_UPSTREAM):
            parts = node.module.split(".")
            names = [a.name for a in node.names]
            if any(p.startswith("_") for p in parts) or any(n.startswith("_") for n in names):
                found.append(f"{path.name}:{node.lineno}: from {node.module} import {names}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in _UPSTREAM and any(p.startswith("_") for p in parts):
                    found.append(f"{path.name}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            own = (isinstance(node.value, ast.Name) and node.value.id in ours) or (
                # super()._x: the hook a subclass overrides (onnx.reference's OpRun._run)
                isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "super"
            )
            if not node.attr.startswith("__") and not own:
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
            and not str(node.args[1].value).startswith("__")
        ):
            found.append(f"{path.name}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_private_upstream_access_only_in_compat() -> None:
    offenders = [
        access
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "_compat.py"
        for access in _private_accesses(path)
    ]
    assert not offenders, offenders


def test_the_private_access_check_can_fail(tmp_path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import onnxscript.rewriter as _rw\n"
        "from onnxscript.rewriter._basics import MatchStatus\n"
        "from onnx_ir.passes.common import _c_api_utils\n"
        "x = _rw._DEFAULT_REWRITE_RULES\n"
        "y = getattr(rule, '_condition_function', None)\n"
        "z = self._fine\n"
        "class Own:\n    pass\n"
        "w = Own._fine\n"
    )
    assert len(_private_accesses(sample)) == 4


# --- onnxscript releases that export nn.GRU wrongly (onnxscript #2852) ----------------------


@pytest.mark.parametrize(
    ("version", "buggy"),
    [("0.5.6", False), ("0.5.7", True), ("0.6.0", True), ("0.7.0", True), ("0.7.1", False)],
)
def test_gru_export_bug_names_the_releases_and_the_fix(version: str, buggy: bool) -> None:
    hazard = _compat.gru_export_bug(version)
    assert (hazard is not None) == buggy
    if buggy:
        assert f"onnxscript {version} " in hazard and "onnxscript>=0.7.1" in hazard


@pytest.mark.usefixtures("_restore_defaults")
def test_install_warns_once_on_a_release_that_exports_gru_wrongly(monkeypatch) -> None:
    monkeypatch.setattr(_compat, "onnxscript_version", lambda: "0.6.0")
    monkeypatch.setattr(rnn_rewrite_rules._install, "_warned_gru_export", False)
    with pytest.warns(UserWarning, match=r"onnxscript #2852.*onnxscript>=0\.7\.1"):
        rnn_rewrite_rules.install()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rnn_rewrite_rules.install()  # once per process
    assert rnn_rewrite_rules.is_installed()


@pytest.mark.usefixtures("_restore_defaults")
def test_install_does_not_warn_on_a_fixed_release(monkeypatch) -> None:
    monkeypatch.setattr(_compat, "onnxscript_version", lambda: "0.7.1")
    monkeypatch.setattr(rnn_rewrite_rules._install, "_warned_gru_export", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rnn_rewrite_rules.install()
