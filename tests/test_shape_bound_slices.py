"""Slices whose bounds are computed from ``Shape`` at run time (TorchScript's ``chunk``,
issue 40): ``ProvenSliceBoundsPass`` writes proven bounds as constants, the cell readers
then see a step's gates (``rules.cell.columns``) and a state read from a cache
(``rules.one_step``); unproven bounds, uneven chunks and a step of 2 stay as written.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import costs, runtime
from rnn_rewrite_rules._streaming import frame_feeds
from rnn_rewrite_rules.normalize import Journal, ProvenSliceBoundsPass, normalize
from rnn_rewrite_rules.passes import RemoveDeadNodesPass
from rnn_rewrite_rules.rules import one_step
from rnn_rewrite_rules.testing.one_step import StepConfig, build_step, step_feeds
from tests.reasons import refusal_reasons
from tests.support import op_counts

DATA = pathlib.Path(__file__).parent / "data" / "exporters"
INT64_MAX = int(np.iinfo(np.int64).max)
IGNORE = costs.Context(ignore=True)


@dataclasses.dataclass(frozen=True)
class Chunks:
    """How each ``Split`` of a step becomes TorchScript's ``chunk``: ``d = (w + n - 1) //
    (n + extra)`` with ``w = Shape(g)[axis]``, and ``Slice(g, k * d, (k + 1) * d, [axis])``.

    ``bounds``: ``"torch"`` as above; ``"int_max"``: the last end ``INT64_MAX``;
    ``"negative"``: every bound counted from the end (``k * d - w``), the last end
    ``INT64_MAX``. ``steps``: ``"absent"``, ``"computed"`` (``d // d``, 1) or ``"two"``.
    ``extra``: chunks narrower than a gate (uneven). ``width``: ``"shape"``, or
    ``"input"`` (``w`` fed as an int64 graph input: not proven). ``initializers``: the
    int constants as initializers instead of ``Constant`` nodes.
    """

    axis: int = 1
    bounds: str = "torch"
    steps: str = "absent"
    extra: int = 0
    width: str = "shape"
    initializers: bool = False


def _int64(name: str, values: list[int]) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(np.array(values, np.int64), name)
    return helper.make_node("Constant", [], [name], name=f"{name}_node", value=tensor)


def _chunk_nodes(split: onnx.NodeProto, chunks: Chunks) -> list[onnx.NodeProto]:
    """The nodes that compute ``split``'s outputs as ``chunks`` says."""
    p, n, g = split.name, len(split.output), split.input[0]
    nodes = [_int64(f"{p}_axis", [chunks.axis])]
    if chunks.width == "input":
        width = "width"
    else:
        width = f"{p}_w"
        nodes.append(helper.make_node("Shape", [g], [f"{p}_shape"], name=f"{p}_Shape"))
        gather = helper.make_node("Gather", [f"{p}_shape", f"{p}_axis"], [width], axis=0)
        gather.name = f"{p}_Gather"
        nodes.append(gather)
    nodes += [_int64(f"{p}_n1", [n - 1]), _int64(f"{p}_n", [n + chunks.extra])]
    nodes.append(helper.make_node("Add", [width, f"{p}_n1"], [f"{p}_wn"], name=f"{p}_Add"))
    nodes.append(helper.make_node("Div", [f"{p}_wn", f"{p}_n"], [f"{p}_d"], name=f"{p}_Div"))
    open_end = chunks.bounds in ("int_max", "negative")
    marks = []
    for k in range(n if open_end else n + 1):
        nodes.append(_int64(f"{p}_k{k}", [k]))
        nodes.append(
            helper.make_node("Mul", [f"{p}_d", f"{p}_k{k}"], [f"{p}_m{k}"], name=f"{p}_Mul_{k}")
        )
        if chunks.bounds == "negative":
            nodes.append(
                helper.make_node("Sub", [f"{p}_m{k}", width], [f"{p}_e{k}"], name=f"{p}_Sub_{k}")
            )
        marks.append(f"{p}_e{k}" if chunks.bounds == "negative" else f"{p}_m{k}")
    if open_end:
        nodes.append(_int64(f"{p}_max", [INT64_MAX]))
        marks.append(f"{p}_max")
    steps = []
    if chunks.steps == "computed":
        nodes.append(
            helper.make_node("Div", [f"{p}_d", f"{p}_d"], [f"{p}_step"], name=f"{p}_Div_step")
        )
        steps = [f"{p}_step"]
    elif chunks.steps == "two":
        nodes.append(_int64(f"{p}_step", [2]))
        steps = [f"{p}_step"]
    for k, out in enumerate(split.output):
        inputs = [g, marks[k], marks[k + 1], f"{p}_axis", *steps]
        nodes.append(helper.make_node("Slice", inputs, [out], name=f"{p}_Slice_{k}"))
    return nodes


def chunked(cfg: StepConfig, chunks: Chunks = Chunks()) -> onnx.ModelProto:
    """:func:`build_step`'s step with every gate ``Split`` written as ``chunks`` says."""
    model = build_step(cfg)
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        nodes += _chunk_nodes(node, chunks) if node.op_type == "Split" else [node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if chunks.width == "input":
        model.graph.input.append(helper.make_tensor_value_info("width", TensorProto.INT64, [1]))
    if chunks.initializers:
        constants = [n for n in model.graph.node if n.op_type == "Constant"]
        for node in constants:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
            model.graph.node.remove(node)
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(model: onnx.ModelProto, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    feeds = step_feeds(model, batch, seed)
    if "width" in feeds:
        gates = {"LSTM": 4, "GRU": 3}["LSTM" if "c" in feeds else "GRU"]
        feeds["width"] = np.array([gates * feeds["h"].shape[1]], np.int64)
    return feeds


def _assert_same(before: onnx.ModelProto, after: onnx.ModelProto, batches) -> None:
    """Equal in ONNX Runtime at each batch; at batch 0 (where declared symbolic) equal
    shapes in ``onnx.reference`` (ONNX Runtime's LSTM/GRU abort there)."""
    for batch in batches:
        feeds = _feeds(before, batch, seed=batch)
        if batch == 0:
            expected = ReferenceEvaluator(before).run(None, feeds)
            actual = ReferenceEvaluator(after).run(None, feeds)
            assert [a.shape for a in actual] == [e.shape for e in expected]
            continue
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff <= 1e-5, f"batch {batch}: {diff}"


def _normalized(model: onnx.ModelProto) -> tuple[ir.Model, ProvenSliceBoundsPass, Journal]:
    ir_model = ir.serde.deserialize_model(model)
    journal = Journal()
    normalization = ProvenSliceBoundsPass(journal)
    normalization(ir_model)
    return ir_model, normalization, journal


def _written(value: ir.Value | None) -> bool:
    """``value`` is an initializer or a ``Constant``'s output."""
    node = None if value is None else value.producer()
    return value is not None and (value.is_initializer() or node.op_type == "Constant")


def _nodes(model: onnx.ModelProto) -> list[tuple]:
    return [(n.name, n.op_type, list(n.input), list(n.output)) for n in model.graph.node]


def _text(model: onnx.ModelProto | ir.Model) -> str:
    """The graph as text, through onnx-ir (which lists initializers its own way)."""
    ir_model = model if isinstance(model, ir.Model) else ir.serde.deserialize_model(model)
    return onnx.printer.to_text(ir.serde.serialize_model(ir_model).graph)


FORMS = [
    Chunks(),
    Chunks(axis=-1),
    Chunks(bounds="int_max"),
    Chunks(bounds="negative", axis=-1),
    Chunks(steps="computed"),
]
FORM_IDS = ["torch", "axis_-1", "int_max", "negative", "computed_step"]


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("chunks", FORMS, ids=FORM_IDS)
def test_proven_bounds_become_constants_and_come_back_unused(op_type, chunks) -> None:
    """Every Slice reads constants, no shape arithmetic is left, the outputs are equal;
    ``restore()`` (no rule used them) gives back the model as written."""
    before = chunked(StepConfig(op_type=op_type), chunks)
    ir_model, normalization, journal = _normalized(before)
    assert normalization.refusals == []
    slices = [n for n in ir_model.graph if n.op_type == "Slice"]
    assert slices and all(_written(v) for n in slices for v in n.inputs[1:])
    assert not {"Shape", "Gather", "Div"} & {n.op_type for n in ir_model.graph}
    _assert_same(before, ir.serde.serialize_model(ir_model), (1, 3, 0))
    assert journal.restore() == len(slices)
    assert _text(ir_model) == _text(before)


@pytest.mark.parametrize(
    ("op_type", "batch"), [("LSTM", 1), ("LSTM", 3), ("GRU", 1), ("GRU", 3), ("GRU", "batch")]
)
@pytest.mark.parametrize("chunks", FORMS, ids=FORM_IDS)
def test_a_chunked_step_becomes_one_node(op_type, batch, chunks) -> None:
    """With the cost model ignored: one node, equal outputs (a symbolic batch: the GRU
    with the Expands that broadcast the batches, at batch 1, 3 and 0)."""
    before = chunked(StepConfig(op_type=op_type, batch=batch), chunks)
    after = rnn_rewrite_rules.rewrite(before, target="onnxruntime", context=IGNORE)
    onnx.checker.check_model(after, full_check=True)
    counts = op_counts(after)
    assert counts[op_type] == 1
    assert not {"Gather", "Div"} & set(counts)
    assert len(after.graph.node) < len(before.graph.node)
    _assert_same(before, after, (1, 3, 0) if batch == "batch" else (batch,))
    assert _text(rnn_rewrite_rules.rewrite(after, target="onnxruntime", context=IGNORE)) == (
        _text(after)
    )


def test_a_width_fed_at_run_time_is_not_proven() -> None:
    """``w`` from a graph input's value: the bounds stay computed, and the LSTM rule says
    the gate is not a Slice of constant columns."""
    before = chunked(StepConfig(op_type="LSTM", batch=2), Chunks(width="input"))
    _, normalization, _ = _normalized(before)
    assert (
        "n3_Split_Slice_0",
        "n3_Split_Slice_0: its starts (n3_Split_m0) are not proven constant",
    ) in [(name, str(reason)) for name, reason in normalization.refusals]
    after = rnn_rewrite_rules.rewrite(before, target="onnxruntime", context=IGNORE)
    assert _text(after) == _text(before)
    reasons = refusal_reasons(one_step.make_rules("onnxruntime"), before, IGNORE)
    assert any(
        "n3_Split_Slice_0 is not a Slice of constant columns keeping every row" in r
        for r in reasons
    ), reasons


@pytest.mark.parametrize(
    ("chunks", "reason"),
    [
        (Chunks(extra=1), "gate i's weights are not [I, H] and [H, H] with H = 7"),
        (Chunks(steps="two"), "is not a Slice of constant columns keeping every row"),
    ],
    ids=["uneven", "step_2"],
)
def test_proven_bounds_the_cell_does_not_read_stay(chunks, reason) -> None:
    """Bounds proven and written as constants, but chunks narrower than a gate or a step
    of 2: the cell prover refuses them, and the bounds are put back as written."""
    before = chunked(StepConfig(op_type="LSTM", batch=2), chunks)
    ir_model, normalization, _ = _normalized(before)
    assert normalization.refusals == []
    reasons = refusal_reasons(
        one_step.make_rules("onnxruntime"), ir.serde.serialize_model(ir_model), IGNORE
    )
    assert any(reason in r for r in reasons), reasons
    after = rnn_rewrite_rules.rewrite(before, target="onnxruntime", context=IGNORE)
    assert _text(after) == _text(before)


@pytest.mark.parametrize("initializers", [False, True], ids=["constant_nodes", "initializers"])
def test_bounds_come_back_after_a_cleanup_removed_their_computation(initializers) -> None:
    """The cleanup after a rule round that fired elsewhere drops the initializers the
    removed shape arithmetic read; the undo puts all of it back where it was."""
    before = chunked(
        StepConfig(op_type="LSTM"), Chunks(bounds="negative", initializers=initializers)
    )
    ir_model, _, journal = _normalized(before)
    RemoveDeadNodesPass()(ir_model)
    assert journal.restore() == 4
    after = ir.serde.serialize_model(ir_model)
    onnx.checker.check_model(after, full_check=True)
    assert _nodes(after) == _nodes(before)  # in the same order
    assert sorted(i.name for i in after.graph.initializer) == sorted(
        i.name for i in before.graph.initializer
    )
    _assert_same(before, after, (1, 3))


# ------------------------------------------------------------------ the exporter files

TORCHSCRIPT = ["torch_script/vad_decoder_plain_lstm_step.onnx"]
TORCHSCRIPT += ["torch_script/streaming_enhancer_cache.onnx"]
#: file -> (op, the reason its step stays on the default target, portable and onnxruntime)
#: (a symbolic batch: the node's batch-0 guard and the broadcast outgrow the step)
KEPT = {
    "torch_script/vad_decoder_plain_lstm_step.onnx": ("LSTM", "guard (the batch may be 0"),
    "torch_dynamo/vad_decoder_plain_lstm_step.onnx": ("LSTM", "guard (the batch may be 0"),
    "torch_script/streaming_enhancer_cache.onnx": ("GRU", "guard (the batch may be 0"),
    "torch_dynamo/streaming_enhancer_cache.onnx": ("GRU", "guard (the batch may be 0"),
}


@pytest.mark.parametrize("target", ["portable", "onnxruntime"])
@pytest.mark.parametrize("name", list(KEPT))
def test_the_files_steps_are_kept_for_a_size_or_cost_reason(name: str, target: str) -> None:
    """Recognised in both exporters' spellings; kept as written for the size of the node
    with its batch-0 guard and broadcast (LSTM: only c's batch broadcast since the
    consumer facts), never as "no recurrence"."""
    before = onnx.load(DATA / name)
    context = costs.Context()
    after = rnn_rewrite_rules.rewrite(before, target=target, context=context)
    op, reason = KEPT[name]
    reasons = [d.reason for d in context.declined if d.rule == f"OneStepCell[{op}]"]
    assert reasons and all(r.startswith("one step kept as plain ops: ") for r in reasons)
    assert all(reason in r for r in reasons), reasons
    assert _text(after) == _text(before)


def _static_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for value in [*result.graph.input, *result.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].dim_param:
            dims[0].dim_value = batch
    return result


@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("name", TORCHSCRIPT)
def test_the_torchscript_steps_become_nodes_at_a_static_batch(name: str, batch: int) -> None:
    """With the cost model ignored and the batch fixed (2: the export's): one node per
    cell, no shape arithmetic left, equal outputs; the symbolic-batch GRU file too (with
    the broadcast), at batch 0 in ``onnx.reference``."""
    op = KEPT[name][0]
    before = _static_batch(onnx.load(DATA / name), batch)
    after = rnn_rewrite_rules.rewrite(before, target="onnxruntime", context=IGNORE)
    onnx.checker.check_model(after, full_check=True)
    counts = op_counts(after)
    assert counts[op] == (2 if op == "GRU" else 1)
    assert not {"Div", "Gather"} & set(counts)
    assert len(after.graph.node) < len(before.graph.node)
    for seed in (0, 1):
        feeds = frame_feeds(before, {}, seed=seed)
        diff = runtime.max_abs_diff(runtime.run(before, feeds), runtime.run(after, feeds))
        assert diff <= 1e-5, f"{name}: {diff}"


def test_the_torchscript_cache_file_at_a_symbolic_batch_stays() -> None:
    """With the cost model ignored too: each GRU step (14 nodes) would be 16 with the
    broadcast and the batch-0 guard its symbolic batch needs."""
    before = onnx.load(DATA / TORCHSCRIPT[1])
    context = costs.Context(ignore=True)
    after = rnn_rewrite_rules.rewrite(before, target="onnxruntime", context=context)
    reasons = [d.reason for d in context.declined if d.rule == "OneStepCell[GRU]"]
    assert reasons and all("guard" in r and "16 nodes, the step 14" in r for r in reasons)
    assert _text(after) == _text(before)


def test_a_cache_of_symbolic_width_is_not_proven() -> None:
    """The TorchScript cache file with ``cache_in`` declared ``[batch, cache]``: the
    chunk's bounds are not proven, the states are not read, nothing changes."""
    before = onnx.load(DATA / TORCHSCRIPT[1])
    cache = next(v for v in before.graph.input if v.name == "cache_in")
    cache.type.tensor_type.shape.dim[1].dim_param = "cache"
    _, normalization, _ = _normalized(before)
    assert ("/Slice", "/Slice: its ends (/Mul_output_0) are not proven constant") in [
        (name, str(reason)) for name, reason in normalization.refusals
    ]
    after = rnn_rewrite_rules.rewrite(before, target="onnxruntime", context=IGNORE)
    assert op_counts(after)["GRU"] == 0
    assert _text(after) == _text(before)


def test_normalize_runs_the_pass() -> None:
    ir_model = ir.serde.deserialize_model(onnx.load(DATA / TORCHSCRIPT[0]))
    assert normalize(ir_model)
    assert "Shape" not in {n.op_type for n in ir_model.graph}
