"""Hypothesis strategies of core models: the recurrences the rules match.

Each core is one of the builders of :mod:`rnn_rewrite_rules.testing` with drawn
arguments: ONNX ``RNN``/``LSTM``/``GRU`` stacks in every exporter style (inside
``If``/``Loop``/``Scan`` too), ``DynamicQuantizeLSTM``, unrolled ``nn.RNN`` chains,
``LSTMCell``/``GRUCell`` loops (opsets 7 to 21), hand-built bidirectional layers and
third-party forms. Near misses are drawn too: the rules must leave them exactly alone.
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from rnn_rewrite_rules.testing import thirdparty, unrolled
from rnn_rewrite_rules.testing.exporters import (
    build_exporter_model,
    exporter_specs,
    quantized_lstm_model,
)
from rnn_rewrite_rules.testing.fuzz.case import Case
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model

__all__ = ["CORES", "cores", "slices_as_attributes"]

_OPSETS = st.integers(7, 21)
_SMALL = st.integers(1, 4)


@st.composite
def _exporter(draw) -> Case:
    spec = draw(exporter_specs(wrap=st.sampled_from([None, None, "if", "loop", "scan"])))
    case = Case(build_exporter_model(spec), steps=[f"exporter({spec})"])
    if spec.wrap == "if":
        case.fixed["cond"] = np.array(draw(st.booleans()))
    return case


@st.composite
def _quantized(draw) -> Case:
    kwargs = {
        "input_size": draw(_SMALL),
        "hidden_size": draw(_SMALL),
        "direction": draw(st.sampled_from(["forward", "reverse", "bidirectional"])),
        "outputs": draw(st.lists(st.sampled_from("yhc"), min_size=1, unique=True).map(tuple)),
        "zero_states": draw(st.booleans()),
        "style": draw(st.sampled_from(["torchscript", "tf2onnx"])),
        "seed": draw(st.integers(0, 99)),
    }
    return Case(quantized_lstm_model(**kwargs), steps=[f"quantized_lstm_model(**{kwargs})"])


@st.composite
def _unrolled_rnn(draw) -> Case:
    initial_state = draw(st.sampled_from(["input", "zeros", "folded"]))
    bidirectional = draw(st.booleans())
    batch = draw(st.integers(1, 3)) if initial_state == "folded" else draw(st.none() | _SMALL)
    cfg = unrolled.UnrolledRnnConfig(
        input_size=draw(_SMALL),
        hidden_size=draw(_SMALL),
        seq=draw(st.integers(1, 4)),
        num_layers=draw(st.integers(1, 2)),
        bidirectional=bidirectional,
        batch_first=draw(st.booleans()),
        bias=draw(st.booleans()),
        nonlinearity=draw(st.sampled_from(["tanh", "relu"])),
        initial_state=initial_state,
        batch=batch,
        dynamic_seq=draw(st.booleans()),
        transpose_node=draw(st.booleans()),
        mutation=draw(st.none() | st.sampled_from(sorted(unrolled.MUTATIONS))),
        opset=draw(st.integers(10 if bidirectional else 9, 21)),  # reversing: opset 10
        seed=draw(st.integers(0, 99)),
    )
    model = slices_as_attributes(unrolled.build_unrolled_rnn(cfg))
    return Case(model, min_sizes={"seq": cfg.seq}, steps=[f"unrolled_rnn({cfg})"])


@st.composite
def _cell_loop(draw) -> Case:
    opset = draw(_OPSETS)
    forms = ["folded", "first_frame", "inputs"]
    forms += ["zeros", "constant_of_shape"] if opset >= 9 else []
    initial_state = draw(st.sampled_from(forms))
    batch = draw(st.integers(1, 3)) if initial_state == "folded" else draw(st.none() | _SMALL)
    read = draw(st.sampled_from(["gather", "slice"]))
    cfg = unrolled.UnrolledCellConfig(
        op_type=draw(st.sampled_from(["LSTM", "GRU"])),
        input_size=draw(_SMALL),
        hidden_size=draw(_SMALL),
        seq=draw(st.integers(1, 4)),
        reverse=draw(st.booleans()),
        bias=draw(st.booleans()),
        gemm=draw(st.booleans()),
        read=read,
        initial_state=initial_state,
        batch=batch,
        batch_first=read == "gather" and draw(st.booleans()),
        shared_read=draw(st.booleans()),
        mutation=draw(st.none() | st.sampled_from(sorted(unrolled.CELL_MUTATIONS))),
        opset=opset,
        seed=draw(st.integers(0, 99)),
    )
    model = slices_as_attributes(unrolled.build_unrolled_cell(cfg))
    return Case(model, min_sizes={"seq": cfg.seq}, steps=[f"cell_loop({cfg})"])


_BIDIRECTIONAL_MISSES = [None, "sequence_lens", "partial", "unreversed_output", "state_read"]


@st.composite
def _hand_built_bidirectional(draw) -> Case:
    reverse_node = draw(st.booleans())
    misses = _BIDIRECTIONAL_MISSES + (list(thirdparty._STATE_MISSES) if reverse_node else [])
    near_miss = draw(st.sampled_from(misses)) if draw(st.integers(0, 3)) == 0 else None
    kwargs = {
        "op_type": draw(st.sampled_from(["LSTM", "GRU", "RNN"])),
        "halves": draw(st.sampled_from(["both", "both", "reverse"])),
        "concat": draw(st.sampled_from(["sequence", "directions"])),
        "states": draw(st.booleans()),
        "reverse_node": reverse_node,
        "sequence_lens": reverse_node and draw(st.booleans()),
        "state_concat": reverse_node and draw(st.booleans()),
        "near_miss": near_miss,
        "input_size": draw(_SMALL),
        "hidden": draw(_SMALL),
    }
    if kwargs["state_concat"] and near_miss == "state_read":
        kwargs["state_concat"] = False  # the builder writes h_n twice for this pair
    model = thirdparty.hand_built_bidirectional(**kwargs)
    return Case(model, steps=[f"hand_built_bidirectional(**{kwargs})"])


@st.composite
def _thirdparty(draw) -> Case:
    op_type = draw(st.sampled_from(["LSTM", "GRU", "RNN"]))
    sizes = {"input_size": draw(_SMALL), "hidden": draw(_SMALL)}
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    builder = draw(st.sampled_from(["rank_checks", "one_dim", "computed", "batch_first", "paddle"]))
    if builder == "rank_checks":
        kwargs = {"op_type": op_type, "near_miss": draw(st.none() | st.just("runtime_condition"))}
        model = thirdparty.rank_checks(**kwargs, **sizes)
    elif builder == "one_dim":
        kwargs = {"op_type": op_type, "steps": draw(_SMALL), "stacked": draw(st.booleans())}
        model = thirdparty.one_dim_states(**kwargs, **sizes)
    elif builder == "computed":
        kwargs = {"op_type": op_type, "direction": direction}
        model = thirdparty.computed_reshape(**kwargs, **sizes)
    elif builder == "batch_first":
        kwargs = {"op_type": op_type, "direction": direction, "num_layers": draw(_SMALL)}
        model = thirdparty.torchscript_batch_first(**kwargs, **sizes)
    else:
        kwargs = {"op_type": op_type, "direction": direction, "num_layers": draw(_SMALL)}
        model = thirdparty.paddle_states(**kwargs, **sizes)
    return Case(model, steps=[f"{builder}(**{kwargs | sizes})"])


@st.composite
def _state_forms(draw) -> Case:
    if draw(st.booleans()):
        kwargs = {
            "form": draw(st.sampled_from(["zeros_like", "mul_finite", "expand", "mul_reduction"])),
            "op_type": draw(st.sampled_from(["LSTM", "GRU", "RNN"])),
        }
        return Case(thirdparty.zeros_like_state(**kwargs), steps=[f"zeros_like_state({kwargs})"])
    kwargs = {
        "quantized": draw(st.booleans()),
        "direction": draw(st.sampled_from(["forward", "reverse", "bidirectional"])),
        "batch_source": draw(st.sampled_from(["embedding", "transposed", "ids"])),
        "transpose_first": draw(st.booleans()),
    }
    return Case(thirdparty.embedding_tagger(**kwargs), steps=[f"embedding_tagger({kwargs})"])


@st.composite
def _loop(draw) -> Case:
    """A recurrent layer as a ``Loop`` (torch.export's ``while_loop`` over ``len(x)``, or
    Keras'/tf1's constant trip count), or a ``Scan``."""
    form = draw(st.sampled_from(["torch", "torch", "keras", "tf1", "scan"]))
    spec = LoopSpec(
        cell=draw(st.sampled_from(["LSTM", "GRU", "RNN"])),
        form=form,
        input_size=draw(_SMALL),
        hidden_size=draw(_SMALL),
        steps=draw(_SMALL),
        direction=draw(st.sampled_from(["forward", "reverse"])),
        outputs=draw(st.sampled_from([("y",), ("y", "h"), ("h",)])),
        trip_count="length" if form == "torch" else "constant",
        opset=draw(st.integers(13, 21)),
        seed=draw(st.integers(0, 99)),
    )
    model = build_loop_model(spec)
    min_sizes = {} if spec.trip_count == "length" else {"seq": spec.steps}
    return Case(model, min_sizes=min_sizes, steps=[f"loop({spec})"])


#: Core name -> its strategy.
CORES = {
    "exporter": _exporter(),
    "quantized": _quantized(),
    "unrolled_rnn": _unrolled_rnn(),
    "cell_loop": _cell_loop(),
    "hand_built_bidirectional": _hand_built_bidirectional(),
    "thirdparty": _thirdparty(),
    "state_forms": _state_forms(),
    "loop": _loop(),
}


def cores(names: list[str] | None = None) -> st.SearchStrategy[Case]:
    """One of the named cores (all by default)."""
    return st.one_of([CORES[name] for name in names or CORES])


def slices_as_attributes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Below opset 10 ``Slice`` takes ``starts``/``ends``/``axes`` as attributes: the
    builders' constant inputs moved there (steps must be 1 then)."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= 10:
        return model
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "Slice" or len(node.input) == 1:
            continue
        arrays = [constants[name] for name in node.input[1:]]
        if len(arrays) == 4 and np.any(arrays[3] != 1):
            raise ValueError("a reversing Slice has no opset-9 form")
        attrs = [
            helper.make_attribute(key, [int(v) for v in array])
            for key, array in zip(("starts", "ends", "axes"), arrays, strict=False)
        ]
        del node.input[1:]
        node.attribute.extend(attrs)
    used = {name for node in model.graph.node for name in node.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model
