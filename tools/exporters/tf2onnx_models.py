"""Keras recurrent models exported with tf2onnx (``tf.function`` + ``from_function``).

    python -m tools.exporters.make tf2onnx [--only NAME ...]         # Keras 3
    python -m tools.exporters.make tf2onnx_keras2 [--only NAME ...]  # Keras 2 (tf_keras)

Keras 2 exports :data:`KERAS2_MODELS` (the same specs) with TensorFlow's legacy Keras.

Random weights (every variable, biases included, N(0, 0.3) from a seed per model), input
features 6, units 8, exported at batch 2, seq 5; batch and seq dynamic where Keras allows
(``unroll=True`` and the CRNN's image width fix the sequence). Each file is checked against
the Keras model at the export sizes and at a larger size of each dynamic axis
(:mod:`tools.exporters.checks`).

Reruns give the same graphs, but not always the same bytes: where tf2onnx merges two equal
nodes (a Bidirectional layer's two ``Shape`` chains), which one keeps its name changes from
run to run (one thread, ``PYTHONHASHSEED`` and op determinism do not fix it). The torch
exports are byte for byte reproducible.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

F, H, BATCH, SEQ = 6, 8, 2, 5
SCRIPT = "tools/exporters/tf2onnx_models.py"
REFUSE_MASK = (
    "refuse: Masking skips masked steps anywhere in the sequence (the state is carried "
    "through them), which an RNN node's sequence_lens (a prefix per row) cannot express"
)


@dataclasses.dataclass(frozen=True)
class Spec:
    """One Keras model: ``build(keras)`` returns (inputs, outputs) of a functional model."""

    source: str
    layer: str
    config: dict
    build: Callable
    #: graph input name -> axes (roles or ints); the order of the model's inputs.
    inputs: dict
    frozen: tuple[str, ...] = ()
    expect: str = "rewrite"
    notes: str = ""
    #: tf2onnx's ``opset`` (None: its default, 15)
    opset: int | None = None


def _x(keras, seq=None, name="x"):
    return keras.Input((seq, F), name=name)


def _single(layer_fn, **extra) -> Callable:
    def build(keras):
        x = _x(keras, **extra)
        return [x], layer_fn(keras)(x)

    return build


def _rnn(kind: str, **kw) -> Callable:
    return lambda keras: getattr(keras.layers, kind)(H, **kw)


def _stack(kinds: list[str], last_sequences: bool = True) -> Callable:
    def build(keras):
        x = _x(keras)
        y = x
        for i, kind in enumerate(kinds):
            last = i == len(kinds) - 1
            y = getattr(keras.layers, kind)(H, return_sequences=not last or last_sequences)(y)
        return [x], y

    return build


def _bidirectional(kind: str, merge_mode: str, **kw) -> Callable:
    def build(keras):
        x = _x(keras)
        layer = getattr(keras.layers, kind)(H, return_sequences=True, **kw)
        return [x], keras.layers.Bidirectional(layer, merge_mode=merge_mode)(x)

    return build


def _stacked_cells(keras):
    """One ``RNN`` layer over two LSTM cells (``StackedRNNCells``): one Loop, two cells."""
    cells = [keras.layers.LSTMCell(H), keras.layers.LSTMCell(H)]
    x = _x(keras)
    return [x], keras.layers.RNN(cells, return_sequences=True)(x)


def _initial_state(kind: str) -> Callable:
    def build(keras):
        x = _x(keras)
        states = [keras.Input((H,), name="h0")]
        if kind == "LSTM":
            states.append(keras.Input((H,), name="c0"))
        y = getattr(keras.layers, kind)(H, return_sequences=True)(x, initial_state=states)
        return [x, *states], y

    return build


def _masking(kind: str) -> Callable:
    def build(keras):
        x = _x(keras)
        y = keras.layers.Masking(mask_value=0.0)(x)
        y = getattr(keras.layers, kind)(H, return_sequences=True)(y)
        return [x], y

    return build


def _dense_after(kind: str, time_distributed: bool) -> Callable:
    def build(keras):
        x = _x(keras)
        y = getattr(keras.layers, kind)(H, return_sequences=True)(x)
        dense = keras.layers.Dense(4)
        y = keras.layers.TimeDistributed(dense)(y) if time_distributed else dense(y)
        return [x], y

    return build


def _crnn_conv2d(keras):
    """An OCR-style CRNN: a 12 x 16 image, Conv2D + pooling, columns as steps."""
    image = keras.Input((12, 16, 1), name="image")
    y = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
    y = keras.layers.MaxPooling2D((2, 2))(y)  # [B, 6, 8, 4]
    y = keras.layers.Permute((2, 1, 3))(y)  # [B, 8 columns, 6, 4]
    y = keras.layers.Reshape((8, 24))(y)
    y = keras.layers.Bidirectional(keras.layers.LSTM(H, return_sequences=True))(y)
    return [image], keras.layers.Dense(5, activation="softmax")(y)


def _conv1d_gru(keras):
    x = _x(keras)
    y = keras.layers.Conv1D(8, 3, padding="same", activation="relu")(x)
    y = keras.layers.GRU(H, return_sequences=True)(y)
    return [x], keras.layers.Dense(3)(y)


def _encoder_decoder(keras):
    """Seq2seq training graph: the encoder's final LSTM states start the decoder."""
    source = keras.Input((None, F), name="source")
    target = keras.Input((None, F), name="target")
    _, h, c = keras.layers.LSTM(H, return_state=True)(source)
    y = keras.layers.LSTM(H, return_sequences=True)(target, initial_state=[h, c])
    return [source, target], keras.layers.Dense(F)(y)


def _gru_encoder_decoder(keras):
    source = keras.Input((None, F), name="source")
    target = keras.Input((None, F), name="target")
    _, h = keras.layers.GRU(H, return_state=True)(source)
    y = keras.layers.GRU(H, return_sequences=True)(target, initial_state=h)
    return [source, target], keras.layers.Dense(F)(y)


X = {"x": ["batch", "seq", F]}
X_FIXED = {"x": ["batch", SEQ, F]}
SEQ2SEQ = {"source": ["batch", "seq", F], "target": ["batch", "target_seq", F]}


def _specs() -> dict[str, Spec]:
    specs: dict[str, Spec] = {}

    def add(name, source, layer, config, build, inputs=X, **kw):
        specs[name] = Spec(source, layer, config, build, inputs, **kw)

    for kind in ("LSTM", "GRU", "SimpleRNN"):
        low = kind.lower()
        add(f"{low}_last", f"{kind}({H})", kind, {"units": H}, _single(_rnn(kind)))
        add(
            f"{low}_sequences",
            f"{kind}({H}, return_sequences=True)",
            kind,
            {"units": H, "return_sequences": True},
            _single(_rnn(kind, return_sequences=True)),
        )
        add(
            f"{low}_state",
            f"{kind}({H}, return_sequences=True, return_state=True)",
            kind,
            {"units": H, "return_sequences": True, "return_state": True},
            _single(_rnn(kind, return_sequences=True, return_state=True)),
        )
        add(
            f"{low}_go_backwards",
            f"{kind}({H}, return_sequences=True, go_backwards=True)",
            kind,
            {"units": H, "return_sequences": True, "go_backwards": True},
            _single(_rnn(kind, return_sequences=True, go_backwards=True)),
            notes="Keras returns the outputs in reversed time order",
        )
        # opset 18: Split(num_outputs) unstacks the steps (SimpleRNN: no node on portable)
        for opset in (None,) if kind == "SimpleRNN" else (None, 18):
            at = "" if opset is None else f", opset {opset}"
            add(
                f"{low}_unroll" + ("" if opset is None else f"_opset{opset}"),
                f"{kind}({H}, return_sequences=True, unroll=True) on a fixed seq {SEQ}{at}",
                kind,
                {"units": H, "return_sequences": True, "unroll": True},
                _single(_rnn(kind, return_sequences=True, unroll=True), seq=SEQ),
                inputs=X_FIXED,
                notes="unroll=True needs a fixed sequence length: one cell per step",
                opset=opset,
            )
        add(
            f"{low}_masking",
            f"Masking(0.0) -> {kind}({H}, return_sequences=True)",
            kind,
            {"units": H, "return_sequences": True, "masking": 0.0},
            _masking(kind),
            inputs={"x": {"axes": ["batch", "seq", F], "values": "masked"}},
            expect=REFUSE_MASK,
        )
        states = {**X, "h0": ["batch", H], **({"c0": ["batch", H]} if kind == "LSTM" else {})}
        add(
            f"{low}_initial_state",
            f"{kind}({H}, return_sequences=True)(x, initial_state=[graph inputs])",
            kind,
            {"units": H, "return_sequences": True, "initial_state": "inputs"},
            _initial_state(kind),
            inputs=states,
        )
    add(
        "gru_reset_before",
        f"GRU({H}, return_sequences=True, reset_after=False)",
        "GRU",
        {"units": H, "return_sequences": True, "reset_after": False},
        _single(_rnn("GRU", return_sequences=True, reset_after=False)),
        notes="the reset gate applied before the recurrent projection (linear_before_reset=0)",
    )
    add(
        "gru_reset_before_last",
        f"GRU({H}, reset_after=False)",
        "GRU",
        {"units": H, "reset_after": False},
        _single(_rnn("GRU", reset_after=False)),
    )
    for mode in ("concat", "sum", "ave", "mul"):
        add(
            f"bidirectional_lstm_{mode}",
            f"Bidirectional(LSTM({H}, return_sequences=True), merge_mode={mode!r})",
            "LSTM",
            {"units": H, "return_sequences": True, "bidirectional": True, "merge_mode": mode},
            _bidirectional("LSTM", mode),
        )
    for kind, mode in (("GRU", "concat"), ("GRU", "sum"), ("SimpleRNN", "concat")):
        add(
            f"bidirectional_{kind.lower()}_{mode}",
            f"Bidirectional({kind}({H}, return_sequences=True), merge_mode={mode!r})",
            kind,
            {"units": H, "return_sequences": True, "bidirectional": True, "merge_mode": mode},
            _bidirectional(kind, mode),
        )
    for kinds in (["LSTM", "LSTM"], ["LSTM", "LSTM", "LSTM"], ["GRU", "GRU"], ["LSTM", "GRU"]):
        name = "stack_" + "_".join(k.lower() for k in kinds)
        add(
            name,
            " -> ".join(f"{k}({H}, return_sequences=True)" for k in kinds),
            kinds[0] if len(set(kinds)) == 1 else "mixed",
            {"units": H, "layers": kinds, "return_sequences": True},
            _stack(kinds),
        )
    add(
        "stack_lstm_lstm_last",
        f"LSTM({H}, return_sequences=True) -> LSTM({H})",
        "LSTM",
        {"units": H, "layers": ["LSTM", "LSTM"], "return_sequences": False},
        _stack(["LSTM", "LSTM"], last_sequences=False),
    )
    for kind in ("LSTM", "GRU"):
        for td in (False, True):
            dense = "TimeDistributed(Dense(4))" if td else "Dense(4)"
            add(
                f"{kind.lower()}_{'timedistributed' if td else 'dense'}",
                f"{kind}({H}, return_sequences=True) -> {dense}",
                kind,
                {"units": H, "return_sequences": True, "after": dense},
                _dense_after(kind, td),
            )
    add(
        "crnn_conv2d_bilstm",
        "Conv2D(4, 3) -> MaxPooling2D -> Permute -> Reshape((8, 24)) -> "
        f"Bidirectional(LSTM({H})) -> Dense(5, softmax)",
        "LSTM",
        {"image": [12, 16, 1], "units": H, "bidirectional": True},
        _crnn_conv2d,
        inputs={"image": ["batch", 12, 16, 1]},
        notes="a CRNN over a fixed-size image: 8 columns are the steps (no seq role)",
    )
    add(
        "crnn_conv1d_gru",
        f"Conv1D(8, 3, same) -> GRU({H}, return_sequences=True) -> Dense(3)",
        "GRU",
        {"units": H, "conv": "Conv1D(8, 3)"},
        _conv1d_gru,
    )
    add(
        "encoder_decoder_lstm",
        f"LSTM({H}, return_state=True)(source) -> LSTM({H}, return_sequences=True)"
        "(target, initial_state=[h, c]) -> Dense",
        "LSTM",
        {"units": H, "seq2seq": True},
        _encoder_decoder,
        inputs=SEQ2SEQ,
    )
    add(
        "encoder_decoder_gru",
        f"GRU({H}, return_state=True)(source) -> GRU({H}, return_sequences=True)"
        "(target, initial_state=h) -> Dense",
        "GRU",
        {"units": H, "seq2seq": True},
        _gru_encoder_decoder,
        inputs=SEQ2SEQ,
    )
    _add_variants(add)
    return specs


def _add_variants(add: Callable) -> None:
    """Options and sizes beside the layers above: a batch fixed to 1 (tf2onnx writes
    ``Reshape`` for the Transposes and squeezes the recurrent product), no bias, deeper
    stacks, the other merges and states of Bidirectional, one Loop over stacked cells."""
    one = {"x": [1, "seq", F]}
    seqs = {"units": H, "return_sequences": True}
    add(
        "lstm_batch1",
        f"LSTM({H}, return_sequences=True) at batch 1",
        "LSTM",
        {**seqs, "batch": 1},
        _single(_rnn("LSTM", return_sequences=True)),
        inputs=one,
        notes="at a fixed batch 1 tf2onnx keeps the Loop: Gemm(x_t, W, Squeeze(h @ R))",
    )
    add(
        "stack_lstm_lstm_batch1",
        f"LSTM({H}, return_sequences=True) -> LSTM({H}, return_sequences=True) at batch 1",
        "LSTM",
        {**seqs, "layers": ["LSTM", "LSTM"], "batch": 1},
        _stack(["LSTM", "LSTM"]),
        inputs=one,
    )
    add(
        "gru_batch1_step",
        f"GRU({H}, return_state=True) on one step at batch 1",
        "GRU",
        {"units": H, "return_state": True, "batch": 1, "seq": 1},
        _single(_rnn("GRU", return_state=True), seq=1),
        inputs={"x": [1, 1, F]},
        notes="a streaming model's fixed [1, 1, features] input: a Loop of one step",
    )
    for kind in ("LSTM", "GRU"):
        add(
            f"{kind.lower()}_no_bias",
            f"{kind}({H}, return_sequences=True, use_bias=False)",
            kind,
            {**seqs, "use_bias": False},
            _single(_rnn(kind, return_sequences=True, use_bias=False)),
        )
    add(
        "stack_gru_gru_gru_last",
        f"GRU({H}, return_sequences=True) x 2 -> GRU({H})",
        "GRU",
        {"units": H, "layers": ["GRU", "GRU", "GRU"], "return_sequences": False},
        _stack(["GRU", "GRU", "GRU"], last_sequences=False),
    )
    add(
        "bidirectional_gru_ave",
        f"Bidirectional(GRU({H}, return_sequences=True), merge_mode='ave')",
        "GRU",
        {**seqs, "bidirectional": True, "merge_mode": "ave"},
        _bidirectional("GRU", "ave"),
    )
    add(
        "bidirectional_lstm_state",
        f"Bidirectional(LSTM({H}, return_sequences=True, return_state=True))",
        "LSTM",
        {**seqs, "return_state": True, "bidirectional": True, "merge_mode": "concat"},
        _bidirectional("LSTM", "concat", return_state=True),
    )
    add(
        "stacked_cells_lstm",
        f"RNN([LSTMCell({H}), LSTMCell({H})], return_sequences=True)",
        "LSTM",
        {**seqs, "cells": ["LSTMCell", "LSTMCell"]},
        _stacked_cells,
        notes="StackedRNNCells: both cells in one Loop body, four carried states",
    )
    add(
        "lstm_recurrent_dropout",
        f"LSTM({H}, return_sequences=True, dropout=0.2, recurrent_dropout=0.2)",
        "LSTM",
        {**seqs, "dropout": 0.2, "recurrent_dropout": 0.2},
        _single(_rnn("LSTM", return_sequences=True, dropout=0.2, recurrent_dropout=0.2)),
        notes="at inference Keras 2 multiplies by ones_like masks (Keras 3 by nothing)",
    )
    add(
        "gru_sequences_opset18",
        f"GRU({H}, return_sequences=True), opset 18",
        "GRU",
        seqs,
        _single(_rnn("GRU", return_sequences=True)),
        opset=18,
    )


SPECS = _specs()


#: Exporter name (the folder under ``tests/data/exporters``) -> the Keras it exports:
#: Keras 3, or TensorFlow's legacy Keras 2 (``tf_keras``, what older models were written
#: with; tf2onnx leaves a Keras 2 ``GRU(reset_after=False)``'s Loop without a trip count).
KERAS = {"tf2onnx": "keras", "tf2onnx_keras2": "tf_keras"}

#: The layers exported with Keras 2 (each kind's common forms, stacks, states, a head).
KERAS2_MODELS = (
    "lstm_last",
    "lstm_sequences",
    "lstm_state",
    "gru_last",
    "gru_sequences",
    "gru_state",
    "gru_go_backwards",
    "gru_reset_before",
    "gru_reset_before_last",
    "lstm_recurrent_dropout",
    "simplernn_sequences",
    "bidirectional_lstm_concat",
    "bidirectional_gru_concat",
    "stack_lstm_lstm",
    "stack_gru_gru",
    "lstm_initial_state",
    "gru_initial_state",
    "gru_dense",
    "crnn_conv1d_gru",
    "encoder_decoder_gru",
)


def _export(name: str, spec: Spec, path: Path, package: str = "keras") -> dict:
    import importlib

    import numpy as np
    import tensorflow as tf
    import tf2onnx

    from tools.exporters.checks import check_against_source

    keras = importlib.import_module(package)
    seed = zlib.crc32(name.encode())  # stable when models are added
    keras.utils.set_random_seed(seed)
    inputs, outputs = spec.build(keras)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.3, weight.shape).astype("float32"))
    signature = tuple(
        tf.TensorSpec([None if isinstance(a, str) else a for a in _axes(axes)], tf.float32, name)
        for name, axes in spec.inputs.items()
    )

    @tf.function(input_signature=signature)
    def call(*args):
        result = model(list(args) if len(args) > 1 else args[0])
        return list(result) if isinstance(result, (list, tuple)) else [result]

    onnx_model, _ = tf2onnx.convert.from_function(call, input_signature=signature, opset=spec.opset)
    onnx_model.doc_string = ""
    path.write_bytes(onnx_model.SerializeToString())

    def source(feeds):
        return [np.asarray(t) for t in call(*(tf.constant(feeds[n]) for n in spec.inputs))]

    sizes = {"batch": BATCH, "seq": SEQ, "target_seq": SEQ - 1}
    roles = {a for axes in spec.inputs.values() for a in _axes(axes) if isinstance(a, str)}
    entry = {
        "source": f"keras.layers.{spec.source}",
        "layer": spec.layer,
        "config": {**spec.config, "opset": onnx_model.opset_import[0].version, "seed": seed},
        "inputs": spec.inputs,
        "export_sizes": {r: sizes[r] for r in sorted(roles)},
        "frozen": list(spec.frozen),
        "expect": spec.expect,
        "notes": spec.notes,
    }
    return check_against_source(path, entry, source, seed=seed)


def _axes(spec) -> list:
    return list(spec["axes"] if isinstance(spec, dict) else spec)


def _header(exporter: str) -> dict:
    from tools.exporters.manifest import versions

    keras = "tf-keras" if KERAS.get(exporter) == "tf_keras" else "keras"
    found = versions("tf2onnx", "tensorflow-cpu", keras, "onnx", "onnxruntime", "numpy")
    return {"exporter": exporter, "versions": found, "script": SCRIPT}


def _models(exporter: str) -> dict:
    if exporter not in KERAS:
        raise SystemExit(f"{SCRIPT} exports {' and '.join(KERAS)} models, not {exporter}")
    package = KERAS[exporter]
    if package == "tf_keras":  # before TensorFlow is imported: tf.keras is Keras 2 too
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    names = KERAS2_MODELS if package == "tf_keras" else tuple(SPECS)
    return {n: (lambda path, n=n: _export(n, SPECS[n], path, package)) for n in names}


if __name__ == "__main__":
    from tools.exporters.manifest import main

    sys.exit(main("tools.exporters.tf2onnx_models", _models, _header))
