"""Paddle recurrent layers exported with paddle2onnx (``paddle.onnx.export``).

    python -m tools.exporters.make paddle2onnx [--only NAME ...]

``nn.LSTM`` / ``nn.GRU`` / ``nn.SimpleRNN`` (1-2 layers, ``direction="bidirect"``,
``time_major`` both ways, initial states and ``sequence_length`` as inputs, a Linear
after) and one-step ``nn.LSTMCell`` / ``nn.GRUCell`` / ``nn.SimpleRNNCell`` calls, input
features 6, hidden 8, Paddle's own initialisers from a seed per model, checked at batch
2, seq 5; batch and seq are ``None`` in the ``InputSpec``. Exported at
``paddle.onnx.export``'s default opset (9; paddle2onnx raises it where an op needs more)
unless the model names one.

paddle2onnx then folds constants with Polygraphy and, when the folded model fails
ONNX's checker, keeps the unfolded one (its run-time weight reordering): each entry's
notes say which happened. Export errors are only logged by paddle2onnx; a missing file
is reported with the logged error. ``nn.SimpleRNN`` exports a model whose outputs name
values no node produces: kept with ``expect: "invalid"`` and ONNX Runtime's message.
Every other file is checked against the Paddle layer at every size the tests run
(:mod:`tools.exporters.checks`); where paddle2onnx computes something else (:data:`BUGS`:
the last layer's states only, ``sequence_length`` ignored), against the layer as the file
computes it, after checking that the file does differ from the layer as is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("GLOG_minloglevel", "2")

F, H, BATCH, SEQ, CLASSES = 6, 8, 2, 5, 3
SCRIPT = "tools/exporters/paddle2onnx_models.py"
LENGTHS = {"axes": ["batch"], "values": "lengths", "dtype": "int64"}


@dataclasses.dataclass(frozen=True)
class Spec:
    """One model: ``build()`` returns a Paddle layer whose ``forward`` takes the graph
    inputs in ``inputs`` order and returns a flat tuple (the graph outputs)."""

    source: str
    layer: str
    config: dict
    build: Callable[[], object]
    inputs: dict
    opset: int | None = None
    frozen: tuple[str, ...] = ()
    expect: str = "rewrite"
    notes: str = ""
    #: Keys of :data:`BUGS` the file shows.
    bugs: tuple[str, ...] = ()


# Layers --------------------------------------------------------------------------------
# paddle.jit.save needs each forward's arguments spelled out: one wrapper per signature.


def _flat(y, states) -> tuple:
    return (y, *states) if isinstance(states, (list, tuple)) else (y, states)


def _rnn_layer(kind: str, *, layers: int = 1, bidirect: bool = False, time_major=False, **kw):
    import paddle

    direction = "bidirect" if bidirect else "forward"
    cls = getattr(paddle.nn, kind)
    return cls(F, H, num_layers=layers, direction=direction, time_major=time_major, **kw)


def _wrappers():
    import paddle

    class Plain(paddle.nn.Layer):
        def __init__(self, rnn, head=None):
            super().__init__()
            self.rnn, self.head = rnn, head

        def forward(self, x):
            y, states = self.rnn(x)
            if self.head is not None:
                y = self.head(y)
            return _flat(y, states)

    class WithState(paddle.nn.Layer):
        def __init__(self, rnn):
            super().__init__()
            self.rnn = rnn

        def forward(self, x, h0):
            return _flat(*self.rnn(x, h0))

    class WithStates(paddle.nn.Layer):
        def __init__(self, rnn):
            super().__init__()
            self.rnn = rnn

        def forward(self, x, h0, c0):
            return _flat(*self.rnn(x, (h0, c0)))

    class WithLengths(paddle.nn.Layer):
        def __init__(self, rnn):
            super().__init__()
            self.rnn = rnn

        def forward(self, x, seq_len):
            return _flat(*self.rnn(x, None, seq_len))

    class Step(paddle.nn.Layer):
        def __init__(self, cell):
            super().__init__()
            self.cell = cell

        def forward(self, x, h):
            _, h = self.cell(x, h)
            return (h,)

    class LstmStep(paddle.nn.Layer):
        def __init__(self, cell):
            super().__init__()
            self.cell = cell

        def forward(self, x, h, c):
            _, (h, c) = self.cell(x, (h, c))
            return (h, c)

    return {
        "plain": Plain,
        "state": WithState,
        "states": WithStates,
        "lengths": WithLengths,
        "step": Step,
        "lstm_step": LstmStep,
    }


def _model(kind: str, wrapper: str = "plain", *, head: bool = False, **kw) -> Callable:
    def build():
        import paddle

        rnn = _rnn_layer(kind, **kw)
        if not head:
            return _wrappers()[wrapper](rnn)
        width = H * (2 if kw.get("bidirect") else 1)
        return _wrappers()[wrapper](rnn, paddle.nn.Linear(width, CLASSES))

    return build


def _step(cell: str) -> Callable:
    def build():
        import paddle

        wrapper = "lstm_step" if cell == "LSTMCell" else "step"
        return _wrappers()[wrapper](getattr(paddle.nn, cell)(F, H))

    return build


# The matrix ----------------------------------------------------------------------------

BM = {"x": ["batch", "seq", F]}
TM = {"x": ["seq", "batch", F]}
#: How paddle2onnx 2.1.0 writes each form (read from the files).
FORM_NOTES = {
    "layer": (
        "one ONNX LSTM/GRU node per layer (GRU linear_before_reset=1, default activations "
        "not written) with X = Transpose(x, perm [1, 0, 2]) when batch-major; zero states "
        "Expand([0.0], Concat([layers * directions], Unsqueeze(Reshape(Squeeze(Slice(Shape(x), "
        "batch axis)), [])), [H])) through chains of Identity, then Slice(axis 0, "
        "[l * D, (l + 1) * D]) per layer into initial_h (and initial_c); Y -> "
        "Transpose(perm [0, 2, 1, 3]) -> Reshape([0, 0, -1]) (directions into features) -> "
        "Transpose(perm [1, 0, 2]) when batch-major; Y_h/Y_c through two Identity each; "
        "opset 9 writes Slice/Squeeze/Unsqueeze axes as attributes, 17 as Constant inputs"
    ),
    "folded": "W [D, 4H or 3H, F], R, B [D, 8H or 6H] initializers already in ONNX gate order",
    "unfolded": (
        "weights as Constant nodes in Paddle's layout ([gates * H, F], LSTM i, f, c, o; GRU "
        "r, z, c) reordered every call: Identity -> Unsqueeze(axis 0) -> one-input Concat -> "
        "Slice(axis 1) per gate -> Concat(axis 1) into ONNX order (LSTM [0:H], [3H:4H], "
        "[H:3H] = i, o, f+c; GRU [H:2H], [0:H], [2H:3H] = z, r, h), B = Concat(Wb, Rb)"
    ),
    "initial_states": "initial states: graph inputs [layers * D, batch, H] sliced per layer",
    "sequence_length": "sequence_length: a graph input no node reads",
    "head": "Linear: MatMul(y, W [H, classes]) -> Add(b) -> Identity",
    "LSTMCell": (
        "no RNN node: ((MatMul(x, W^T) + b_ih) + MatMul(h, R^T)) + b_hh (W^T, R^T "
        "initializers, each Add then Identity) -> Split(axis 1) i, f, c, o -> c_t = "
        "Add(Mul(Sigmoid(f), c), Mul(Sigmoid(i), Tanh(c~))), h_t = Mul(Sigmoid(o), "
        "Tanh(c_t)); every op followed by Identity; outputs (h_t, c_t)"
    ),
    "GRUCell": (
        "no RNN node: Add(MatMul(x, W^T), b_ih) and Add(MatMul(h, R^T), b_hh), each Split "
        "into r, z, c; n = Tanh(Add(x_c, Mul(r, h_c))) (linear_before_reset=1); h_t = "
        "Add(Mul(Sub(h, n), z), n); every op followed by Identity"
    ),
    "SimpleRNNCell": (
        "no RNN node: h_t = Tanh(Add(Add(MatMul(x, W^T), b_ih), Add(MatMul(h, R^T), b_hh)))"
    ),
}
INVALID_NOTE = (
    "paddle2onnx maps Paddle's rnn op for SimpleRNN to no ONNX node: the graph outputs "
    "name values (p2o.pd_op.rnn.*) no node produces; paddle2onnx logs the checker error "
    "and writes the file anyway"
)


#: paddle2onnx bugs these files show, each checked by :func:`_as_the_file_computes`.
BUGS = {
    "last_layer_states": (
        "paddle2onnx bug: the final-state outputs are the last layer's only, [directions, "
        "batch, H], while declared (and returned by Paddle) as [layers * directions, batch, "
        "H]; checked against the layer's last-layer states"
    ),
    "ignores_lengths": (
        "paddle2onnx bug: seq_len is a graph input no node reads; the file runs every row "
        "over the whole sequence (Paddle stops each row at its length and zeroes Y after "
        "it); checked against the layer fed full lengths"
    ),
}


def _keywords(arguments: dict) -> list[str]:
    return [f"{k}={v!r}" for k, v in arguments.items()]


def _rnn_spec(kind: str, config: dict, **kw) -> Spec:
    """``paddle.nn.<kind>(F, H, **config)`` (besides the layer's own arguments, config
    may say ``initial_states``, ``sequence_length``, ``head``), batch-major unless
    ``time_major``."""
    layers = config.get("num_layers", 1)
    bidirect = config.get("direction") == "bidirect"
    arguments = {k: config[k] for k in ("num_layers", "direction", "time_major") if k in config}
    source = f"paddle.nn.{kind}({', '.join([str(F), str(H), *_keywords(arguments)])})"
    inputs = dict(TM if config.get("time_major") else BM)
    wrapper = "plain"
    if config.get("initial_states"):
        names = ("h0", "c0") if kind == "LSTM" else ("h0",)
        inputs.update({n: [layers * (1 + bidirect), "batch", H] for n in names})
        wrapper = "states" if kind == "LSTM" else "state"
        source += f"(x, {'(h0, c0)' if kind == 'LSTM' else 'h0'})"
    if config.get("sequence_length"):
        inputs["seq_len"] = LENGTHS
        wrapper = "lengths"
        source += "(x, None, sequence_length)"
    if config.get("head"):
        source += f" -> paddle.nn.Linear({H * (1 + bidirect)}, {CLASSES})"
    bugs = (("last_layer_states",) if layers > 1 else ()) + (
        ("ignores_lengths",) if config.get("sequence_length") else ()
    )
    build = _model(
        kind,
        wrapper,
        head=bool(config.get("head")),
        layers=layers,
        bidirect=bidirect,
        time_major=bool(config.get("time_major")),
    )
    layer = "RNN" if kind == "SimpleRNN" else kind
    return Spec(source, layer, config, build, inputs, bugs=bugs, **kw)


def _specs() -> dict[str, Spec]:
    specs: dict[str, Spec] = {}
    bidirect = {"direction": "bidirect"}
    for kind in ("LSTM", "GRU"):
        short = kind.lower()
        for suffix, config in (
            ("", {}),
            ("_time_major", {"time_major": True}),
            ("_2layers", {"num_layers": 2}),
            ("_bidirect", bidirect),
            ("_2layers_bidirect_time_major", {"num_layers": 2, **bidirect, "time_major": True}),
            ("_sequence_length", {"sequence_length": True}),
            ("_bidirect_sequence_length", {**bidirect, "sequence_length": True}),
            ("_linear", {"head": True}),
        ):
            specs[short + suffix] = _rnn_spec(kind, config)
        specs[f"{short}_bidirect_opset17"] = _rnn_spec(kind, bidirect, opset=17)
        specs[f"{short}_2layers_opset17"] = _rnn_spec(kind, {"num_layers": 2}, opset=17)
    specs["lstm_initial_states"] = _rnn_spec("LSTM", {"num_layers": 2, "initial_states": True})
    specs["gru_initial_state_bidirect"] = _rnn_spec(
        "GRU", {**bidirect, "time_major": True, "initial_states": True}
    )
    specs["simple_rnn"] = _rnn_spec("SimpleRNN", {}, expect="invalid", notes=INVALID_NOTE)
    specs["simple_rnn_bidirect_time_major"] = _rnn_spec(
        "SimpleRNN", {**bidirect, "time_major": True}, expect="invalid", notes=INVALID_NOTE
    )
    for name, cell, layer, states in (
        ("lstm", "LSTMCell", "LSTM", ("h", "c")),
        ("gru", "GRUCell", "GRU", ("h",)),
        ("simple_rnn", "SimpleRNNCell", "RNN", ("h",)),
    ):
        specs[f"{name}_cell_step"] = Spec(
            f"one call of paddle.nn.{cell}({F}, {H}) (streaming: the state in and out)",
            layer,
            {"step": True, "cell": cell},
            _step(cell),
            {"x": ["batch", F], **{n: ["batch", H] for n in states}},
        )
    return specs


SPECS = _specs()


def _axes(spec) -> list:
    return list(spec["axes"] if isinstance(spec, dict) else spec)


@contextlib.contextmanager
def _captured() -> Iterator[list[str]]:
    """Collect what is written to file descriptors 1 and 2 (paddle2onnx logs from C++
    and Python), then echo it to stderr."""
    lines: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            log.seek(0)
            text = log.read().decode(errors="replace")
            lines.extend(re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines())
            sys.stderr.write(text)


def _form_notes(spec: Spec, log: list[str]) -> list[str]:
    folding = _folding(log)
    if spec.config.get("step"):
        return [FORM_NOTES[spec.config["cell"]], folding]
    if spec.expect == "invalid":
        return [folding]
    keys = ["layer", "unfolded" if "failed" in folding else "folded"]
    keys += [k for k in ("initial_states", "sequence_length", "head") if spec.config.get(k)]
    return [*(FORM_NOTES[k] for k in keys), folding]


def _folding(log: list[str]) -> str:
    """What the log says Polygraphy's constant folding did."""
    for index, line in enumerate(log):
        if "Fail to fold onnx model with error" in line:
            reason = " ".join([line.split("error:", 1)[1], *log[index + 1 : index + 2]])
            reason = " ".join(reason.split())[:240]
            return f"Polygraphy's constant folding failed ({reason}): the file is unfolded"
    counts = [re.search(r"Original:\s*(\d+), After Folding:\s*(\d+)", line) for line in log]
    counts = [m for m in counts if m]
    if counts:
        return f"Polygraphy folded {counts[0][1]} -> {counts[-1][2]} nodes"
    return "no constant folding logged"


def _export(name: str, spec: Spec, path: Path) -> dict:
    import numpy as np
    import onnx
    import onnxruntime as ort
    import paddle

    from tools.exporters.checks import check_against_source
    from tools.exporters.manifest import ExportRefused

    seed = zlib.crc32(name.encode())  # stable when models are added
    paddle.seed(seed)
    layer = spec.build()
    layer.eval()
    sizes = {"batch": BATCH, "seq": SEQ}
    input_spec = [
        paddle.static.InputSpec(
            [
                None if isinstance(a, str) and a not in spec.frozen else sizes.get(a, a)
                for a in _axes(axes)
            ],
            axes.get("dtype", "float32") if isinstance(axes, dict) else "float32",
            name,
        )
        for name, axes in spec.inputs.items()
    ]
    path.unlink(missing_ok=True)
    options = {} if spec.opset is None else {"opset_version": spec.opset}
    with _captured() as log:
        paddle.onnx.export(layer, str(path.with_suffix("")), input_spec=input_spec, **options)
    if not path.exists():
        errors = [line for line in log if "ERROR" in line or "Error" in line]
        raise ExportRefused(f"paddle2onnx wrote no file: {' '.join(errors)[-500:]}")
    model = onnx.load(str(path))

    def source(feeds):
        outputs = layer(*(paddle.to_tensor(feeds[n]) for n in spec.inputs))
        return [np.asarray(o.numpy()) for o in outputs]

    roles = {a for axes in spec.inputs.values() for a in _axes(axes) if isinstance(a, str)}
    entry = {
        "source": spec.source,
        "layer": spec.layer,
        "config": {
            **spec.config,
            "input_size": F,
            "hidden_size": H,
            "opset": model.opset_import[0].version,
            "seed": seed,
        },
        "inputs": spec.inputs,
        "export_sizes": {r: sizes[r] for r in sorted(roles)},
        "frozen": list(spec.frozen),
        "expect": spec.expect,
        "notes": "; ".join(n for n in (spec.notes, *_form_notes(spec, log)) if n),
    }
    if spec.bugs:
        return _check_bugs(path, entry, source, spec, seed)
    if spec.expect == "invalid":
        try:
            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as error:
            message = " ".join(str(error).replace(str(path), path.name).split())
            return {**entry, "checked": {"invalid": message[:300]}}
        raise ExportRefused("expected an invalid model, but ONNX Runtime loads it")
    return check_against_source(path, entry, source, seed=seed)


def _as_the_file_computes(source: Callable, spec: Spec) -> Callable:
    """``source`` as the file computes it, given the paddle2onnx bugs of ``spec``."""
    import numpy as np

    directions = 2 if spec.config.get("direction") == "bidirect" else 1

    def view(feeds):
        if "ignores_lengths" in spec.bugs:
            seq = feeds["x"].shape[_axes(spec.inputs["x"]).index("seq")]
            feeds = {**feeds, "seq_len": np.full_like(feeds["seq_len"], seq)}
        outputs = source(feeds)
        if "last_layer_states" in spec.bugs:
            outputs = [outputs[0], *(s[-directions:] for s in outputs[1:])]
        return outputs

    return view


def _check_bugs(path: Path, entry: dict, source: Callable, spec: Spec, seed: int) -> dict:
    """The file differs from the layer at the export sizes (the bugs must show) and
    equals the layer as the bugs make it (:func:`_as_the_file_computes`) at every size."""
    from tools.exporters.checks import check_against_source
    from tools.exporters.manifest import ExportRefused

    try:
        check_against_source(path, entry, source, seed=seed)
    except ExportRefused as refused:
        differs = str(refused)
    else:
        raise ExportRefused(f"the file equals the layer: paddle2onnx fixed {spec.bugs}")
    checked = check_against_source(path, entry, _as_the_file_computes(source, spec), seed=seed)
    return {
        **checked,
        "notes": "; ".join([*(BUGS[b] for b in spec.bugs), entry["notes"]]),
        "checked": {
            **checked["checked"],
            "source_adjusted_for": list(spec.bugs),
            "differs_from_source": {
                **checked["checked"].get("differs_from_source", {}),
                "the layer as is": differs,
            },
        },
    }


def _header(exporter: str) -> dict:
    from tools.exporters.manifest import versions

    found = versions("paddlepaddle", "paddle2onnx", "polygraphy", "onnx", "onnxruntime", "numpy")
    return {"exporter": exporter, "versions": found, "script": SCRIPT}


def _models(exporter: str) -> dict:
    if exporter != "paddle2onnx":
        raise SystemExit(f"{SCRIPT} exports paddle2onnx models, not {exporter}")
    return {name: (lambda path, n=name: _export(n, SPECS[n], path)) for name in SPECS}


if __name__ == "__main__":
    from tools.exporters.manifest import main

    sys.exit(main("tools.exporters.paddle2onnx_models", _models, _header))
