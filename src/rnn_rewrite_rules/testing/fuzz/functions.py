"""Move a model's graph into a local function at its own opset (defect 7)."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper

from rnn_rewrite_rules.testing.fuzz.case import Case, Graph
from rnn_rewrite_rules.testing.fuzz.walk import main_opset

__all__ = ["in_function", "move_into_function"]

_DOMAIN = "fuzz.local"


def move_into_function(model: onnx.ModelProto, opset: int, wrapped: bool) -> str | None:
    """The main graph becomes the body of a local function that keeps the model's opset;
    the model's opset is raised to ``opset`` and calls it, directly or (``wrapped``) from
    both branches of an ``If`` on a new bool input, whose name is returned."""
    graph = model.graph
    old = main_opset(model)
    g = Graph(model)
    overridable = {i.name for i in graph.input}
    constants = [
        helper.make_node("Constant", [], [t.name], name=g.fresh(), value=t)
        for t in graph.initializer
        if t.name not in overridable
    ]
    kept = [t for t in graph.initializer if t.name in overridable]
    inputs = [i.name for i in graph.input]
    outputs = [o.name for o in graph.output]
    other_domains = [o for o in model.opset_import if o.domain not in ("", "ai.onnx")]
    function = helper.make_function(
        _DOMAIN,
        "body",
        inputs,
        outputs,
        constants + list(graph.node),
        opset_imports=[*other_domains, helper.make_opsetid("", old)],
    )
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.node[:]
    cond = None
    if wrapped:
        cond = g.input(g.fresh(), TensorProto.BOOL, [])

        def branch() -> onnx.GraphProto:
            outs = [g.fresh() for _ in outputs]
            call = helper.make_node("body", inputs, outs, name=g.fresh(), domain=_DOMAIN)
            infos = []
            for out, source in zip(outs, graph.output, strict=True):
                info = onnx.ValueInfoProto()
                info.CopyFrom(source)
                info.name = out
                infos.append(info)
            return helper.make_graph([call], g.fresh(), [], infos)

        graph.node.append(
            helper.make_node(
                "If", [cond], outputs, name=g.fresh(), then_branch=branch(), else_branch=branch()
            )
        )
    else:
        call = helper.make_node("body", inputs, outputs, name=g.fresh(), domain=_DOMAIN)
        graph.node.append(call)
    model.functions.append(function)
    for opset_id in model.opset_import:
        if opset_id.domain in ("", "ai.onnx"):
            opset_id.version = opset
    model.opset_import.append(helper.make_opsetid(_DOMAIN, 1))
    model.ir_version = max(model.ir_version, 8)
    return cond


def in_function(draw, case: Case) -> bool:
    """:func:`move_into_function` to a drawn higher opset (defect 7)."""
    old = main_opset(case.model)
    if old >= 21 or any(o.domain == _DOMAIN for o in case.model.opset_import):
        return False
    new = draw(st.integers(old + 1, 21))
    wrapped = draw(st.booleans())
    before = onnx.ModelProto()
    before.CopyFrom(case.model)
    cond = move_into_function(case.model, new, wrapped)
    try:  # the checker refuses a function op whose schema changed between the two opsets
        onnx.checker.check_model(case.model)
    except onnx.checker.ValidationError:
        case.model.CopyFrom(before)
        return False
    if cond is not None:
        case.fixed[cond] = np.array(draw(st.booleans()))
    case.note(f"in_function(opset {old} in a model at {new}, in an If: {wrapped})")
    return True
