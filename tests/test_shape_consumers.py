"""``shape.consumers``: sizes a node proves equal by running (Concat, MatMul, broadcasting
ops only where neither size can be 1)."""

from __future__ import annotations

import onnx_ir as ir
import pytest

from rnn_rewrite_rules.shape import Dim, ShapeProver
from rnn_rewrite_rules.shape.consumers import never_one, required_equal


def _graph(body: str) -> ir.Graph:
    text = f"""
    <ir_version: 10, opset_import: ["" : 20]>
    g (float[A, 6] x, float[B, 6] h, float[C, 6] c) => (float[N] y) {{
        {body}
    }}
    """
    return ir.from_onnx_text(text).graph


def _batches_equal(body: str, a: str = "x", b: str = "h") -> bool:
    graph = _graph(body)
    prover = ShapeProver(graph)
    values = {v.name: v for v in graph.inputs}
    equal = required_equal(prover, list(graph))
    return equal.same(prover.dim(values[a], 0), prover.dim(values[b], 0))


@pytest.mark.parametrize(
    ("body", "equal"),
    [
        ("y = Concat <axis = 1> (x, h)", True),
        ("y = Concat <axis = -1> (x, h)", True),
        ("y = Concat <axis = 0> (x, h)", False),  # the batch axis: any two batches
        ("t = Transpose <perm = [1, 0]> (x)\n y = MatMul (t, h)", True),  # contracted
        ("y = MatMul (x, h)", False),  # contracts the widths, not the batches
        ("y = Add (x, h)", False),  # a batch of 1 broadcasts against any other
        ("y = Mul (x, h)", False),
    ],
)
def test_what_a_consumer_proves_about_two_batches(body, equal) -> None:
    assert _batches_equal(body) is equal


def test_equal_sizes_are_joined_across_consumers() -> None:
    """``Concat(x, h)`` and ``Concat(h, c)`` prove ``x``'s batch ``c``'s."""
    body = "t = Concat <axis = 1> (x, h)\n y = Concat <axis = 1> (h, c)"
    assert _batches_equal(body, "x", "c")
    assert not _batches_equal("y = Concat <axis = 1> (x, h)", "x", "c")


def test_broadcasting_proves_sizes_that_cannot_be_one() -> None:
    """``2*A`` against ``2*B``: neither can be 1, so they are equal wherever Add runs."""
    body = """
        xx = Concat <axis = 0> (x, x)
        hh = Concat <axis = 0> (h, h)
        y = Add (xx, hh)
    """
    assert _batches_equal(body)
    odd = """
        xx = Concat <axis = 0> (x, x, x)
        hh = Concat <axis = 0> (h, h)
        y = Add (xx, hh)
    """
    assert not _batches_equal(odd)  # 3*A = 2*B holds there, A = B need not


@pytest.mark.parametrize(
    ("dim", "expected"),
    [(Dim.const(2), True), (Dim.const(1), False), (Dim.const(0), True), (Dim.const(3), True)],
)
def test_never_one_constants(dim, expected) -> None:
    assert never_one(dim) is expected


def test_never_one_polynomials() -> None:
    graph = _graph("y = Identity (x)")
    a = Dim.sym(graph.inputs[0], 0)
    assert never_one(a * 2) and never_one(a * 2 + 4)
    assert not never_one(a) and not never_one(a * 2 + 1)
