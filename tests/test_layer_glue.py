"""layer_glue: exporter chains after an RNN collapse to the fewest provably equal nodes."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn_rewrite_rules
from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.rules import layer_glue
from rnn_rewrite_rules.testing.exporters import (
    ExporterSpec,
    build_exporter_model,
    exporter_specs,
    in_if_branches,
    quantized_lstm_model,
)
from tests.exporter_support import (
    all_nodes,
    apply_family,
    assert_spec_equivalent,
    run,
)
from tests.reasons import refusal_reasons
from tests.support import apply, as_function

FAMILY = ["layer_glue"]
GLUE = ("Transpose", "Squeeze", "Unsqueeze", "Reshape", "Identity")
H = 3


def _glue_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in all_nodes(model.graph) if n.op_type in GLUE]


def _model(
    chain: str, *, direction: str = "forward", opset: int = 17, extra: str = ""
) -> onnx.ModelProto:
    """An LSTM on x [s, b, 2] (H=3) followed by ``chain`` (text lines) producing ``out``."""
    d = 2 if direction == "bidirectional" else 1
    text = f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[s, b, 2] x) => (float out{extra}) {{
            w = Constant <value: tensor = float[{d}, 12, 2] {{{", ".join(["0.1"] * d * 24)}}}> ()
            r = Constant <value: tensor = float[{d}, 12, 3] {{{", ".join(["-0.2"] * d * 36)}}}> ()
            y, yh = LSTM <hidden_size: int = 3, direction: string = "{direction}"> (x, w, r)
            {chain}
        }}
    """
    model = onnx.parser.parse_model(text)
    model.graph.output[0].type.tensor_type.ClearField("shape")
    model = onnx.shape_inference.infer_shapes(model)  # the output's rank, whatever the chain
    out_type = model.graph.output[0].type.tensor_type
    if not out_type.HasField("shape"):  # a chain that fails at run time: any rank will do
        out_type.shape.dim.add().dim_param = "n"
    return model


def _equivalent(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 1), (3, 5), (7, 2)):
        feeds = {"x": rng.standard_normal((seq, batch, 2)).astype(np.float32)}
        diff = runtime.max_abs_diff(run(before, feeds, "ort"), run(after, feeds, "ort"))
        assert diff <= 1e-6, (batch, seq, diff)


def _ints(name: str, values: list[int]) -> str:
    listed = ", ".join(map(str, values))
    return f"{name} = Constant <value: tensor = int64[{len(values)}] {{{listed}}}> ()"


CHAINS = {
    # tf2onnx between layers: [s,1,b,H] -> [b,1,s,H] -> [b,s,H] -> [s,b,H]
    "tf2onnx": (
        f"""{_ints("one", [1])}
            t1 = Transpose <perm: ints = [2, 1, 0, 3]> (y)
            sq = Squeeze (t1, one)
            out = Transpose <perm: ints = [1, 0, 2]> (sq)""",
        "forward",
        ["Squeeze"],
    ),
    # keras: Squeeze(1) -> batch-major -> time-major again
    "keras": (
        f"""{_ints("one", [1])}
            sq = Squeeze (y, one)
            t1 = Transpose <perm: ints = [1, 0, 2]> (sq)
            out = Transpose <perm: ints = [1, 0, 2]> (t1)""",
        "forward",
        ["Squeeze"],
    ),
    # Squeeze(1) -> Transpose -> Reshape(const): flatten batch-major for a Dense layer
    "squeeze_transpose_reshape": (
        f"""{_ints("one", [1])}
            {_ints("target", [-1, H])}
            sq = Squeeze (y, one)
            t1 = Transpose <perm: ints = [1, 0, 2]> (sq)
            out = Reshape (t1, target)""",
        "forward",
        ["Transpose", "Reshape"],
    ),
    # uni Transpose(0,2,1,3) -> Reshape([0,0,-1]) is one Squeeze
    "uni_transpose_reshape": (
        f"""{_ints("target", [0, 0, -1])}
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
        ["Squeeze"],
    ),
    # TorchScript batch_first bidirectional tail
    "torchscript_bi_batch_first": (
        f"""{_ints("target", [0, 0, -1])}
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            r1 = Reshape (t1, target)
            out = Transpose <perm: ints = [1, 0, 2]> (r1)""",
        "bidirectional",
        ["Transpose", "Reshape"],
    ),
    # a target computed from Shape(Y) (symbolic seq and batch) is proven too
    "computed_target": (
        f"""{_ints("one", [1])}
            {_ints("zero", [0])}
            {_ints("two", [2])}
            {_ints("h", [H])}
            shape = Shape (y)
            s = Gather (shape, zero)
            b = Gather (shape, two)
            target = Concat <axis: int = 0> (b, s, h)
            t1 = Transpose <perm: ints = [2, 0, 1, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
        ["Transpose", "Squeeze"],
    ),
    # Transpose without perm reverses the axes: twice is Y again (an Identity keeps "out")
    "reversed_twice": (
        """t1 = Transpose (y)
            out = Transpose (t1)""",
        "forward",
        ["Identity"],
    ),
    # allowzero=1 and a computed [seq * batch, H]: a 0 would be 0, so no copy proof is needed
    "allowzero_computed_target": (
        f"""{_ints("zero", [0])}
            {_ints("two", [2])}
            {_ints("h", [H])}
            shape = Shape (y)
            s = Gather (shape, zero)
            b = Gather (shape, two)
            sb = Mul (s, b)
            target = Concat <axis: int = 0> (sb, h)
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Reshape <allowzero: int = 1> (t1, target)""",
        "forward",
        ["Reshape"],
    ),
    # Y's unit axis moved last: one Transpose (dropping it first would lose a dimension)
    "unit_axis_moved_last": (
        f"""{_ints("one", [1])}
            {_ints("three", [3])}
            sq = Squeeze (y, one)
            out = Unsqueeze (sq, three)""",
        "forward",
        ["Transpose"],
    ),
    # [1, b, H] -> [b, 1, H] -> [1, b, 1, H]: one Unsqueeze of Y_h (not a Reshape)
    "unsqueeze_of_final_state": (
        f"""{_ints("zero", [0])}
            t1 = Transpose <perm: ints = [1, 0, 2]> (yh)
            out = Unsqueeze (t1, zero)""",
        "forward",
        ["Unsqueeze"],
    ),
    # [s, b, 1, 1, H]: two candidates cost a Transpose and one op each; the first (the
    # goal's own unit placement, an Unsqueeze) is kept, not the later Reshape
    "tie_keeps_the_first_candidate": (
        f"""{_ints("one", [1])}
            {_ints("units", [2, 3])}
            i1 = Identity (y)
            sq = Squeeze (i1, one)
            out = Unsqueeze (sq, units)""",
        "forward",
        ["Transpose", "Unsqueeze"],
    ),
    # [1, 1, s * b, H]: H is copied (0), so the -1 is next to sizes > 0 only
    "units_around_minus_one": (
        f"""{_ints("target", [1, 1, -1, H])}
            i1 = Identity (y)
            out = Reshape (i1, target)""",
        "forward",
        ["Reshape"],
    ),
    # Y_h [1, b, H] -> [b, 1, H] -> [b, H]
    "final_state": (
        f"""{_ints("one", [1])}
            t1 = Transpose <perm: ints = [1, 0, 2]> (yh)
            out = Squeeze (t1, one)""",
        "forward",
        ["Squeeze"],
    ),
}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_exporter_chains_collapse(name: str) -> None:
    chain, direction, expected = CHAINS[name]
    before = _model(chain, direction=direction)
    after, count = apply_family(FAMILY, before)
    assert count == 1
    assert _glue_ops(after) == expected
    _equivalent(before, after)
    again, count = apply(rnn_rewrite_rules.rules(FAMILY), after)
    assert count == 0 and again.graph == after.graph


@pytest.mark.parametrize("opset", [9, 11, 12, 13, 21])
def test_squeeze_axes_follow_the_opset(opset: int) -> None:
    """Before opset 13 Squeeze takes ``axes`` as an attribute, from 13 as an input."""
    if opset < 13:
        chain = """t1 = Transpose <perm: ints = [2, 1, 0, 3]> (y)
            sq = Squeeze <axes: ints = [1]> (t1)
            out = Transpose <perm: ints = [1, 0, 2]> (sq)"""
    else:
        chain = CHAINS["tf2onnx"][0]
    before = _model(chain, opset=opset)
    after, count = apply_family(FAMILY, before)
    assert count == 1
    (squeeze,) = [n for n in after.graph.node if n.op_type == "Squeeze"]
    if opset < 13:
        assert len(squeeze.input) == 1 and squeeze.attribute[0].ints == [1]
    else:
        assert len(squeeze.input) == 2 and not squeeze.attribute
        (axes,) = [i for i in after.graph.initializer if i.name == squeeze.input[1]]
        assert onnx.numpy_helper.to_array(axes).tolist() == [1]
    _equivalent(before, after)


#: ``s`` and ``b``: Y's seq and batch read from its shape at run time; ``two``, ``h``: [2], [H].
_SEQ_AND_BATCH = f"""{_ints("zero", [0])}
            {_ints("two", [2])}
            {_ints("h", [H])}
            shape = Shape (y)
            s = Gather (shape, zero)
            b = Gather (shape, two)"""

NEAR_MISSES = {
    # moving a non-unit axis (batch before seq) is a real transpose: 2 nodes, minimal
    "moves_non_unit_axis": (
        f"""{_ints("one", [1])}
            t1 = Transpose <perm: ints = [2, 1, 0, 3]> (y)
            out = Squeeze (t1, one)""",
        "forward",
    ),
    # Squeeze(1) of the bidirectional axis (2): not provably 1 (fails at run time)
    "squeezes_two_directions": (
        f"""{_ints("one", [1])}
            t1 = Transpose <perm: ints = [0, 1, 2, 3]> (y)
            out = Squeeze (t1, one)""",
        "bidirectional",
    ),
    # a constant target that freezes seq and batch at the export sizes
    "frozen_axes": (
        f"""{_ints("target", [5, 2, H])}
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
    ),
    # a target mixing up seq and batch (computed, so not constant)
    "swapped_target": (
        f"""{_SEQ_AND_BATCH}
            target = Concat <axis: int = 0> (b, s, h)
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
    ),
    # [seq * 2, batch * H] (allowzero: a 0 is 0): two dynamic groups, no constant target
    "two_dynamic_groups": (
        f"""{_SEQ_AND_BATCH}
            d0 = Mul (s, two)
            d1 = Mul (b, h)
            target = Concat <axis: int = 0> (d0, d1)
            out = Reshape <allowzero: int = 1> (y, target)""",
        "bidirectional",
    ),
    # perm of another rank (invalid: fails at run time)
    "perm_of_another_rank": ("out = Transpose <perm: ints = [1, 0, 2]> (y)", "forward"),
    # the same axis inserted twice
    "unsqueeze_repeated_axes": (
        f"""{_ints("axes", [1, 1])}
            out = Unsqueeze (y, axes)""",
        "forward",
    ),
    # opset 13 Squeeze without axes drops every unit axis: not followed
    "squeeze_without_axes": ("out = Squeeze (y)", "forward"),
    # Max(seq, 1): not a provable size
    "unprovable_target": (
        f"""{_SEQ_AND_BATCH}
            {_ints("one", [1])}
            m = Max (s, one)
            target = Concat <axis: int = 0> (m, b, h)
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
    ),
    # seq + 1 is positive (never a copy), but no product of Y's axes
    "target_not_a_product": (
        f"""{_SEQ_AND_BATCH}
            {_ints("one", [1])}
            m = Add (s, one)
            target = Concat <axis: int = 0> (m, b, h)
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
    ),
    # [s, 1, b, H] -> [s, 1, b, 2 * H]: the last element needs an axis Y does not have
    "target_past_the_last_axis": (
        f"""{_ints("target", [0, 0, 0, 2 * H])}
            t1 = Transpose <perm: ints = [0, 1, 2, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
    ),
    # allowzero=1: a 0 in the target is a 0-sized axis, not a copy
    "allowzero_zero": (
        f"""{_ints("target", [0, 0, -1])}
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Reshape <allowzero: int = 1> (t1, target)""",
        "forward",
    ),
    # a 0 past the input's rank copies nothing (invalid)
    "zero_past_the_rank": (
        f"""{_ints("target", [0, 0, 0, 0, 0])}
            t1 = Transpose <perm: ints = [0, 1, 2, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
    ),
    # -2 is no size
    "negative_two": (
        f"""{_ints("target", [0, -2, 0, 0])}
            t1 = Transpose <perm: ints = [0, 1, 2, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
    ),
    # two -1
    "two_minus_ones": (
        f"""{_ints("target", [-1, -1, H])}
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
    ),
    # a computed element past the input's rank (after a Squeeze: rank 3) copies nothing
    # ([s, b, H, s]: fails at run time unless seq is 1)
    "computed_past_the_rank": (
        f"""{_SEQ_AND_BATCH}
            {_ints("one", [1])}
            target = Concat <axis: int = 0> (s, b, h, s)
            sq = Squeeze (y, one)
            out = Reshape (sq, target)""",
        "forward",
    ),
    # [s, 1, b]: H is left out (fails at run time)
    "target_leaves_an_axis": (
        f"""{_ints("target", [0, 1, 0])}
            t1 = Transpose <perm: ints = [0, 1, 2, 3]> (y)
            out = Reshape (t1, target)""",
        "forward",
    ),
    # [s, b * H] by [0, -1]: a -1 next to seq, which may be 0, has no equal constant target
    "minus_one_beside_a_copy": (
        f"""{_ints("one", [1])}
            {_ints("target", [0, -1])}
            sq = Squeeze (y, one)
            out = Reshape (sq, target)""",
        "forward",
    ),
    # the intermediate transpose is read elsewhere: the chain cannot die
    "shared_intermediate": (
        f"""{_ints("one", [1])}
            t1 = Transpose <perm: ints = [2, 1, 0, 3]> (y)
            sq = Squeeze (t1, one)
            tt = Transpose <perm: ints = [1, 0, 2]> (sq)
            sq2 = Squeeze (t1, one)
            tt2 = Transpose <perm: ints = [1, 0, 2]> (sq2)
            out = Concat <axis: int = 2> (tt, tt2)""",
        "forward",
    ),
}


NEAR_MISS_REASONS = {
    "moves_non_unit_axis": "already minimal (2 nodes, best 2)",
    "squeezes_two_directions": "Squeeze of an axis that is not provably 1",
    "frozen_axes": "Reshape target element is not a product of the input's axes (frozen?)",
    "swapped_target": "Reshape target has a computed element that may be 0 and copy an axis",
    "shared_intermediate": "already minimal (1 nodes, best 1)",
    "two_dynamic_groups": "no constant-target realization keeps the axes dynamic",
    "perm_of_another_rank": "Transpose perm does not match the rank",
    "unsqueeze_repeated_axes": "Unsqueeze axes out of range or repeated",
    "squeeze_without_axes": "Squeeze axes are not constant",
    "unprovable_target": "Reshape target is not a provable shape computation",
    "target_not_a_product": "Reshape target element is not a product of the input's axes (frozen?)",
    "target_past_the_last_axis": (
        "Reshape target element is not a product of the input's axes (frozen?)"
    ),
    "allowzero_zero": "Reshape target has a 0 that does not copy an axis",
    "zero_past_the_rank": "Reshape target has a 0 that does not copy an axis",
    "negative_two": "Reshape target has a negative element other than one -1",
    "two_minus_ones": "Reshape target has a negative element other than one -1",
    "computed_past_the_rank": (
        "Reshape target has a computed element that may be 0 and copy an axis"
    ),
    "target_leaves_an_axis": "Reshape target does not cover every axis",
    "minus_one_beside_a_copy": "no constant-target realization keeps the axes dynamic",
}
_GOES_ON = "the chain goes on: rewritten at its last node"


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_are_left_alone(name: str) -> None:
    chain, direction = NEAR_MISSES[name]
    before = _model(chain, direction=direction)
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before, check=False)
    assert count == 0
    assert _glue_ops(after) == _glue_ops(before)
    found = refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, before)
    assert NEAR_MISS_REASONS[name] in found, found
    if len(_glue_ops(before)) > 1:
        assert _GOES_ON in found, found  # the chain's first node waits for its last


@pytest.mark.parametrize(
    ("domain", "output"), [("custom", False), ("", True)], ids=["custom_op", "graph_output"]
)
def test_a_chain_stops_at_another_domain_or_a_graph_output(domain: str, output: bool) -> None:
    """The first node of the tf2onnx chain is a custom op, or its output is also a graph
    output: the chain stops there, and the rest does not start at an RNN output."""
    chain = """t1 = Transpose <perm: ints = [2, 1, 0, 3]> (y)
            sq = Squeeze <axes: ints = [1]> (t1)
            out = Transpose <perm: ints = [1, 0, 2]> (sq)"""
    before = _model(chain, opset=12, extra=", float[b, 1, s, 3] t1" if output else "")
    if domain:
        (node,) = [n for n in before.graph.node if "t1" in n.output]
        node.domain = domain
        before.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before, check=False)
    assert count == 0  # the chain after t1 does not start at an RNN output
    found = refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, before)
    assert "chain neither starts at an RNN output nor feeds X" in found, found
    first = [n for n in after.graph.node if "t1" in n.output]
    assert len(first) == 1 and first[0].domain == domain
    assert any(o.name == "t1" for o in after.graph.output) == output
    if output:
        _equivalent(before, after)


def test_chain_not_after_an_rnn_is_left_alone() -> None:
    model = onnx.parser.parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[s, 1, b, 3] y) => (float[b, s, 3] out) {{
            {_ints("one", [1])}
            t1 = Transpose <perm: ints = [2, 1, 0, 3]> (y)
            sq = Squeeze (t1, one)
            out = Transpose <perm: ints = [1, 0, 2]> (sq)
        }}
        """
    )
    assert apply_family(FAMILY, model)[1] == 0
    found = refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, model)
    assert "chain neither starts at an RNN output nor feeds X" in found, found


def test_chain_into_x_of_unknown_rank_is_left_alone() -> None:
    model = _input_chain(extra_reader=False)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    assert apply(rnn_rewrite_rules.rules(FAMILY), model, check=False)[1] == 0
    found = refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, model)
    assert "rank of the chain's input is unknown" in found, found


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("style", ["torchscript", "tf2onnx"])
def test_dynamic_quantize_lstm_glue(direction: str, style: str) -> None:
    """ORT's quantized LSTM has LSTM's output layout: the glue rules cover it."""
    before = quantized_lstm_model(direction=direction, style=style, zero_states=False)
    after = rnn_rewrite_rules.rewrite(before, ["layer_glue", "layer_output"])
    expected = ["Squeeze"] if direction == "forward" else ["Transpose", "Reshape"]
    assert _glue_ops(after) == expected
    spec = ExporterSpec(input_size=4, hidden_size=5, direction=direction)
    assert_spec_equivalent(before, after, spec, atol=1e-6)


@given(
    spec=exporter_specs(
        wrap=st.sampled_from([None, None, "if", "loop", "scan"]),
        num_layers=st.integers(1, 3),
    )
)
def test_property_equivalent_fewer_nodes_idempotent(spec: ExporterSpec) -> None:
    before = build_exporter_model(spec)
    after = rnn_rewrite_rules.rewrite(before)
    onnx.checker.check_model(after, full_check=True)
    if spec.layout == 0:  # layout=1 nodes need Transposes around the layout=0 ones
        assert len(_glue_ops(after)) <= len(_glue_ops(before))
    engine = "ort" if spec.layout == 0 or spec.wrap == "loop" else "reference"
    if spec.wrap == "loop" and spec.layout == 1:
        engine = "skip"
    if engine != "skip":
        assert_spec_equivalent(before, after, spec, sizes=((2, 3), (1, 1), (3, 2)))
    again = rnn_rewrite_rules.rewrite(after)
    assert again.graph == after.graph


def _input_chain(extra_reader: bool) -> onnx.ModelProto:
    reader = "other = Identity (xtt)" if extra_reader else ""
    out = ", float[b, s, 2] other" if extra_reader else ""
    model = onnx.parser.parse_model(
        f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[b, s, 2] x) => (float[s, 1, b, 3] y{out}) {{
            w = Constant <value: tensor = float[1, 9, 2] {{{", ".join(["0.1"] * 18)}}}> ()
            r = Constant <value: tensor = float[1, 9, 3] {{{", ".join(["-0.2"] * 27)}}}> ()
            xt = Transpose <perm: ints = [1, 0, 2]> (x)
            xtt = Transpose <perm: ints = [0, 1, 2]> (xt)
            x2 = Transpose <perm: ints = [1, 0, 2]> (xtt)
            {reader}
            y = GRU <hidden_size: int = 3> (x2, w, r)
        }}
        """
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def test_chain_into_x_cancels() -> None:
    """Transposes in front of X (batch-first input + the layout rule's) cancel to an Identity."""
    before = _input_chain(extra_reader=False)
    after, count = apply_family(FAMILY, before)
    assert count == 1 and _glue_ops(after) == ["Identity"]
    rng = np.random.default_rng(0)
    for b, s in ((1, 1), (3, 5)):
        feeds = {"x": rng.standard_normal((b, s, 2)).astype(np.float32)}
        assert runtime.max_abs_diff(run(before, feeds, "ort"), run(after, feeds, "ort")) == 0


def test_chain_into_x_with_another_reader_is_left_alone() -> None:
    assert apply_family(FAMILY, _input_chain(extra_reader=True))[1] == 0


@pytest.mark.parametrize(
    ("name", "perm", "target"),
    [
        ("torchscript_bi_batch_first", [2, 0, 1, 3], [0, 0, 2 * H]),
        ("squeeze_transpose_reshape", [2, 0, 3, 1], [-1, H]),
        ("units_around_minus_one", None, [1, 1, -1, 0]),
    ],
)
def test_replacement_perm_and_target(name: str, perm: list[int] | None, target: list[int]) -> None:
    """What docs/exporters.md promises: at most one Transpose of Y and a 0/-1/constant
    target, an initializer of the main graph."""
    chain, direction, _ = CHAINS[name]
    after, _count = apply_family(FAMILY, _model(chain, direction=direction))
    transposes = [n for n in after.graph.node if n.op_type == "Transpose"]
    (reshape,) = [n for n in after.graph.node if n.op_type == "Reshape"]
    assert [list(t.attribute[0].ints) for t in transposes] == ([perm] if perm else [])
    (init,) = [i for i in after.graph.initializer if i.name == reshape.input[1]]
    assert onnx.numpy_helper.to_array(init).tolist() == target


@pytest.mark.parametrize("length", [layer_glue._MAX_CHAIN, layer_glue._MAX_CHAIN + 1])
def test_a_chain_is_followed_back_at_most_max_chain_nodes(length: int) -> None:
    """``length`` Transposes swapping seq and batch after Y (an even count is Y's own
    layout): followed back up to ``_MAX_CHAIN`` nodes, a longer chain is not reached."""
    names = [*(f"t{i}" for i in range(length - 1)), "out"]
    lines = [
        f"{name} = Transpose <perm: ints = [2, 1, 0, 3]> ({source})"
        for source, name in zip(["y", *names], names, strict=False)
    ]
    before = _model("\n            ".join(lines))
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before, check=False)
    if length <= layer_glue._MAX_CHAIN:
        assert count == 1 and len(_glue_ops(after)) < length
        _equivalent(before, after)
    else:
        assert count == 0
        found = refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, before)
        assert "chain neither starts at an RNN output nor feeds X" in found, found


def test_a_function_importing_another_opset_is_left_alone() -> None:
    chain, direction = CHAINS["tf2onnx"][:2]
    model = _model(chain, direction=direction)
    version = model.opset_import[0].version
    found = refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, as_function(model, version - 1))
    reason = (
        f"function 'layer' imports opset {version - 1} of 'ai.onnx' but the model "
        f"{version}: an emitted op would be invalid in one of them"
    )
    assert reason in found, found


def test_two_transposes_that_cancel_become_one_identity() -> None:
    """Two nodes that cancel, before a graph output: one Identity keeps both names."""
    before = _model(
        """t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Transpose <perm: ints = [0, 2, 1, 3]> (t1)"""
    )
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before)
    assert count == 1 and _glue_ops(after) == ["Identity"]
    _equivalent(before, after)


def test_a_node_kept_by_a_shape_reader_is_not_counted_as_saved() -> None:
    """The first Transpose of three lives on (its Shape is an output): the chain still
    saves one of the two that die."""
    before = _model(
        """t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            t2 = Transpose <perm: ints = [0, 2, 1, 3]> (t1)
            out = Transpose <perm: ints = [0, 2, 1, 3]> (t2)
            s = Shape (t1)""",
        extra=", int64[4] s",
    )
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before)
    assert count == 1 and len(_glue_ops(after)) == 2  # t1 for its Shape, and one for out
    _equivalent(before, after)


@pytest.mark.parametrize("name", ["tf2onnx", "squeeze_transpose_reshape"])
def test_constants_in_a_branch_are_constant_nodes(name: str) -> None:
    """An If branch's Squeeze axes and Reshape target are Constant nodes in the branch (the
    main graph's initializers are shared by name, which a branch cannot check)."""
    chain, direction, expected = CHAINS[name]
    model = _model(chain, direction=direction)
    before = in_if_branches(model, model)
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before)
    assert count == 2 and not after.graph.initializer
    for attr in after.graph.node[0].attribute:
        branch = attr.g
        assert [n.op_type for n in branch.node if n.op_type in GLUE] == expected
        assert not branch.initializer
        constants = {o for n in branch.node if n.op_type == "Constant" for o in n.output}
        (last,) = [n for n in branch.node if n.op_type == expected[-1]]
        assert last.input[1] in constants
    rng = np.random.default_rng(0)
    for cond, (batch, seq) in itertools.product((True, False), ((1, 1), (3, 5))):
        feeds = {
            "x": rng.standard_normal((seq, batch, 2)).astype(np.float32),
            "cond": np.array(cond),
        }
        assert runtime.max_abs_diff(run(before, feeds, "ort"), run(after, feeds, "ort")) <= 1e-6


@pytest.mark.parametrize("length", [layer_glue._MAX_DYING - 2, layer_glue._MAX_DYING + 6])
def test_dying_looks_at_max_dying_nodes(length: int) -> None:
    """A Reshape whose target passes through ``length`` Identity nodes: the Reshape and at
    most ``_MAX_DYING - 1`` of them, nearest first, are found to die."""
    lines = [f"t{i + 1} = Identity (t{i})" for i in range(length)]
    graph = ir.serde.deserialize_model(
        onnx.parser.parse_model(
            f"""
            <ir_version: 8, opset_import: ["" : 17]>
            g (float[s, b, 2] x) => (float[s, n] out) {{
                t0 = Constant <value: tensor = int64[2] {{0, -1}}> ()
                {" ".join(lines)}
                out = Reshape (x, t{length})
            }}
            """
        )
    ).graph
    dying = layer_glue._dying([graph.node(-1)])
    found = min(length + 2, layer_glue._MAX_DYING)  # the Constant t0 too, if reached
    assert dying == set(list(graph)[-found:])


def test_a_batch_declared_0_is_not_grouped() -> None:
    """A Reshape target element that copies an axis of size 0: a run of 0 elements is no
    proof of which axes it groups, so the chain is left alone."""
    before = _model(
        f"""{_ints("target", [0, 0, -1])}
            t1 = Transpose <perm: ints = [0, 2, 1, 3]> (y)
            out = Reshape (t1, target)"""
    )
    batch = before.graph.input[0].type.tensor_type.shape.dim[1]
    batch.dim_value = 0  # replaces the dim_param "b"
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before, check=False)
    assert count == 0 and _glue_ops(after) == _glue_ops(before)
    reason = "Reshape target element is not a product of the input's axes (frozen?)"
    assert reason in refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, before)


def test_a_squeeze_with_an_empty_axes_input_is_left_alone() -> None:
    """``Squeeze(t, "")``: the optional axes input given as empty (every unit axis)."""
    before = _model(
        """t1 = Transpose <perm: ints = [0, 1, 2, 3]> (y)
            out = Squeeze (t1)"""
    )
    (squeeze,) = [n for n in before.graph.node if n.op_type == "Squeeze"]
    squeeze.input.append("")
    _after, count = apply(rnn_rewrite_rules.rules(FAMILY), before, check=False)
    assert count == 0
    found = refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, before)
    assert "Squeeze axes are not constant" in found, found


def _reshape_by_its_own_shape(extra_chain: str = "", extra: str = "") -> onnx.ModelProto:
    """``out = Reshape(t1, Concat(Shape(t1)[0], Shape(t1)[1], h))`` for ``t1``, a Transpose
    of ``y``, and an initializer ``h`` = [H]; then ``extra_chain``."""
    before = _model(
        f"""{_ints("zero", [0])}
            {_ints("one", [1])}
            t1 = Transpose <perm: ints = [2, 0, 1, 3]> (y)
            shape = Shape (t1)
            b = Gather (shape, zero)
            s = Gather (shape, one)
            target = Concat <axis: int = 0> (b, s, h)
            out = Reshape (t1, target)
            {extra_chain}""",
        extra=extra,
    )
    before.graph.initializer.append(onnx.numpy_helper.from_array(np.array([H]), "h"))
    return before


def test_a_chain_node_read_by_its_own_target_computation_dies_with_it() -> None:
    """``t1``'s other reader, the Shape of the Reshape target, dies with the chain, so
    ``t1`` counts as saved (3 nodes, best 2); the walk goes on past the initializer ``h``
    it meets first."""
    before = _reshape_by_its_own_shape()
    before.graph.output[0].type.tensor_type.ClearField("shape")  # [b, s, H], once h is known
    before = onnx.shape_inference.infer_shapes(before)
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before)
    assert count == 1 and _glue_ops(after) == ["Transpose", "Squeeze"]
    _equivalent(before, after)


def test_a_runtime_target_counts_once_beside_a_node_that_lives_on() -> None:
    """As above, but ``t1`` has a reader that lives on (a Shape that is a graph output):
    the chain saves the Reshape and its target computation (2 nodes), no more than its
    replacement (Transpose, Squeeze) costs."""
    before = _reshape_by_its_own_shape("kept = Shape (t1)", ", int64[4] kept")
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before, check=False)
    assert count == 0 and _glue_ops(after) == _glue_ops(before)
    found = refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, before)
    assert "already minimal (2 nodes, best 2)" in found, found


@pytest.mark.parametrize("pool", ["ReduceMean", "ReduceMax"])
def test_a_last_transpose_read_by_a_reduction_is_not_counted(pool: str) -> None:
    """TorchScript's batch-first ``Transpose(0,2,1,3) -> Reshape -> Transpose(1,0,2)``
    pooled over time: ONNX Runtime moves the last Transpose past the reduction, so the
    chain costs it two nodes, as the collapsed one would (which pools ``[1, T, C]`` over
    axis 1, measured slower at batch 1: ``benchmarks``' wakeforge-hey-mycroft)."""
    from rnn_rewrite_rules.testing import thirdparty as tp

    before = tp.torchscript_batch_first("GRU", num_layers=1, direction="bidirectional", pool=pool)
    found = refusal_reasons(rnn_rewrite_rules.rules(FAMILY).rules, before)
    wanted = f"the last Transpose is not counted: ONNX Runtime moves it past the {pool}"
    assert any(wanted in r and "already minimal (2 nodes, best 2)" in r for r in found), found
    after, count = apply(rnn_rewrite_rules.rules(FAMILY), before, check=False)
    assert count == 0 and _glue_ops(after) == _glue_ops(before)


def test_a_last_transpose_that_is_also_an_output_counts() -> None:
    """The same chain whose pooled Transpose is also a graph output: nothing absorbs it,
    and the chain collapses."""
    from rnn_rewrite_rules.testing import thirdparty as tp

    model = tp.torchscript_batch_first(
        "GRU", num_layers=1, direction="bidirectional", pool="ReduceMean"
    )
    (pool,) = [n for n in model.graph.node if n.op_type == "ReduceMean"]
    model.graph.output.append(onnx.helper.make_tensor_value_info(pool.input[0], 1, None))
    after = rnn_rewrite_rules.rewrite(model, FAMILY)
    assert len(_glue_ops(after)) < len(_glue_ops(model))
    feeds = tp.thirdparty_inputs(model, 2, 5)
    assert runtime.max_abs_diff(runtime.run(model, feeds), runtime.run(after, feeds)) <= 1e-6
