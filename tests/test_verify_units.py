"""``--verify`` through the public API: :func:`rnn_rewrite_rules.rewrite_file` with
``RewriteOptions(verify=True)`` on small models saved to disk, read back from the
:class:`~rnn_rewrite_rules.Report` (``report.verify``, ``report.lines()``) or from the
error raised.

Each case reaches its branch by its input: a model the original rejects at some sizes
(a lookup that goes out of bounds), a recurrent op ONNX Runtime aborts on at batch 0 (in a
child process), a layout=1 RNN, an op ONNX Runtime does not know. Where the branch is about
the result (a result that differs, fails or aborts), ``RewriteOptions.selected`` gives the
rewrite a deliberately wrong onnxscript rule. The command's end-to-end behaviour is in
tests/test_verify.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxscript.rewriter import pattern

from rnn_rewrite_rules import (
    BadOptions,
    CannotVerify,
    RewriteOptions,
    VerifyFailed,
    rewrite_file,
    runtime,
)

Shapes = Mapping[str, tuple[int, ...]]


# ----------------------------------------------------------------------------- builders


def _vi(name: str, dims: Sequence[int | str | None] | None, elem: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    domains: Sequence[str] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", 18), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _weights(name: str, shape: tuple[int, ...], seed: int = 0) -> onnx.TensorProto:
    values = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    return numpy_helper.from_array(values, name)


def _unary(op: str = "Relu", dims: Sequence[int | str | None] = ("n", 3)) -> onnx.ModelProto:
    """``y = op(x)``."""
    node = helper.make_node(op, ["x"], ["y"])
    return _model([node], [_vi("x", dims)], [_vi("y", dims)])


def _relu_each(inputs: Mapping[str, Sequence[int | str | None] | None]) -> onnx.ModelProto:
    """``{name}_out = Relu(name)`` for each input (``None``: an input without a shape)."""
    nodes = [helper.make_node("Relu", [name], [f"{name}_out"]) for name in inputs]
    outputs = [_vi(f"{name}_out", dims) for name, dims in inputs.items()]
    return _model(nodes, [_vi(name, dims) for name, dims in inputs.items()], outputs)


def _accepting(
    accepted: Callable[[int], bool], dims: Sequence[int | str] = ("n",), limit: int = 16
) -> onnx.ModelProto:
    """``y = 2 * x``, where ONNX Runtime raises (a Gather out of bounds) unless ``x``'s
    first axis has a size ``accepted`` takes (and below ``limit``)."""
    table = [0 if accepted(n) else 99 for n in range(limit)]
    nodes = [
        helper.make_node("Shape", ["x"], ["size"], start=0, end=1),
        helper.make_node("Gather", ["table", "size"], ["index"]),
        helper.make_node("Gather", ["two", "index"], ["factor"]),
        helper.make_node("Mul", ["x", "factor"], ["y"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array(table, np.int64), "table"),
        numpy_helper.from_array(np.array([2.0], np.float32), "two"),
    ]
    return _model(nodes, [_vi("x", dims)], [_vi("y", dims)], initializers)


def _lstm(
    *,
    layout: int = 0,
    hidden: int = 2,
    features: int = 3,
    extra: Sequence[onnx.NodeProto] = (),
    w_name: str = "W",
) -> onnx.ModelProto:
    """One LSTM (layout 0: x [seq, batch, 3]; layout 1: x [batch, seq, 3])."""
    dims = ["batch", "seq", features] if layout else ["seq", "batch", features]
    node = helper.make_node(
        "LSTM", ["x", w_name, "R"], ["y", "y_h"], hidden_size=hidden, layout=layout, name="lstm"
    )
    y_dims = ["batch", "seq", 1, hidden] if layout else ["seq", 1, "batch", hidden]
    h_dims = ["batch", 1, hidden] if layout else [1, "batch", hidden]
    weights = [
        _weights("W", (1, 4 * hidden, features)),
        _weights("R", (1, 4 * hidden, hidden), seed=1),
    ]
    return _model([*extra, node], [_vi("x", dims)], [_vi("y", y_dims), _vi("y_h", h_dims)], weights)


def _dead_lstm(dims: Sequence[int | str] = ("n", "m", 3)) -> onnx.ModelProto:
    """``Relu(x)`` next to an unused LSTM without ``hidden_size``: ONNX Runtime rejects the
    model (not for its layout), onnx.reference runs it, and the rewrite removes the LSTM."""
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R"], ["unused"]),
        helper.make_node("Relu", ["x"], ["y"]),
    ]
    weights = [_weights("W", (1, 8, 3)), _weights("R", (1, 8, 2))]
    return _model(nodes, [_vi("x", dims)], [_vi("y", dims)], weights)


def _unknown_op(*, dead: bool) -> onnx.ModelProto:
    """An op of domain ``foo`` that no runtime knows, read (``dead=False``) or unused (the
    rewrite removes it: the result loads)."""
    nodes = [helper.make_node("Bar", ["x"], ["z" if dead else "y"], domain="foo")]
    if dead:
        nodes.append(helper.make_node("Relu", ["x"], ["y"]))
    return _model(nodes, [_vi("x", ["n", 3])], [_vi("y", ["n", 3])], domains=["foo"])


def _save(model: onnx.ModelProto, directory: Path, name: str = "model.onnx") -> Path:
    path = directory / name
    onnx.save(model, path)
    return path


class _Ticks:
    """A ``Progress`` that counts each task's steps (what ``verify`` reports per run)."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}
        self.totals: dict[str, int | None] = {}

    def started(self, rnn_nodes: int) -> None:
        pass

    def task(self, description: str, total: int | None = None) -> _Ticks._Task:
        self.steps[description], self.totals[description] = 0, total
        return _Ticks._Task(self, description)

    class _Task:
        def __init__(self, ticks: _Ticks, description: str) -> None:
            self._ticks, self._description = ticks, description

        def advance(self) -> None:
            self._ticks.steps[self._description] += 1

        def update(self, completed: int, total: int) -> None:
            pass

        def done(self) -> None:
            pass

    @property
    def verify(self) -> int:
        return self.steps["verifying in ONNX Runtime"]


def _verify(model: onnx.ModelProto, directory: Path, **options: object):
    """``report.verify`` of ``rewrite_file(model, None, verify=True, **options)``, also when
    the check failed (from :class:`VerifyFailed`'s report)."""
    try:
        report = rewrite_file(_save(model, directory), None, RewriteOptions(verify=True, **options))
    except VerifyFailed as failed:
        report = failed.report
    assert report.verify is not None
    return report.verify


def _lines(model: onnx.ModelProto, directory: Path, **options: object) -> list[str]:
    """The report's ``verify:`` section."""
    try:
        report = rewrite_file(_save(model, directory), None, RewriteOptions(verify=True, **options))
    except VerifyFailed as failed:
        report = failed.report
    lines = report.lines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("verify: ")) :]


def _refusal(model: onnx.ModelProto, directory: Path, error: type[Exception], **options) -> str:
    with pytest.raises(error) as raised:
        rewrite_file(_save(model, directory), None, RewriteOptions(verify=True, **options))
    return str(raised.value)


def _ort_error(model: onnx.ModelProto | bytes, feeds: Mapping[str, np.ndarray] | None = None):
    """What ONNX Runtime says, shortened, when it refuses to load (or, given ``feeds``,
    to run) ``model``."""
    source = model if isinstance(model, bytes) else model.SerializeToString()
    with pytest.raises(Exception) as error:
        runner = runtime.ort_runner(source, optimize=False, arena=False)
        runner.run(feeds or {})
    return runtime.short_error(error.value)


def _rejects(model: onnx.ModelProto, shape: tuple[int, ...]) -> str:
    return _ort_error(model, {"x": np.zeros(shape, np.float32)})


def _rule(target: Callable, replacement: Callable, condition: Callable | None = None):
    """A deliberately wrong rewrite (an onnxscript rule) for ``RewriteOptions.selected``."""
    return pattern.RewriteRule(target, replacement, condition)


def _relu(op, x):
    return op.Relu(x)


# ---------------------------------------------------------------- sizes: what runs are planned


#: ``batch`` shared by two inputs (at different axes), ``seq`` in one, static dims.
XH = {"x": ["batch", "seq", 8], "h": [1, "batch", 16]}


def test_each_axis_takes_a_size_per_run_from_the_runs_base(tmp_path: Path) -> None:
    """Each dynamic axis takes a different size in each run, different axes differ within
    a run, a shared axis is the same in every input: the run's base (2, then 5) plus the
    axis's index in order of first appearance."""
    result = _verify(_relu_each(XH), tmp_path)
    assert result.runs == [
        {"x": (2, 3, 8), "h": (1, 2, 16)},
        {"x": (5, 6, 8), "h": (1, 5, 16)},
    ]
    assert result.ok and result.notes == [] and result.reference == "onnxruntime"
    assert (result.seed, result.tolerance, result.max_diff) == (
        0,
        1e-4,
        {"x_out": 0.0, "h_out": 0.0},
    )


def test_unnamed_dims_are_dynamic_axes_of_their_input(tmp_path: Path) -> None:
    result = _verify(_relu_each({"x": [None, 4, None]}), tmp_path)
    assert result.runs == [{"x": (2, 4, 3)}, {"x": (5, 4, 6)}]


def test_as_many_runs_as_the_longest_axis_override(tmp_path: Path) -> None:
    """Runs past the two default bases use base 2 + 3 * run (8, 11, ...); axis sizes
    cycle through the given list."""
    result = _verify(_relu_each(XH), tmp_path, shapes={"seq": (1, 2, 3, 4)})
    assert [run["x"] for run in result.runs] == [(2, 1, 8), (5, 2, 8), (8, 3, 8), (11, 4, 8)]
    result = _verify(_relu_each(XH), tmp_path, shapes={"seq": (7,)})
    assert [run["x"] for run in result.runs] == [(2, 7, 8), (5, 7, 8)]
    result = _verify(_relu_each(XH), tmp_path, shapes={"seq": (4, 9), "batch": (1, 2, 3, 4)})
    assert [run["x"][:2] for run in result.runs] == [(1, 4), (2, 9), (3, 4), (4, 9)]


def test_an_inputs_shape_fixes_its_axes_and_the_axes_it_shares(tmp_path: Path) -> None:
    """One plan, not two of the same sizes."""
    result = _verify(_relu_each(XH), tmp_path, shapes={"x": (3, 7, 8)})
    assert result.runs == [{"x": (3, 7, 8), "h": (1, 3, 16)}]
    both = {"x": (2, 3, 8), "h": (1, 2, 16)}  # consistent sizes of a shared axis
    assert _verify(_relu_each(XH), tmp_path, shapes=both).runs == [both]


def test_an_unranked_input_is_fed_its_shape(tmp_path: Path) -> None:
    result = _verify(_relu_each({"u": None, "x": ["n"]}), tmp_path, shapes={"u": (2, 0)})
    assert result.runs == [{"u": (2, 0), "x": (2,)}, {"u": (2, 0), "x": (5,)}]


def test_an_inputs_shape_fixes_its_unnamed_axis(tmp_path: Path) -> None:
    model = _relu_each({"x": [None, 4], "h": ["n"]})
    result = _verify(model, tmp_path, shapes={"x": (3, 4)})
    assert result.runs == [{"x": (3, 4), "h": (3,)}, {"x": (3, 4), "h": (6,)}]


def test_an_unranked_input_without_a_shape_cannot_be_verified(tmp_path: Path) -> None:
    model = _relu_each({"x": ["n"], "u": None})
    message = _refusal(model, tmp_path, CannotVerify)
    assert message == "input 'u' has no declared shape: give --shape u=DIMS"


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"x": (2, 3)}, "--shape x: 2 dims given, the input has rank 3"),
        ({"x": (2, 3, 8, 1)}, "--shape x: 4 dims given, the input has rank 3"),
        ({"x": (2, 3, 9)}, "--shape x: axis 2 is static 8, not 9"),
        ({"h": (2, 2, 16)}, "--shape h: axis 0 is static 1, not 2"),
        ({"x": (2, 3, 8), "h": (1, 4, 16)}, "--shape h: axis 'batch' is given two sizes"),
        ({"feature": (3,)}, "--shape feature: no input or named dynamic axis has that name"),
        ({"seq": ()}, "--shape seq: give at least one size"),
        (
            {"x": (2, 3, 8), "batch": (4,)},
            "--shape batch: the axis is also fixed by an input's --shape",
        ),
    ],
)
def test_inconsistent_shapes_are_bad_options(tmp_path: Path, shapes: dict, message: str) -> None:
    """Refused before the rewrite and before any model is loaded in ONNX Runtime."""
    assert _refusal(_relu_each(XH), tmp_path, BadOptions, shapes=shapes) == message


def test_an_input_over_the_element_limit_is_a_bad_option(tmp_path: Path) -> None:
    """2**27 elements are fed; one more is a mistyped --shape (refused before loading:
    the model given here does not even run)."""
    message = _refusal(_unary("Relu", ["n", 2]), tmp_path, BadOptions, shapes={"n": (2**26 + 1,)})
    assert message == (
        "--shape: input 'x' would have shape 67108865x2, over 134,217,728 elements; "
        "give smaller sizes"
    )
    message = _refusal(_unary("Relu", ["n", 3]), tmp_path, BadOptions, shapes={"n": (2**26,)})
    assert message.startswith("--shape: input 'x' would have shape 67108864x3,")


def test_inputs_with_an_initializer_default_are_not_fed(tmp_path: Path) -> None:
    """``w`` has a default: a caller may feed it, the check does not. Scalars are shown as
    ``scalar``; integers and booleans are fed too."""
    nodes = [
        helper.make_node("Add", ["x", "w"], ["y"]),
        helper.make_node("Identity", ["k"], ["k_out"]),
        helper.make_node("Not", ["flag"], ["flag_out"]),
    ]
    inputs = [
        _vi("x", ["n", 2]),
        _vi("w", [2]),
        _vi("k", [], TensorProto.INT64),
        _vi("flag", [], TensorProto.BOOL),
    ]
    outputs = [_vi("y", ["n", 2]), _vi("k_out", [], TensorProto.INT64)]
    outputs.append(_vi("flag_out", [], TensorProto.BOOL))
    model = _model(nodes, inputs, outputs, [_weights("w", (2,))])
    assert _lines(model, tmp_path)[:3] == [
        "verify: 2 runs, seed 0, tolerance 0.0001",
        "  run 1: x=2x2, k=scalar, flag=scalar",
        "  run 2: x=5x2, k=scalar, flag=scalar",
    ]


def test_integers_are_fed_from_1_to_the_smallest_dim_of_the_run(tmp_path: Path) -> None:
    """``i - 1`` indexes x's axis 1 (size 3): an integer above the smallest dim of the run
    (2 or 3) would make ONNX Runtime refuse the size; none does. A string input cannot be
    fed."""
    nodes = [
        helper.make_node("Sub", ["i", "one"], ["index"]),
        helper.make_node("Gather", ["x", "index"], ["y"], axis=1),
    ]
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    inputs = [_vi("x", ["n", 3]), _vi("i", [50], TensorProto.INT64)]
    model = _model(nodes, inputs, [_vi("y", ["n", 50])], [one])
    result = _verify(model, tmp_path)
    assert result.notes == [] and result.runs == [
        {"x": (2, 3), "i": (50,)},
        {"x": (5, 3), "i": (50,)},
    ]
    strings = _model(
        [helper.make_node("Identity", ["s"], ["t"])],
        [_vi("s", [2], TensorProto.STRING)],
        [_vi("t", [2], TensorProto.STRING)],
    )
    message = _refusal(strings, tmp_path, CannotVerify)
    assert message == "input 's' has element type STRING, not supported"


# ---------------------------------------------------------------- sizes the graph fixes


def _rnn(
    op: str,
    inputs: Sequence[str],
    graph_inputs: Sequence[onnx.ValueInfoProto],
    *,
    directions: int = 1,
    hidden: int = 5,
    features: int = 3,
    extra: Sequence[onnx.NodeProto] = (),
    **attrs: object,
) -> onnx.ModelProto:
    """One ``op`` node reading constant W [D, G*H, I] and R [D, G*H, H]; output Y_h."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    if directions == 2:
        attrs["direction"] = "bidirectional"
    node = helper.make_node(op, inputs, ["", "y_h"], hidden_size=hidden, **attrs)
    weights = [
        _weights("W", (directions, gates * hidden, features)),
        _weights("R", (directions, gates * hidden, hidden), seed=1),
    ]
    h_dims = ["batch", directions, hidden] if attrs.get("layout") else [directions, "batch", hidden]
    return _model([*extra, node], graph_inputs, [_vi("y_h", h_dims)], weights)


X = _vi("x", ["seq", "batch", "I"])


def _fixed_note(model: onnx.ModelProto, directory: Path, **options: object) -> list[str]:
    """The notes on the sizes the graph fixes (and the runs check they are used)."""
    result = _verify(model, directory, **options)
    assert result.ok, result.failure
    return [note for note in result.notes if note.startswith("sizes the graph")]


def test_weights_fix_the_feature_axis_and_both_states_axes(tmp_path: Path) -> None:
    """X's feature axis (W's last dim); initial_h/initial_c's directions (axis 0 at layout
    0) and hidden (axis 2) axes."""
    model = _rnn(
        "LSTM",
        ["x", "W", "R", "", "", "h0", "c0"],
        [X, _vi("h0", ["D", "batch", "H"]), _vi("c0", ["Dc", "batch", "Hc"])],
        directions=2,
    )
    assert _fixed_note(model, tmp_path) == [
        "sizes the graph fixes: x axis 2 = 3, h0 axis 0 = 2, h0 axis 2 = 5, c0 axis 0 = 2, "
        "c0 axis 2 = 5"
    ]
    result = _verify(model, tmp_path)
    assert [run["x"][2] for run in result.runs] == [3, 3]
    assert [run["h0"] for run in result.runs] == [(2, 3, 5), (2, 6, 5)]
    assert [run["c0"] for run in result.runs] == [(2, 3, 5), (2, 6, 5)]


def test_weights_fix_the_directions_axis_1_at_layout_1(tmp_path: Path) -> None:
    model = _rnn(
        "GRU",
        ["x", "W", "R", "", "", "h0"],
        [_vi("x", ["batch", "seq", "I"]), _vi("h0", ["batch", "D", "H"])],
        layout=1,
    )
    assert _fixed_note(model, tmp_path) == [
        "sizes the graph fixes: x axis 2 = 3, h0 axis 1 = 1, h0 axis 2 = 5"
    ]


@pytest.mark.parametrize(
    ("inputs", "state"),
    [(["x", "W", "R", "", "", "h0"], "h0"), (["x", "W", "R", "", "", "", "c0"], "c0")],
)
def test_weights_fix_an_lstm_state_without_the_other(
    tmp_path: Path, inputs: list[str], state: str
) -> None:
    model = _rnn("LSTM", inputs, [X, _vi(state, ["D", "batch", "H"])])
    assert _fixed_note(model, tmp_path) == [
        f"sizes the graph fixes: x axis 2 = 3, {state} axis 0 = 1, {state} axis 2 = 5"
    ]


def test_weights_fix_the_axis_a_transpose_moves(tmp_path: Path) -> None:
    """``xf [I, seq, batch]`` transposed by [1, 2, 0]: X's feature axis is xf's axis 0."""
    transpose = helper.make_node("Transpose", ["xf"], ["x"], perm=[1, 2, 0])
    model = _rnn("RNN", ["x", "W", "R"], [_vi("xf", ["I", "seq", "batch"])], extra=[transpose])
    assert _fixed_note(model, tmp_path) == ["sizes the graph fixes: xf axis 0 = 3"]


def test_weights_of_a_graph_input_fix_only_the_states(tmp_path: Path) -> None:
    """W is an input with a default (a caller may feed another): it fixes nothing; the
    states' batch ``b`` is tied to X's ``batch``."""
    w_input = _vi("W", [1, 20, "wi"])
    model = _rnn("LSTM", ["x", "W", "R", "", "", "h0"], [X, w_input, _vi("h0", ["D", "b", "H"])])
    result = _verify(model, tmp_path)
    assert result.ok and result.notes[:2] == [
        "sizes the graph fixes: h0 axis 0 = 1, h0 axis 2 = 5",
        "axes the graph needs equal: h0 axis 1 = x axis 1",
    ]
    # x's feature axis is not fixed: sizes W's default rejects are tried, then replaced
    assert result.notes[2].startswith("the original rejects x=2x3x4, h0=1x3x5 (")
    assert all(run["x"][1] == run["h0"][1] for run in result.runs)


def test_weights_of_a_contrib_lstm_are_read_transposed(tmp_path: Path) -> None:
    """com.microsoft's DynamicQuantizeLSTM (what ONNX Runtime's quantizer writes) has W
    transposed ([D, I, 4H]): X's feature axis is W's axis 1."""
    from onnxruntime.quantization import quantize_dynamic

    model = _rnn("LSTM", ["x", "W", "R", "", "", "h0"], [X, _vi("h0", ["D", "batch", "H"])])
    quantized = tmp_path / "int8.onnx"
    quantize_dynamic(_save(model, tmp_path, "float.onnx"), quantized)
    assert "DynamicQuantizeLSTM" in {n.op_type for n in onnx.load(quantized).graph.node}
    result = _verify(onnx.load(quantized), tmp_path)
    assert result.ok and result.notes == [
        "sizes the graph fixes: x axis 2 = 3, h0 axis 0 = 1, h0 axis 2 = 5"
    ]


def test_weights_skip_nodes_they_cannot_read_and_go_on(tmp_path: Path) -> None:
    """A dead LSTM whose hidden size is unknown (no attribute, R a graph input) comes
    first: it fixes nothing, and the RNN after it still fixes its X's feature axis."""
    nodes = [
        helper.make_node("LSTM", ["z", "W", "Rin"], ["unknown"]),
        helper.make_node("RNN", ["x", "W2", "R2"], ["", "y_h"], hidden_size=5),
    ]
    weights = [_weights("W", (1, 8, 3)), _weights("W2", (1, 5, 7)), _weights("R2", (1, 5, 5))]
    inputs = [_vi("z", ["seq", "batch", 3]), _vi("x", ["seq", "batch", "g"]), _vi("Rin", None)]
    model = _model(nodes, inputs, [_vi("y_h", [1, "batch", 5])], weights)
    result = _verify(model, tmp_path, shapes={"Rin": (1, 8, 2)})
    assert result.notes[0] == "sizes the graph fixes: x axis 2 = 7"
    assert [run["x"][2] for run in result.runs] == [7, 7]


def test_an_override_wins_over_the_graphs_size_of_another_axis(tmp_path: Path) -> None:
    """Weight sizes of axes --shape decides are not taken; the others still are."""
    model = _rnn("GRU", ["x", "W", "R"], [_vi("x", ["seq", "batch", None])])
    result = _verify(model, tmp_path, shapes={"seq": (2, 4)})
    assert [(run["x"][0], run["x"][2]) for run in result.runs] == [(2, 3), (4, 3)]
    assert result.notes == ["sizes the graph fixes: x axis 2 = 3"]
    result = _verify(model, tmp_path, shapes={"x": (2, 3, 3)})
    assert result.runs == [{"x": (2, 3, 3)}] and result.notes == []


# ---------------------------------------------------------------- sizes the original rejects


def test_a_size_the_original_rejects_is_retried_with_another(tmp_path: Path) -> None:
    """Run 1 takes n=1 after n=2 fails; the note names the size and the error."""
    model = _accepting(lambda n: n != 2)
    result = _verify(model, tmp_path)
    assert result.runs == [{"x": (1,)}, {"x": (5,)}] and result.ok
    assert result.notes == [
        f"the original rejects x=2 ({_rejects(model, (2,))}); compared x=1 instead"
    ]


def test_retries_never_repeat_a_size_and_stop_when_none_is_left(tmp_path: Path) -> None:
    """Run 2 skips n=1 (run 1's), then tries the other bases and larger sizes; none runs:
    one run is compared, and a note says why."""
    model = _accepting(lambda n: n == 1)
    ticks = _Ticks()
    result = _verify(model, tmp_path, progress=ticks)
    assert result.runs == [{"x": (1,)}] and ticks.verify == 2
    error = _rejects(model, (2,))
    assert result.notes == [
        f"the original rejects x=2 ({error}); compared x=1 instead",
        f"the original rejects x=5 and 7 other sizes ({error}): compared 1 run only (a frozen "
        "axis? see --check)",
    ]


def test_the_original_failing_at_every_size_cannot_be_verified(tmp_path: Path) -> None:
    """The message names the first size refused, its error, how many others were refused
    and the --shape argument that would help."""
    model = _accepting(lambda n: False)
    assert _refusal(model, tmp_path, CannotVerify) == (
        f"the original model fails on x=2 in onnxruntime: {_rejects(model, (2,))}; 8 other "
        "sizes failed too; give sizes it runs on, e.g. --shape x=<n> (a frozen axis? see "
        "--check)"
    )


@pytest.mark.parametrize(
    ("accepted", "note"),
    [((1, 3, 4, 6), "x=14x1 and 4 other sizes"), ((1, 3, 4), "x=11x1 and 5 other sizes")],
)
def test_the_note_counts_the_other_sizes_refused(
    tmp_path: Path, accepted: tuple[int, ...], note: str
) -> None:
    """Five runs (seq given five times) of batch 2, 5, 8, 11, 14, each refused: runs 1-4
    take the alternatives 1, 3, 4, 6 in turn, run 5 has only its own, 7 and the larger
    sizes left; without 6, run 4 fails on its own, 6, 7 and the larger sizes."""
    model = _accepting(lambda n: n in accepted, dims=("batch", "seq"))
    result = _verify(model, tmp_path, shapes={"seq": (1,) * 5})
    assert [run["x"][0] for run in result.runs] == list(accepted)
    error = _rejects(model, (2, 1))
    assert result.notes[-1] == (
        f"the original rejects {note} ({error}): compared {len(accepted)} runs only (a frozen "
        "axis? see --check)"
    )


def test_a_static_input_runs_once(tmp_path: Path) -> None:
    """Every alternative of a static input is the same plan: one run, or one refusal."""
    assert _verify(_accepting(lambda n: True, dims=(3,)), tmp_path).runs == [{"x": (3,)}]
    model = _accepting(lambda n: False, dims=(3,))
    assert _refusal(model, tmp_path, CannotVerify) == (
        f"the original model fails on x=3 in onnxruntime: {_rejects(model, (3,))}; give sizes "
        "it runs on with --shape NAME=DIMS (a frozen axis? see --check)"
    )


def test_retries_keep_the_sizes_nothing_fixes(tmp_path: Path) -> None:
    """``Reshape(x, [-1, 4, 2])`` runs only where batch * seq is a multiple of 4: run 1
    takes 3x4 (after 2x3 and 1x2), run 2 takes 4x5 (after 5x6, 1x2; 3x4 was compared);
    the static axis stays 2 throughout."""
    shape = numpy_helper.from_array(np.array([-1, 4, 2], np.int64), "shape")
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    model = _model([node], [_vi("x", ["batch", "seq", 2])], [_vi("y", ["r", 4, 2])], [shape])
    result = _verify(model, tmp_path)
    assert result.runs == [{"x": (3, 4, 2)}, {"x": (4, 5, 2)}] and result.ok
    assert result.notes == [
        f"the original rejects x=2x3x2 ({_rejects(model, (2, 3, 2))}); compared x=3x4x2 instead",
        f"the original rejects x=5x6x2 ({_rejects(model, (5, 6, 2))}); compared x=4x5x2 instead",
    ]


# ---------------------------------------------------------------- sizes ONNX Runtime aborts on


def test_a_size_0_both_models_abort_on_is_noted_not_compared(tmp_path: Path) -> None:
    """ONNX Runtime ends the process on an LSTM at batch 0: that run is in a child (this
    process lives on), noted, and the other is compared."""
    ticks = _Ticks()
    result = _verify(_lstm(), tmp_path, shapes={"batch": (0, 2)}, progress=ticks)
    assert result.notes == ["ONNX Runtime aborts on both models at x=2x0x3 (not compared)"]
    assert result.runs == [{"x": (5, 2, 3)}] and result.ok
    assert ticks.verify == 4  # twice per run, the aborted one too


def test_the_original_aborting_at_every_size_cannot_be_verified(tmp_path: Path) -> None:
    message = _refusal(_lstm(), tmp_path, CannotVerify, shapes={"batch": (0,)})
    assert message == (
        "ONNX Runtime aborts on the original model at every size given (x=2x0x3; x=5x0x3): "
        "give sizes other than 0"
    )


def test_a_size_0_of_a_recurrent_op_runs_in_a_child_also_in_a_subgraph(tmp_path: Path) -> None:
    """The LSTM sits in an ``If`` branch: a size 0 still runs in a child (or this process
    would end). A size 0 the LSTM does not abort on (seq 0) is compared."""
    lstm = _lstm()
    branch = helper.make_graph(lstm.graph.node, "then", [], [_vi("y_h", [1, "batch", 2])])
    branch.initializer.extend(lstm.graph.initializer)
    other = helper.make_graph(
        [helper.make_node("Constant", [], ["zeros"], value_floats=[0.0])],
        "else",
        [],
        [_vi("zeros", [1])],
    )
    nodes = [
        helper.make_node("Constant", [], ["flag"], value_int=1),
        helper.make_node("Cast", ["flag"], ["cond"], to=TensorProto.BOOL),
        helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=other),
    ]
    model = _model(nodes, [_vi("x", ["seq", "batch", 3])], [_vi("out", None)])
    result = _verify(model, tmp_path, shapes={"batch": (0, 2)})
    assert result.notes == ["ONNX Runtime aborts on both models at x=2x0x3 (not compared)"]
    result = _verify(_lstm(), tmp_path, shapes={"seq": (0, 2)})
    assert result.runs == [{"x": (0, 3, 3)}, {"x": (2, 6, 3)}] and result.ok


def _padded_lstm(op, x, w, r):
    """The LSTM on x with one zero row appended to its batch, that row sliced off: the
    same outputs, and no batch 0 for ONNX Runtime to abort on."""
    seq = op.Shape(x, start=0, end=1)
    batch = op.Shape(x, start=1, end=2)
    pad_shape = op.Concat(seq, op.Constant(value_ints=[1, 3]), axis=0)
    pad = op.ConstantOfShape(pad_shape)
    padded = op.Concat(x, pad, axis=1)
    y, y_h = op.LSTM(padded, w, r, hidden_size=2, _outputs=2)
    zero = op.Constant(value_ints=[0])
    y = op.Slice(y, zero, batch, op.Constant(value_ints=[2]))
    y_h = op.Slice(y_h, zero, batch, op.Constant(value_ints=[1]))
    return y, y_h


def test_a_size_only_the_original_aborts_on_is_noted_not_compared(tmp_path: Path) -> None:
    rule = _rule(
        lambda op, x, w, r: op.LSTM(x, w, r, hidden_size=2, layout=0, _outputs=2),
        _padded_lstm,
        lambda context, x, **_: x.producer() is None,
    )
    result = _verify(_lstm(), tmp_path, shapes={"batch": (0, 2)}, selected=[rule])
    assert len(result.notes) == 1
    assert result.notes[0].startswith("ONNX Runtime aborts on the original model at x=2x0x3 (")
    assert result.notes[0].endswith("); the result runs there (not compared)")
    assert result.runs == [{"x": (5, 2, 3)}] and result.ok


def _relu_beside_an_lstm(op, x):
    """Relu(x) as Max(x, 0), plus 0 times an LSTM over x (which aborts at batch 0)."""
    w = op.Constant(value=_weights("W", (1, 8, 3)))
    r = op.Constant(value=_weights("R", (1, 8, 2), seed=1))
    _, y_h = op.LSTM(x, w, r, hidden_size=2, _outputs=2)
    zero = op.Mul(op.ReduceSum(y_h, keepdims=0), op.Constant(value_float=0.0))
    return op.Add(op.Max(x, op.Constant(value_float=0.0)), zero)


def test_a_result_that_aborts_where_the_original_ran_fails(tmp_path: Path) -> None:
    """A recurrent op in the result alone also sends its size 0 to a child."""
    rule = _rule(_relu, _relu_beside_an_lstm)
    model = _unary("Relu", ["seq", "batch", 3])
    result = _verify(model, tmp_path, shapes={"batch": (0, 2)}, selected=[rule])
    assert result.failure is not None and not result.ok
    assert result.failure.startswith("ONNX Runtime aborts on the rewritten model at x=2x0x3 (")
    assert result.failure.endswith("), not on the original")
    assert result.runs == [] and result.max_diff == {}


# ---------------------------------------------------------------- the reference


@pytest.fixture
def ort_calls(monkeypatch: pytest.MonkeyPatch) -> list:
    """Records each ``runtime.ort_runner`` call in this process as (source, keywords)."""
    calls: list = []
    real = runtime.ort_runner

    def recording(source: object, **kwargs: object) -> runtime.Runner:
        calls.append((source, kwargs))
        return real(source, **kwargs)

    monkeypatch.setattr(runtime, "ort_runner", recording)
    return calls


def test_the_original_runs_without_optimizations_the_result_with(
    tmp_path: Path, ort_calls: list
) -> None:
    """One model at a time: the original without graph optimizations (their constant
    folding copies the weights), then the result as a user runs it."""
    result = _verify(_unary(), tmp_path)
    assert result.ok and result.reference == "onnxruntime"
    (original, first), (staged, second) = ort_calls
    assert original == str(tmp_path / "model.onnx") and staged != original
    assert first == {"optimize": False, "arena": False} and second == {"arena": False}


def test_a_layout_1_original_is_compared_with_its_layout_0_equivalent(
    tmp_path: Path, ort_calls: list
) -> None:
    """ONNX Runtime rejects layout=1: the reference is the original with the ``layout``
    rules alone applied (they wrap the LSTM in Transposes, one for X and one per output,
    and leave the Identity on W that weight folding would fold), in ONNX Runtime."""
    identity = helper.make_node("Identity", ["W0"], ["W"])
    model = _lstm(layout=1, extra=[identity])
    model.graph.initializer[0].name = "W0"
    result = _verify(model, tmp_path)
    assert result.notes == [
        "ONNX Runtime rejects the original's layout=1 RNNs; reference outputs from an "
        "equivalent layout=0 model (the layout rules alone) in ONNX Runtime"
    ]
    assert result.runs == [{"x": (2, 3, 3)}, {"x": (5, 6, 3)}] and result.ok
    equivalent = ort_calls[1][0]
    assert isinstance(equivalent, bytes) and ort_calls[1][1] == {"optimize": False, "arena": False}
    nodes = onnx.load_from_string(equivalent).graph.node
    assert sorted(n.op_type for n in nodes) == [
        "Identity",
        "LSTM",
        "Transpose",
        "Transpose",
        "Transpose",
    ]
    (lstm,) = (n for n in nodes if n.op_type == "LSTM")
    assert [a.i for a in lstm.attribute if a.name == "layout"] in ([], [0])


def test_a_layout_1_original_with_external_data(tmp_path: Path, ort_calls: list) -> None:
    """The equivalent inlines the original's external data."""
    path = tmp_path / "model.onnx"
    onnx.save(_lstm(layout=1), path, save_as_external_data=True, size_threshold=0)
    stored = onnx.load(path, load_external_data=False).graph.initializer
    assert {t.data_location for t in stored} == {TensorProto.EXTERNAL}
    report = rewrite_file(path, None, RewriteOptions(verify=True))
    assert report.verify is not None and report.verify.ok
    assert report.verify.notes[0].startswith("ONNX Runtime rejects the original's layout=1")
    tensors = onnx.load_from_string(ort_calls[1][0]).graph.initializer
    assert {t.name for t in tensors} >= {"W", "R"}
    assert all(t.data_location == TensorProto.DEFAULT for t in tensors)


def test_a_model_ort_rejects_is_compared_with_onnx_reference(
    tmp_path: Path, ort_calls: list
) -> None:
    """The result must load in ONNX Runtime (as a user runs it) for the check to be made;
    the note says the check is partial. Without layout=1 RNNs no equivalent is made."""
    model = _dead_lstm()
    error = _ort_error(model)
    ort_calls.clear()
    result = _verify(model, tmp_path)
    assert result.reference == "onnx.reference" and result.ok
    assert result.notes == [
        f"ONNX Runtime rejects the original model ({error}); reference outputs "
        "from onnx.reference: a partial check (it ignores sequence_lens and clip on RNNs)"
    ]
    assert [kwargs for _, kwargs in ort_calls] == [
        {"optimize": False, "arena": False},  # the original
        {"arena": False},  # does the result load?
        {"arena": False},  # the result, compared
    ]
    lines = _lines(model, tmp_path)
    assert "  max abs diff per output (onnx.reference reference):" in lines


def test_an_equivalent_ort_rejects_too_is_skipped(tmp_path: Path, ort_calls: list) -> None:
    """A layout=1 LSTM beside an op no runtime knows: the equivalent (made and tried)
    keeps that op, and so does the result: nothing to compare."""
    model = _lstm(layout=1)
    model.graph.node.append(helper.make_node("Bar", ["y_h"], ["z"], domain="foo"))
    model.graph.output.append(_vi("z", None))
    model.opset_import.append(helper.make_opsetid("foo", 1))
    message = _refusal(model, tmp_path, CannotVerify)
    assert message.startswith(f"ONNX Runtime {runtime.require_onnxruntime()} does not load")
    assert isinstance(ort_calls[1][0], bytes)  # the equivalent was tried


def test_a_layout_1_rnn_whose_hidden_size_is_unknown_has_no_equivalent(
    tmp_path: Path, ort_calls: list
) -> None:
    """The layout rule cannot rewrite an LSTM whose hidden size it cannot prove: no
    equivalent, and neither model loads in ONNX Runtime."""
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], layout=1)
    model = _model(
        [node],
        [_vi("x", ["b", "s", 3]), _vi("R", [1, 8, 2])],
        [_vi("y", ["b", "s", 1, 2])],
        [_weights("W", (1, 8, 3))],
    )
    message = _refusal(model, tmp_path, CannotVerify)
    assert message.startswith(f"ONNX Runtime {runtime.require_onnxruntime()} does not load")
    assert not any(isinstance(source, bytes) for source, _ in ort_calls)


def test_neither_model_loading_in_ort_cannot_be_verified(tmp_path: Path) -> None:
    model = _unknown_op(dead=False)
    error = _ort_error(_save(model, tmp_path, "copy.onnx").read_bytes())
    assert _refusal(model, tmp_path, CannotVerify) == (
        f"ONNX Runtime {runtime.require_onnxruntime()} does not load the original model "
        f"(nor the result): Load model from {tmp_path / 'model.onnx'} failed:{error}"
    )


def test_an_original_no_runtime_loads_cannot_be_verified(tmp_path: Path) -> None:
    """The result loads (the rewrite removed the unknown op), the original loads in
    neither runtime (nor is it layout=1)."""
    message = _refusal(_unknown_op(dead=True), tmp_path, CannotVerify)
    assert message.startswith("the original model does not load in ONNX Runtime: ")
    assert "foo:Bar(-1) is not a registered function/op" in message


# ---------------------------------------------------------------- comparing the result


def _plus(value: float) -> Callable:
    def replacement(op, x):
        return op.Add(op.Max(x, op.Constant(value_float=0.0)), op.Constant(value_float=value))

    return replacement


def test_each_outputs_largest_difference_is_kept(tmp_path: Path) -> None:
    """A result 0.25 off on ``y`` and exact on ``z``: per output, the max over the runs;
    the report flags what exceeds the tolerance."""
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Sigmoid", ["x"], ["z"])]
    model = _model(nodes, [_vi("x", ["n", 3])], [_vi("y", ["n", 3]), _vi("z", ["n", 3])])
    rule = _rule(_relu, _plus(0.25))
    result = _verify(model, tmp_path, selected=[rule])
    assert result.max_diff == {"y": pytest.approx(0.25), "z": 0.0}
    assert result.worst == pytest.approx(0.25)
    assert result.runs == [{"x": (2, 3)}, {"x": (5, 3)}] and result.failure is None
    assert not result.ok
    assert _lines(model, tmp_path, selected=[rule]) == [
        "verify: 2 runs, seed 0, tolerance 0.0001",
        "  run 1: x=2x3",
        "  run 2: x=5x3",
        "  max abs diff per output (onnxruntime reference):",
        "    y  0.25  > tolerance",
        "    z  0",
        "verify: FAILED: max abs diff 0.25 > tolerance 0.0001",
    ]
    within = _lines(model, tmp_path, selected=[rule], tolerance=0.5, shapes={"n": (1,)})
    assert within == [
        "verify: 1 run, seed 0, tolerance 0.5",
        "  run 1: x=1x3",
        "  max abs diff per output (onnxruntime reference):",
        "    y  0.25",
        "    z  0",
        "verify: OK",
    ]


def test_both_models_are_fed_the_seeded_inputs(tmp_path: Path) -> None:
    """Relu against Identity differs by the largest negative input: the same for a seed,
    another for another seed."""
    rule = _rule(_relu, lambda op, x: op.Identity(x))
    first = _verify(_unary(), tmp_path, selected=[rule], seed=7, tolerance=0.5)
    again = _verify(_unary(), tmp_path, selected=[rule], seed=7, tolerance=0.5)
    other = _verify(_unary(), tmp_path, selected=[rule], seed=8, tolerance=0.5)
    assert first.max_diff == again.max_diff != other.max_diff
    assert first.max_diff["y"] > 0.5 and (first.seed, first.tolerance, first.ok) == (7, 0.5, False)


def test_progress_ticks_twice_per_run(tmp_path: Path) -> None:
    """Once the original ran, once the result ran; the total is known before."""
    ticks = _Ticks()
    result = _verify(_unary(), tmp_path, shapes={"n": (4,)}, progress=ticks)
    assert result.runs == [{"x": (4, 3)}]  # the two runs' sizes are one: run once
    assert ticks.verify == 2 == ticks.totals["verifying in ONNX Runtime"]


def test_a_result_ort_does_not_load_fails(tmp_path: Path) -> None:
    rule = _rule(_relu, lambda op, x: op.Bar(x, _domain="foo"))
    result = _verify(_unary(), tmp_path, selected=[rule])
    assert result.failure is not None
    assert result.failure.startswith("the rewritten model does not load in ONNX Runtime: ")
    assert "foo:Bar(-1) is not a registered function/op" in result.failure
    assert result.runs == [] and result.max_diff == {} and not result.ok
    lines = _lines(_unary(), tmp_path, selected=[rule])
    assert lines[0] == "verify: 0 runs, seed 0, tolerance 0.0001"
    assert lines[-1].startswith("verify: FAILED: the rewritten model does not load in ONNX")


def test_the_first_run_with_another_shape_stops_the_check(tmp_path: Path) -> None:
    """Flatten(axis=0) gives 1 x (n * 3): run 1 fails, run 2 is not compared."""
    ticks = _Ticks()
    rule = _rule(_relu, lambda op, x: op.Flatten(op.Max(x, op.Constant(value_float=0.0)), axis=0))
    result = _verify(_unary(), tmp_path, selected=[rule], progress=ticks)
    assert result.failure == "run 1: output 'y' has shape (1, 6), expected (2, 3)"
    assert result.runs == [{"x": (2, 3)}] and ticks.verify == 2  # the original's two runs


def test_the_failure_names_the_run_by_its_number(tmp_path: Path) -> None:
    """The first two rows of x: right at n=2 (run 1, compared), wrong at n=5."""

    def first_rows(op, x):
        relu = op.Max(x, op.Constant(value_float=0.0))
        return op.Slice(relu, op.Constant(value_ints=[0]), op.Constant(value_ints=[2]))

    result = _verify(_unary(), tmp_path, selected=[_rule(_relu, first_rows)])
    assert result.failure == "run 2: output 'y' has shape (2, 3), expected (5, 3)"
    assert result.max_diff == {"y": 0.0} and result.runs == [{"x": (2, 3)}, {"x": (5, 3)}]


def test_a_result_that_raises_fails_with_its_error(tmp_path: Path) -> None:
    """The error is shortened to one line."""

    def regrouped(op, x):
        relu = op.Max(x, op.Constant(value_float=0.0))
        return op.Reshape(op.Reshape(relu, op.Constant(value_ints=[-1, 4])), op.Shape(x))

    result = _verify(_unary(), tmp_path, selected=[_rule(_relu, regrouped)])
    assert result.failure is not None
    assert result.failure.startswith("the rewritten model fails on x=2x3: ")
    assert "\n" not in result.failure and result.runs == [] and result.max_diff == {}
