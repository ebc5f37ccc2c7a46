"""The normalisation passes (rnn_rewrite_rules.normalize): each on small built graphs,
equal in ONNX Runtime before and after at several sizes (0 included), near misses where
it must not fire, and on every real exporter file that runs (tests/data/exporters)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx_ir.passes.common import RemoveUnusedNodesPass

import rnn_rewrite_rules
from rnn_rewrite_rules import _api, runtime
from rnn_rewrite_rules.normalize import (
    GemmPass,
    IdentityPass,
    Journal,
    LoopInvariantPass,
    NoOpCastPass,
    normalize,
)
from tests.exporter_files import exporter_files, make_feeds, size_plans

HEADER = '<ir_version: 10, opset_import: ["" : 17]>'


def _model(text: str) -> ir.Model:
    return ir.from_onnx_text(HEADER + text)


def _ops(model: ir.Model) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph))


def _run(model: ir.Model | onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    proto = model if isinstance(model, onnx.ModelProto) else ir.serde.serialize_model(model)
    return runtime.session(proto, log_level=4).run(None, feeds)


def _assert_same_outputs(before: ir.Model, after: ir.Model, feeds_list: list[dict]) -> None:
    onnx.checker.check_model(ir.serde.serialize_model(after), full_check=True)
    assert [o.name for o in after.graph.outputs] == [o.name for o in before.graph.outputs]
    for feeds in feeds_list:
        for want, got in zip(_run(before, feeds), _run(after, feeds), strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def _feeds(shapes: list[tuple[int, ...]], dtype=np.float32) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal(s).astype(dtype)} for s in shapes]


SIZES = [(2, 3), (5, 3), (0, 3), (1, 3)]

CASTS = """
agraph (float[N, 3] x) => (float[N, 3] y, double[N, 3] z) {
    a = Cast<to=1>(x)
    b = Cast<to=11>(a)
    c = Cast<to=1>(b)
    y = Tanh(c)
    z = Cast<to=11>(c)
}
"""


def test_no_op_casts_go_and_outputs_stay() -> None:
    """A float Cast of a float and a float -> double -> float round trip return x."""
    before, after = _model(CASTS), _model(CASTS)
    assert NoOpCastPass()(after).modified
    RemoveUnusedNodesPass()(after)  # the round trip's first Cast, now unread
    assert _ops(after) == {"Tanh": 1, "Cast": 1}  # the Cast to double changes the type
    _assert_same_outputs(before, after, _feeds(SIZES))


TRUNCATING = """
agraph (float[N, 3] x) => (float[N, 3] y) {
    a = Cast<to=10>(x)
    b = Cast<to=1>(a)
    y = Tanh(b)
}
"""


def test_a_cast_that_truncates_stays() -> None:
    """float -> float16 -> float rounds: not the identity, not removed."""
    model = _model(TRUNCATING)
    assert not NoOpCastPass()(model).modified
    assert _ops(model)["Cast"] == 2


UNPROVEN = """
agraph (float[N, 3] x) => (float[N, 3] y) {
    s = Shape(x)
    z = ConstantOfShape(s)
    y = Cast<to=1>(z)
}
"""


def test_a_cast_of_an_unproven_type_stays() -> None:
    """The input's type is not proven from the graph alone (no value_info read)."""
    model = _model(UNPROVEN)
    assert not NoOpCastPass()(model).modified


OUTPUT_NAMES = """
agraph (float[N, 3] x) => (float[N, 3] y, float[N, 3] w) {
    a = Identity(x)
    t = Tanh(a)
    y = Identity(t)
    w = Identity(x)
}
"""


def test_identity_goes_and_graph_outputs_keep_theirs() -> None:
    """An Identity inside the graph goes; those naming the model's outputs stay (the
    outputs keep their producer's name and declaration, as a rule leaves them)."""
    before, after = _model(OUTPUT_NAMES), _model(OUTPUT_NAMES)
    assert IdentityPass()(after).modified
    assert _ops(after) == {"Tanh": 1, "Identity": 2}
    assert after.graph.node(0).op_type == "Tanh" and after.graph.node(0).inputs[0].name == "x"
    _assert_same_outputs(before, after, _feeds(SIZES))


EVERY_EDIT = """
agraph (float[N, 3] x) => (float[N, 3] y, double[N, 3] z) {
    a = Identity(x)
    b = Cast<to=11>(a)
    c = Cast<to=1>(b)
    w = Constant<value = float[3, 3] {1, 0, 0, 0, 1, 0, 0, 0, 1}>()
    g = Gemm<transB=1>(c, w)
    y = Tanh(g)
    z = Cast<to=11>(c)
}
"""


def test_the_journal_puts_back_every_edit_no_rule_used() -> None:
    """normalize, then restore with no rule in between: the model as written, node for
    node (names, order, attributes)."""
    model = _model(EVERY_EDIT)
    journal = Journal()
    assert normalize(model, journal)
    assert _ops(model) == {"MatMul": 1, "Transpose": 1, "Tanh": 1, "Cast": 2, "Constant": 1}
    assert journal.restore() == 3
    printed = onnx.printer.to_text(ir.serde.serialize_model(model).graph)
    assert printed == onnx.printer.to_text(ir.serde.serialize_model(_model(EVERY_EDIT)).graph)


def test_the_journal_keeps_what_a_rule_used() -> None:
    """A reader a rule replaced by another op reads the normalised value: that edit
    stays; a node of the same op emitted in a reader's place reads the exporter's
    spelling again; an edit whose readers all stayed is undone."""
    model = _model(
        """
        agraph (float[N, 3] x) => (float[N, 3] y, float[N, 3] z, float[N, 3] v) {
            a = Identity(x)
            y = Tanh(a)
            b = Identity(x)
            z = Relu(b)
            c = Identity(x)
            v = Neg(c)
        }
        """
    )
    original = list(model.graph)
    journal = Journal()
    assert IdentityPass(journal)(model).modified
    graph = model.graph
    for op, new_op in (("Tanh", "Sigmoid"), ("Relu", "Relu")):  # what a rule would do
        (old,) = [n for n in graph if n.op_type == op]
        new = ir.Node("", new_op, [old.inputs[0]], name=f"new_{op}")
        graph.insert_before(old, new)
        ir.convenience.replace_all_uses_with(
            old.outputs[0], new.outputs[0], replace_graph_outputs=True
        )
        new.outputs[0].name = old.outputs[0].name
        graph.remove(old, safe=True)
    assert journal.restore(original) == 2
    readers = {n.op_type: n.inputs[0].producer() for n in graph if n.op_type != "Identity"}
    assert readers["Sigmoid"] is None  # reads x: the rule used the bypass
    assert readers["Relu"] is not None and readers["Relu"].op_type == "Identity"
    assert readers["Neg"] is not None and readers["Neg"].op_type == "Identity"


LOOP = """
agraph (float[N, 3] x, int64 trips) => (float[N, 3] h, float[K, N, 3] ys) {
    cond = Constant<value = bool {1}>()
    h, ys = Loop(trips, cond, x) <body = loop_body (int64 i, bool c_in, float[N, 3] h_in)
        => (bool c_out, float[N, 3] h_out, float[N, 3] y_out) {
        c_out = Identity(c_in)
        t = Tanh(h_in)
        u = Cast<to=1>(t)
        h_out = Cast<to=1>(u)
        y_out = Identity(h_out)
    }>
}
"""


def test_casts_and_identity_in_a_loop_body() -> None:
    """In a body (jax2onnx's scan): h_t's no-op Casts go, h_t takes the output's name;
    the Identity passing the condition through and the one of an output stay."""
    before, after = _model(LOOP), _model(LOOP)
    assert normalize(after)
    body = next(n for n in after.graph if n.op_type == "Loop").attributes["body"].as_graph()
    assert collections.Counter(n.op_type for n in body) == {"Identity": 2, "Tanh": 1}
    rng = np.random.default_rng(1)
    feeds = [
        {"x": rng.standard_normal((n, 3)).astype(np.float32), "trips": np.array(k)}
        for n, k in ((2, 3), (0, 2), (3, 0), (1, 1))
    ]
    _assert_same_outputs(before, after, feeds)


def _gemm(attrs: str, bias: str) -> str:
    return f"""
agraph (float[N, 4] x) => (float[N, 3] y) {{
    w = Constant<value = float[4, 3] {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}>()
    c = Constant<value = {bias}>()
    y = Gemm<{attrs}>(x, w, c)
}}
"""


@pytest.mark.parametrize(
    ("attrs", "bias"),
    [
        ("alpha=1.0, beta=0.0", "float {0}"),
        ("beta=0.0", "float[3] {5, 6, 7}"),
        ("beta=1.0", "float[3] {0, 0, 0}"),
    ],
)
def test_gemm_without_bias_is_a_matmul(attrs: str, bias: str) -> None:
    before, after = _model(_gemm(attrs, bias)), _model(_gemm(attrs, bias))
    assert GemmPass()(after).modified
    assert _ops(after)["MatMul"] == 1 and not _ops(after)["Gemm"]
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((n, 4)).astype(np.float32)} for n in (2, 0, 7)]
    for want, got in zip(_run(before, feeds[0]), _run(after, feeds[0]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    _assert_same_outputs(before, after, feeds[1:2])


@pytest.mark.parametrize(
    ("attrs", "bias", "reason"),
    [
        ("beta=1.0", "float[3] {5, 6, 7}", "adds more than zeros"),
        ("alpha=2.0, beta=0.0", "float {0}", "alpha is 2.0"),
        ("beta=0.0", "float {inf}", "adds more than zeros"),
    ],
)
def test_gemm_with_a_bias_stays(attrs: str, bias: str, reason: str) -> None:
    model = _model(_gemm(attrs, bias))
    gemm_pass = GemmPass()
    assert not gemm_pass(model).modified
    assert _ops(model)["Gemm"] == 1
    assert len(gemm_pass.refusals) == 1 and reason in gemm_pass.refusals[0][1]


RUNNABLE = [f for f in exporter_files() if f.expect != "invalid"]
#: ONNX Runtime aborts the process on these at a size 0 (see test_exporter_files).
ABORTS = ("LSTM", "GRU")


@pytest.mark.parametrize("file", RUNNABLE, ids=[f.id for f in RUNNABLE])
def test_normalize_keeps_real_exporter_outputs(file) -> None:
    """Normalised alone, every real exporter file gives the same outputs at each size the
    original runs at (sizes with a 0 where ORT may abort are left to test_exporter_files)."""
    original = onnx.load(str(file.path))
    model = ir.serde.deserialize_model(original)
    normalize(model)
    normalized = ir.serde.serialize_model(model)
    onnx.checker.check_model(normalized)
    assert [o.name for o in normalized.graph.output] == [o.name for o in original.graph.output]
    aborts = any(_ops(model)[op] for op in ABORTS)  # subgraphs included
    dtypes = {
        i.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
        for i in original.graph.input
    }
    ran = 0
    for seed, sizes in enumerate(size_plans(file)):
        if aborts and 0 in sizes.values():
            continue
        feeds = make_feeds(file, sizes, dtypes, np.random.default_rng(seed))
        try:
            expected = _run(original, feeds)
        except Exception:
            continue  # the original does not run here
        for want, got in zip(expected, _run(normalized, feeds), strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(sizes))
        ran += 1
    assert ran >= 1


SMALL_GLUE = [f for f in RUNNABLE if f.exporter == "paddle2onnx"]


@pytest.mark.parametrize("file", SMALL_GLUE, ids=[f.id for f in SMALL_GLUE])
def test_rewrite_is_no_larger_for_the_normalisation(file, monkeypatch) -> None:
    """rewrite() normalises, rewrites, puts back what no rule used and rewrites that once
    more: never more nodes than the rules give without normalisation (paddle's Identity
    between a GRU and its output glue is put back, then removed by layer_glue)."""
    original = onnx.load(str(file.path))
    normalised = rnn_rewrite_rules.rewrite(original)
    monkeypatch.setattr(_api, "normalize", lambda model, journal=None: False)
    plain = rnn_rewrite_rules.rewrite(original)
    assert len(normalised.graph.node) <= len(plain.graph.node)
    assert [o.name for o in normalised.graph.output] == [o.name for o in original.graph.output]


CARRIED = """
agraph (float[N, 3] x, float[3, 3] w, int64 trips) => (float[N, 3] h, float[3, 3] w_last) {
    cond = Constant<value = bool {1}>()
    h, w_last = Loop(trips, cond, x, w) <body = loop_body (int64 i, bool c_in, float[N, 3] h_in,
        float[3, 3] w_in) => (bool c_out, float[N, 3] h_out, float[3, 3] w_out) {
        c_out = Identity(c_in)
        m = MatMul(h_in, w_in)
        h_out = Tanh(m)
        w_out = Identity(w_in)
    }>
}
"""


def _carried_feeds() -> list[dict]:
    rng = np.random.default_rng(3)
    return [
        {
            "x": rng.standard_normal((n, 3)).astype(np.float32),
            "w": rng.standard_normal((3, 3)).astype(np.float32),
            "trips": np.array(k),
        }
        for n, k in ((2, 3), (0, 2), (3, 0), (1, 1))
    ]


def test_a_value_carried_unchanged_is_read_from_outside() -> None:
    """The body's MatMul reads the outer ``w``; the pass-through slot stays; a state
    (``h``, changed each step) is not touched; undone by the journal."""
    before, after = _model(CARRIED), _model(CARRIED)
    journal = Journal()
    assert LoopInvariantPass(journal)(after).modified
    loop = next(n for n in after.graph if n.op_type == "Loop")
    body = loop.attributes["body"].as_graph()
    matmul = next(n for n in body if n.op_type == "MatMul")
    assert matmul.inputs[1] is loop.inputs[3] and matmul.inputs[0] is body.inputs[2]
    _assert_same_outputs(before, after, _carried_feeds())
    assert journal.restore() == 1 and matmul.inputs[1] is body.inputs[3]


def test_a_value_changed_in_the_body_is_not_invariant() -> None:
    """``w_out = Neg(w_in)``: carried, but not unchanged; nothing read from outside."""
    text = CARRIED.replace("w_out = Identity(w_in)", "w_out = Neg(w_in)")
    model = _model(text)
    assert not LoopInvariantPass()(model).modified
