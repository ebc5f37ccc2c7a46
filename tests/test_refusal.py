"""A refusal is a typed value: every proof that says why not returns a ``Refusal``."""

from __future__ import annotations

import ast
from pathlib import Path

import onnx_ir as ir

import rnn_rewrite_rules
from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules.rules.reroll import plan_chain
from rnn_rewrite_rules.shape import Dim, reshape

_ROOT = Path(rnn_rewrite_rules.__file__).parent


def _bare_reasons(path: Path, root: Path = _ROOT) -> list[str]:
    """``return "..."`` / ``return f"..."`` in the functions of ``path`` that return a
    ``Refusal``: each reason must be one."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef) or function.returns is None:
            continue
        if "Refusal" not in ast.unparse(function.returns):
            continue
        for node in ast.walk(function):
            value = node.value if isinstance(node, ast.Return) else None
            if isinstance(value, ast.JoinedStr) or (
                isinstance(value, ast.Constant) and isinstance(value.value, str)
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno} {function.name}")
    return found


def test_every_reason_a_refusing_function_returns_is_a_refusal() -> None:
    paths = sorted(_ROOT.rglob("*.py"))
    assert (
        sum(1 for p in paths if "-> Refusal" in p.read_text() or "| Refusal" in p.read_text()) > 15
    )
    assert [bare for path in paths for bare in _bare_reasons(path)] == []


def test_the_check_sees_a_bare_reason(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('def f(x) -> int | Refusal:\n    return "no"\n')
    assert _bare_reasons(module, tmp_path) == ["m.py:2 f"]


def test_refusals_are_their_own_type_and_read_as_their_reason() -> None:
    facts = rnn_facts(None)
    assert isinstance(facts, Refusal) and facts == "value is not produced by a node"
    assert repr(facts) == "Refusal('value is not produced by a node')"
    found = reshape((Dim.const(2),), (Dim.const(0), Dim.const(0)), 0)
    assert isinstance(found, Refusal) and "is 0 but the input has only 1 axes" in found
    node = ir.node("Tanh", [ir.Value(name="x")])
    assert isinstance(plan_chain(node), Refusal)
    model = ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": 18}), ir_version=10)
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 17})
    function = ir.Function("d", "f", graph=graph, attributes=[])
    assert isinstance(opset_version(model, function), Refusal)
    assert opset_version(model, model.graph) == 18
