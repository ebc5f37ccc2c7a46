"""The GRU's state update read by its math, whatever the spelling (``rules/cell``).

A GRU Loop over ``len(X)`` (``rnn_rewrite_rules.testing.loops``) whose ``h_t`` is rewritten in
each spelling exporters write: the Loop becomes one ``GRU`` with the outputs of the
original at several lengths and batches, 0 steps included (the zero-step guard). Near
misses (the swapped convention, a wrong coefficient, a Tanh update gate) keep the Loop
and say why. The polynomial reading itself is tested on small graphs.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import loop_scan
from rnn_rewrite_rules.rules.cell.polynomial import polynomial, render
from rnn_rewrite_rules.shape.constant import Constants
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model, loop_inputs
from tests.reasons import refusal_reasons

SPEC = LoopSpec(cell="GRU", form="torch", trip_count="length", hidden_size=4, outputs=("y", "h"))

#: ``emit(op, z, h, n, one)`` -> the name of h_t; ``op(type, *inputs)`` adds a node.
Spelling = Callable[..., str]

#: Spellings of ``h_t = z * h + (1 - z) * n`` (each one exporter's or a rearrangement).
EQUAL: dict[str, Spelling] = {
    "keras z*h + (1-z)*n": lambda op, z, h, n, one: op(
        "Add", op("Mul", z, h), op("Mul", op("Sub", one, z), n)
    ),
    "flax (1-z)*n + z*h": lambda op, z, h, n, one: op(
        "Add", op("Mul", op("Sub", one, z), n), op("Mul", z, h)
    ),
    "operands commuted n*(1-z) + h*z": lambda op, z, h, n, one: op(
        "Add", op("Mul", n, op("Sub", one, z)), op("Mul", h, z)
    ),
    "torch (h-n)*z + n": lambda op, z, h, n, one: op("Add", op("Mul", op("Sub", h, n), z), n),
    "n + z*(h-n)": lambda op, z, h, n, one: op("Add", n, op("Mul", z, op("Sub", h, n))),
    "n - z*(n-h)": lambda op, z, h, n, one: op("Sub", n, op("Mul", z, op("Sub", n, h))),
    "one-minus as Add(Neg(z), 1)": lambda op, z, h, n, one: op(
        "Add", op("Mul", z, h), op("Mul", op("Add", op("Neg", z), one), n)
    ),
    "one-minus as Add(1, Neg(z))": lambda op, z, h, n, one: op(
        "Add", op("Mul", op("Add", one, op("Neg", z)), n), op("Mul", z, h)
    ),
    "associated (z*h + n) - z*n": lambda op, z, h, n, one: op(
        "Sub", op("Add", op("Mul", z, h), n), op("Mul", z, n)
    ),
    "associated z*h + (n - n*z)": lambda op, z, h, n, one: op(
        "Add", op("Mul", z, h), op("Sub", n, op("Mul", n, z))
    ),
    "through Identity": lambda op, z, h, n, one: op(
        "Add", op("Identity", op("Mul", z, h)), op("Mul", op("Sub", one, z), n)
    ),
}

_NOT_UPDATE = "h_t is not z * h_(t-1) + (1 - z) * n nor (h_(t-1) - n) * z + n (GRU)"
#: Near misses and the reason the Loop is kept.
NEAR: dict[str, tuple[Spelling, str]] = {
    "swapped (1-z)*h + z*n": (
        lambda op, z, h, n, one: op("Add", op("Mul", op("Sub", one, z), h), op("Mul", z, n)),
        "h_t is (1 - z) * h_(t-1) + z * n: the update gate weighs the candidate, ONNX's weighs"
        " h_(t-1) (GRU)",
    ),
    "(1+z)*n + z*h": (
        lambda op, z, h, n, one: op("Add", op("Mul", op("Add", one, z), n), op("Mul", z, h)),
        _NOT_UPDATE,
    ),
    "(1-z)*n + z*n (no h)": (
        lambda op, z, h, n, one: op("Add", op("Mul", op("Sub", one, z), n), op("Mul", z, n)),
        _NOT_UPDATE,
    ),
    "(h-n)*z - n": (
        lambda op, z, h, n, one: op("Sub", op("Mul", op("Sub", h, n), z), n),
        _NOT_UPDATE,
    ),
    "z*h + (1-z)*n*n": (
        lambda op, z, h, n, one: op(
            "Add", op("Mul", z, h), op("Mul", op("Mul", op("Sub", one, z), n), n)
        ),
        _NOT_UPDATE,
    ),
    "h_t a Mul": (
        lambda op, z, h, n, one: op("Mul", op("Add", op("Mul", z, h), n), one),
        "h_t is respelled_3 (Mul), not an Add or a Sub (GRU)",  # names the node
    ),
}


def _respelled(spelling: Spelling, *, update_gate: str = "Sigmoid") -> onnx.ModelProto:
    """The GRU Loop (torch form: ``h_t = Add(Mul(Sub(h, n), z), n)``) with ``h_t``
    computed by ``spelling`` instead; ``update_gate``: the activation computing ``z``."""
    model = build_loop_model(SPEC)
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = loop.attribute[0].g
    made = {out: node for node in body.node for out in node.output}
    root = next(
        node
        for node in body.node
        if node.op_type == "Add" and node.input[0] in made
        if made[node.input[0]].op_type == "Mul" and made[node.input[0]].input[0] in made
        if made[made[node.input[0]].input[0]].op_type == "Sub"
    )
    mul = made[root.input[0]]
    sub = made[mul.input[0]]
    z, (h, n) = mul.input[1], sub.input
    assert root.input[1] == n
    made[z].op_type = update_gate
    one = helper.make_node(
        "Constant", [], ["respelled_one"], value=helper.make_tensor("", 1, [], [1.0])
    )
    nodes: list[onnx.NodeProto] = [one]

    def op(op_type: str, *inputs: str) -> str:
        name = f"respelled_{len(nodes)}"
        nodes.append(helper.make_node(op_type, list(inputs), [name], name=name))
        return name

    spelling(op, z, h, n, "respelled_one")
    nodes[-1].output[0] = root.output[0]
    old = list(body.node)
    del body.node[:]
    for node in old:  # the new nodes where h_t's Add was (after z, h and n)
        if node is root:
            body.node.extend(nodes)
        elif node not in (mul, sub):
            body.node.append(node)
    onnx.checker.check_model(model)
    return model


def op_counts(model: onnx.ModelProto) -> collections.Counter[str]:
    """Op types at every depth (the node sits in the zero-step guard's ``If``)."""

    def walk(graph: onnx.GraphProto) -> Iterator[str]:
        for node in graph.node:
            yield node.op_type
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attr.g)

    return collections.Counter(walk(model.graph))


def _assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    for batch, seq in ((1, 1), (3, 6), (2, 0), (1, 9)):  # 0 steps: the guard's branch
        feeds = loop_inputs(SPEC, batch, seq, seed=seq)
        want, got = runtime.run(before, feeds), runtime.run(after, feeds)
        for a, b in zip(want, got, strict=True):
            assert a.shape == b.shape, (batch, seq)
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=f"{batch}, {seq}")


@pytest.mark.parametrize("name", sorted(EQUAL))
def test_each_spelling_of_the_update_becomes_one_gru(name: str) -> None:
    model = _respelled(EQUAL[name])
    result = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    onnx.checker.check_model(result, full_check=True)
    counts = op_counts(result)
    assert counts["GRU"] == 1
    assert counts["Loop"] == 1  # the zero-step guard's Loop alone: a trip count of 0
    _assert_same_outputs(model, result)


@pytest.mark.parametrize("name", sorted(NEAR))
def test_a_near_miss_of_the_update_keeps_the_loop(name: str) -> None:
    spelling, reason = NEAR[name]
    model = _respelled(spelling)
    result = rnn_rewrite_rules.rewrite(model, target="onnxruntime")
    assert op_counts(result)["GRU"] == 0
    assert reason in refusal_reasons(loop_scan.make_rules("onnxruntime"), model)


def test_a_tanh_update_gate_is_refused() -> None:
    """``z = tanh(...)``: the update reads as a GRU's, but the reset gate is a Sigmoid,
    and ONNX's GRU has one activation for both."""
    model = _respelled(EQUAL["flax (1-z)*n + z*h"], update_gate="Tanh")
    assert op_counts(rnn_rewrite_rules.rewrite(model, target="onnxruntime"))["GRU"] == 0
    reason = "the reset gate's activation is not the update gate's (GRU)"
    assert reason in refusal_reasons(loop_scan.make_rules("onnxruntime"), model)


_EXPRESSIONS = """
<ir_version: 10, opset_import: ["" : 18]>
g (float[2, 3] z, float[2, 3] h, float[2, 3] n) => (float[2, 3] a, float[2, 3] b, float[2, 3] c)
{
    one = Constant <value = float {1.0}> ()
    two = Constant <value = float[2] {1.0, 1.0}> ()
    zh = Mul(z, h)
    omz = Sub(one, z)
    omzn = Mul(omz, n)
    a = Add(zh, omzn)
    zz = Add(z, z)
    nn = Add(n, n)
    zzn = Mul(zz, n)
    znn = Mul(z, nn)
    b = Sub(zzn, znn)
    twon = Mul(two, n)
    c = Add(zh, twon)
}
"""


def _graph_values() -> dict[str, ir.Value]:
    graph = ir.from_onnx_text(_EXPRESSIONS).graph
    return {v.name: v for v in [*graph.inputs, *graph.outputs] if v.name}


def test_the_polynomial_of_a_spelling_is_its_expansion() -> None:
    values = _graph_values()
    found = polynomial(values["a"], Constants(18))
    assert not isinstance(found, str)
    poly, atoms = found
    assert atoms == [values["z"], values["h"], values["n"]]
    assert render(poly, lambda v: v.name or "?") == "z * h + n - z * n"


def test_terms_that_cancel_leave_nothing() -> None:
    """``2z * n - z * 2n`` is 0: no monomial is kept with a zero coefficient."""
    found = polynomial(_graph_values()["b"], Constants(18))
    assert not isinstance(found, str)
    assert found[0] == {}


def test_a_constant_that_is_not_a_scalar_is_refused() -> None:
    """A ``[2]`` constant broadcasts (it could change a shape): not a coefficient."""
    found = polynomial(_graph_values()["c"], Constants(18))
    assert found == "two is not a float scalar"
