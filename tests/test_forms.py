"""FormRule: the per-output-count patterns of one form as one named rule."""

from __future__ import annotations

from typing import ClassVar

import onnx_ir as ir
import pytest
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet
from onnxscript.rewriter._basics import MatchingTracer, MatchStatus

from rnn_rewrite_rules.rules._forms import FormRule

_RULE_NAME_TAG = "pkg.onnxscript.rewriter.rule_name"


class _Split(RewriteRuleClassBase):
    """test.Multi with ``n`` outputs -> test.Done with ``n`` outputs."""

    calls: ClassVar[list[str]] = []

    def __init__(self, n: int, remove_nodes: bool = True) -> None:
        super().__init__(name=f"_Split[{n}]", remove_nodes=remove_nodes)
        self.n = n

    def pattern(self, op, x):
        return op.Multi(x, _domain="test", _outputs=[f"out{i}" for i in range(self.n)])

    def check(self, context, x, out0, **_):
        node = out0.producer()
        if len(node.outputs) != self.n:
            return MatchResult().fail(f"node has {len(node.outputs)} outputs, not {self.n}")
        if node.name == "refused":
            return MatchResult().fail("named refused", node)
        return MatchResult()

    def rewrite(self, op, x, **_):
        return op.Done(x, _domain="test", _outputs=self.n)

    def setup(self):
        self.calls.append(f"setup{self.n}")

    def cleanup(self):
        self.calls.append(f"cleanup{self.n}")


def _model(*counts: int, names: tuple[str, ...] = ()) -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    nodes, outputs = [], []
    for index, count in enumerate(counts):
        name = names[index] if index < len(names) else f"multi{index}"
        node = ir.Node("test", "Multi", [x], num_outputs=count, name=name)
        for j, out in enumerate(node.outputs):
            out.name = f"{name}_{j}"
        nodes.append(node)
        outputs.extend(node.outputs)
    graph = ir.Graph([x], outputs, nodes=nodes, opset_imports={"": 21, "test": 1})
    return ir.Model(graph, ir_version=10)


def _form() -> FormRule:
    return FormRule("Split", [_Split.rule(n) for n in (3, 2, 1)])


def test_one_rule_rewrites_every_output_count_under_its_name():
    model = _model(1, 2, 3)
    count = RewriteRuleSet([_form()]).apply_to_model(model)
    assert count == 3
    done = [n for n in model.graph if n.op_type == "Done"]
    assert [len(n.outputs) for n in done] == [1, 2, 3]
    assert {n.metadata_props[_RULE_NAME_TAG] for n in done} == {"Split"}
    assert not [n for n in model.graph if n.op_type == "Multi"]


def test_a_count_no_variant_has_is_left_alone():
    model = _model(4)
    assert RewriteRuleSet([_form()]).apply_to_model(model) == 0
    assert [n.op_type for n in model.graph] == ["Multi"]


def test_the_variants_are_tried_in_order():
    # without its output-count check a one-output pattern would take a 3-output node too:
    # the first variant that rewrites wins, as when the variants were listed one by one
    rule = FormRule("Split", [_Split.rule(1), _Split.rule(3)])
    model = _model(3)
    assert RewriteRuleSet([rule]).apply_to_model(model) == 1
    assert [len(n.outputs) for n in model.graph if n.op_type == "Done"] == [3]


def test_each_variant_is_set_up_and_cleaned_up():
    _Split.calls.clear()
    RewriteRuleSet([_form()]).apply_to_model(_model(2))
    assert _Split.calls == ["setup3", "setup2", "setup1", "cleanup3", "cleanup2", "cleanup1"]


def test_a_tracer_sees_the_refusal_and_nothing_changes():
    model = _model(2, names=("refused",))
    tracer = MatchingTracer()
    RewriteRuleSet([_form()]).apply_to_model(model, tracer=tracer)
    reasons = {
        (rule.name, str(info.match_result.reason))
        for rule, matches in tracer.best_matches_map.items()
        for info in matches
        if info.status == MatchStatus.CONDITION_FAILED
    }
    assert ("Split", "named refused") in reasons
    assert [n.op_type for n in model.graph] == ["Multi"]


def test_commute_keeps_one_rule():
    rules = RewriteRuleSet([_form()], commute=True).rules
    assert [r.name for r in rules] == ["Split"]
    model = _model(2)
    assert RewriteRuleSet(rules).apply_to_model(model) == 1


def test_match_gives_the_first_variants_match():
    model = _model(2)
    node = next(iter(model.graph))
    assert _form().match(model, model.graph, node)
    assert not FormRule("Split", [_Split.rule(1)]).match(model, model.graph, _model(4).graph[0])


def test_bad_variants_are_refused():
    with pytest.raises(ValueError, match="no variants"):
        FormRule("Split", [])
    with pytest.raises(ValueError, match="remove_nodes"):
        FormRule("Split", [_Split.rule(2), _Split.rule(1, remove_nodes=False)])
