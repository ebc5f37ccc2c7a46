"""PyTorch recurrent models exported with ``torch.onnx.export``: dynamo (``torch_dynamo``)
and TorchScript (``torch_script``).

    python -m tools.exporters.make torch_dynamo [--only NAME ...]
    python -m tools.exporters.make torch_script [--only NAME ...]

Random weights from a seed per model (PyTorch's own initialisation), input features 6,
hidden 8, exported at batch 2, seq 5, each model in a fresh process. Batch and seq are
asked dynamic (dynamo: ``Dim.DYNAMIC``, then ``Dim.AUTO`` where torch refuses it;
TorchScript: ``dynamic_axes``); an axis the export froze anyway is found by comparing the
file with the module at a larger size (:mod:`tools.exporters.checks`) and recorded in
``frozen``: dynamo declares such axes dynamic, a hazard users meet.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

F, H, BATCH, SEQ, VOCAB = 6, 8, 2, 5, 20
#: The hidden size of the streaming step files (``*_step_h64``).
STEP_H = 64
SCRIPT = "tools/exporters/torch_models.py"
EXPORTERS = ("torch_dynamo", "torch_script")


@dataclasses.dataclass(frozen=True)
class Spec:
    source: str
    layer: str
    #: () -> the module (built after the seed is set).
    build: Callable
    #: graph input name -> axes (roles or ints) or a dict with ``axes`` and ``values``.
    inputs: dict
    outputs: tuple[str, ...]
    config: dict = dataclasses.field(default_factory=dict)
    notes: str = ""
    exporters: tuple[str, ...] = EXPORTERS
    #: torch_script: ``torch.jit.script`` the module first (loops become ONNX Loops).
    script: bool = False


def _nn():
    import torch

    return torch, torch.nn


# ---- the modules ---------------------------------------------------------------------------


def _plain(cls_name: str, **kw) -> Callable:
    """``nn.LSTM``/``GRU``/``RNN`` returning every output (Y, and the states)."""

    def build():
        _torch, nn = _nn()

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(nn, cls_name)(F, H, **kw)

            def forward(self, x):
                y, state = self.rnn(x)
                return (y, *state) if isinstance(state, tuple) else (y, state)

        return Net()

    return build


def _with_state(cls_name: str, **kw) -> Callable:
    """``nn.LSTM``/``GRU``/``RNN`` with the initial states as inputs."""

    def build():
        _torch, nn = _nn()

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(nn, cls_name)(F, H, **kw)

            def forward(self, x, h0, c0=None):
                if c0 is None:
                    y, h = self.rnn(x, h0)
                    return y, h
                y, (h, c) = self.rnn(x, (h0, c0))
                return y, h, c

        return Net()

    return build


def _linear_between(cls_name: str) -> Callable:
    def build():
        torch, nn = _nn()

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.first = getattr(nn, cls_name)(F, H, batch_first=True)
                self.proj = nn.Linear(H, F)
                self.second = getattr(nn, cls_name)(F, H, batch_first=True)
                self.head = nn.Linear(H, 3)

            def forward(self, x):
                y, _ = self.first(x)
                y, _ = self.second(torch.relu(self.proj(y)))
                return self.head(y)

        return Net()

    return build


def _cell_loop(cell_name: str, scripted: bool) -> Callable:
    """A cell stepped over ``x`` (time-major), the outputs stacked: dynamo unrolls the loop,
    a ``torch.jit.script``ed one becomes an ONNX Loop."""

    def build():
        torch, nn = _nn()
        lstm = cell_name == "LSTMCell"

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.cell = getattr(nn, cell_name)(F, H)
                self.hidden = H

            def forward(self, x):
                h = torch.zeros(x.size(1), self.hidden, dtype=x.dtype)
                c = torch.zeros(x.size(1), self.hidden, dtype=x.dtype)
                outputs: list[torch.Tensor] = []
                for t in range(x.size(0)):
                    if lstm:
                        h, c = self.cell(x[t], (h, c))
                    else:
                        h = self.cell(x[t], h)
                    outputs.append(h)
                return torch.stack(outputs, 0), h

        class GruNet(Net):  # TorchScript types the loop: no tuple/tensor union
            def forward(self, x):
                h = torch.zeros(x.size(1), self.hidden, dtype=x.dtype)
                outputs: list[torch.Tensor] = []
                for t in range(x.size(0)):
                    h = self.cell(x[t], h)
                    outputs.append(h)
                return torch.stack(outputs, 0), h

        class LstmNet(Net):
            def forward(self, x):
                h = torch.zeros(x.size(1), self.hidden, dtype=x.dtype)
                c = torch.zeros(x.size(1), self.hidden, dtype=x.dtype)
                outputs: list[torch.Tensor] = []
                for t in range(x.size(0)):
                    h, c = self.cell(x[t], (h, c))
                    outputs.append(h)
                return torch.stack(outputs, 0), h

        module = (LstmNet if lstm else GruNet)() if scripted else Net()
        return torch.jit.script(module) if scripted else module

    return build


def _scripted_gru_cell_function() -> Callable:
    """A ``torch.jit.script``ed loop computing an ``nn.GRUCell``'s step from its parameters
    in plain ops (PyTorch's GRU: r, z, n; the reset gate applied after the recurrent
    projection). TorchScript exports neither a scripted ``nn.GRUCell`` call (its input-rank
    check ``dim() in (1, 2)`` has no ONNX symbolic) nor ``torch.gru_cell``."""

    def build():
        torch, nn = _nn()

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.cell = nn.GRUCell(F, H)
                self.hidden = H

            def forward(self, x):
                h = torch.zeros(x.size(1), self.hidden, dtype=x.dtype)
                outputs: list[torch.Tensor] = []
                cell = self.cell
                for t in range(x.size(0)):
                    gx = torch.nn.functional.linear(x[t], cell.weight_ih, cell.bias_ih)
                    gh = torch.nn.functional.linear(h, cell.weight_hh, cell.bias_hh)
                    xr, xz, xn = gx.chunk(3, 1)
                    hr, hz, hn = gh.chunk(3, 1)
                    r = torch.sigmoid(xr + hr)
                    z = torch.sigmoid(xz + hz)
                    n = torch.tanh(xn + r * hn)
                    h = (1 - z) * n + z * h
                    outputs.append(h)
                return torch.stack(outputs, 0), h

        return torch.jit.script(Net())

    return build


def _seq2seq_encoder() -> Callable:
    """A seq2seq encoder feeding a one-layer GRU one step per call (batch-first)."""

    def build():
        torch, nn = _nn()

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.gru = nn.GRU(F, H, batch_first=True)

            def forward(self, x):
                h = torch.zeros(1, x.size(0), H, dtype=x.dtype)
                outputs = []
                for t in range(x.size(1)):
                    y, h = self.gru(x[:, t : t + 1], h)
                    outputs.append(y)
                return torch.cat(outputs, 1), h

        return Encoder()

    return build


def _char_rnn(cls_name: str) -> Callable:
    """Embedding -> 2-layer batch-first LSTM/GRU with the states in and out -> Linear."""

    def build():
        _torch, nn = _nn()
        lstm = cls_name == "LSTM"

        class CharRnn(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(VOCAB, F)
                self.rnn = getattr(nn, cls_name)(F, H, num_layers=2, batch_first=True)
                self.head = nn.Linear(H, VOCAB)

            def forward(self, tokens, h0, c0=None):
                y, state = self.rnn(self.embed(tokens), (h0, c0) if lstm else h0)
                logits = self.head(y)
                return (logits, *state) if lstm else (logits, state)

        return CharRnn()

    return build


def _cell_step(cell_name: str, hidden: int = H) -> Callable:
    """One streaming step: the cell's state in and out as graph inputs and outputs."""

    def build():
        _torch, nn = _nn()

        class Step(nn.Module):
            def __init__(self):
                super().__init__()
                self.cell = getattr(nn, cell_name)(F, hidden)

            def forward(self, x, h, c=None):
                if c is None:
                    return self.cell(x, h)
                return self.cell(x, (h, c))

        return Step()

    return build


def _rnn_step(cls_name: str) -> Callable:
    """``nn.LSTM``/``GRU`` called on one frame (seq 1, batch-first), the state in and out."""

    def build():
        _torch, nn = _nn()

        class Step(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(nn, cls_name)(F, H, batch_first=True)
                self.head = nn.Linear(H, 2)

            def forward(self, x, h, c=None):
                if c is None:
                    y, h_out = self.rnn(x, h)
                    return self.head(y), h_out
                y, (h_out, c_out) = self.rnn(x, (h, c))
                return self.head(y), h_out, c_out

        return Step()

    return build


def _enhancer() -> Callable:
    """A streaming enhancer: two GRU cells whose states travel as one ``cache`` tensor."""

    def build():
        torch, nn = _nn()

        class Enhancer(nn.Module):
            def __init__(self):
                super().__init__()
                self.encode = nn.Linear(F, H)
                self.gru1 = nn.GRUCell(H, H)
                self.gru2 = nn.GRUCell(H, H)
                self.mask = nn.Linear(H, F)

            def forward(self, frame, cache_in):
                h1, h2 = cache_in.chunk(2, dim=-1)
                h1 = self.gru1(torch.relu(self.encode(frame)), h1)
                h2 = self.gru2(h1, h2)
                gain = torch.sigmoid(self.mask(h2))
                return frame * gain, torch.cat([h1, h2], dim=-1)

        return Enhancer()

    return build


def _vad_decoder() -> Callable:
    """A VAD decoder's LSTM step written as plain ops: one Linear over ``[x, h]``, chunk(4),
    sigmoid x3 and tanh x2 (PyTorch's gate order i, f, g, o)."""

    def build():
        torch, nn = _nn()

        class Decoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.gates = nn.Linear(F + H, 4 * H)
                self.out = nn.Linear(H, 1)

            def forward(self, x, h, c):
                i, f, g, o = self.gates(torch.cat([x, h], dim=-1)).chunk(4, dim=-1)
                c_out = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h_out = torch.sigmoid(o) * torch.tanh(c_out)
                return torch.sigmoid(self.out(h_out)), h_out, c_out

        return Decoder()

    return build


# ---- the matrix ----------------------------------------------------------------------------

TM = {"x": ["seq", "batch", F]}  # time-major
BF = {"x": ["batch", "seq", F]}  # batch-first


def _specs() -> dict[str, Spec]:
    specs: dict[str, Spec] = {}

    def add(name: str, spec: Spec) -> None:
        specs[name] = spec

    for nonlinearity in ("tanh", "relu"):
        add(
            f"rnn_{nonlinearity}",
            Spec(
                f"nn.RNN({F}, {H}, nonlinearity={nonlinearity!r})",
                "RNN",
                _plain("RNN", nonlinearity=nonlinearity),
                TM,
                ("y", "h_n"),
                {"nonlinearity": nonlinearity},
            ),
        )
        add(
            f"rnn_{nonlinearity}_bidirectional_batch_first",
            Spec(
                f"nn.RNN({F}, {H}, nonlinearity={nonlinearity!r}, bidirectional=True, "
                "batch_first=True)",
                "RNN",
                _plain("RNN", nonlinearity=nonlinearity, bidirectional=True, batch_first=True),
                BF,
                ("y", "h_n"),
                {"nonlinearity": nonlinearity, "bidirectional": True, "batch_first": True},
            ),
        )
    add(
        "rnn_relu_2layer",
        Spec(
            f"nn.RNN({F}, {H}, nonlinearity='relu', num_layers=2)",
            "RNN",
            _plain("RNN", nonlinearity="relu", num_layers=2),
            TM,
            ("y", "h_n"),
            {"nonlinearity": "relu", "num_layers": 2},
        ),
    )
    for cell in ("LSTMCell", "GRUCell"):
        low = cell.lower()
        add(
            f"{low}_loop",
            Spec(
                f"nn.{cell}({F}, {H}) stepped over x[t] in Python, outputs stacked",
                cell[:-4],
                _cell_loop(cell, scripted=False),
                TM,
                ("y", "h_n"),
                {"cell": cell, "loop": "python"},
                notes="dynamo and TorchScript trace the loop: one cell per traced step",
            ),
        )
        add(
            f"{low}_scripted_loop",
            Spec(
                f"torch.jit.script(a module stepping nn.{cell}({F}, {H}) over x.size(0))",
                cell[:-4],
                _cell_loop(cell, scripted=True),
                TM,
                ("y", "h_n"),
                {"cell": cell, "loop": "torch.jit.script"},
                notes="an ONNX Loop collecting the steps with SequenceInsert/ConcatFromSequence",
                exporters=("torch_script",),
                script=True,
            ),
        )
        if cell == "GRUCell":
            add(
                "grucell_plain_scripted_loop",
                Spec(
                    f"torch.jit.script(a module stepping nn.GRUCell({F}, {H})'s math in plain "
                    "ops (linear, chunk, sigmoid, tanh) over x.size(0))",
                    "GRU",
                    _scripted_gru_cell_function(),
                    TM,
                    ("y", "h_n"),
                    {"cell": "plain ops", "loop": "torch.jit.script"},
                    notes="the scripted nn.GRUCell loop does not export (see failed), nor does "
                    "torch.gru_cell: a cell in plain ops in an ONNX Loop collecting with "
                    "SequenceInsert/ConcatFromSequence",
                    exporters=("torch_script",),
                    script=True,
                ),
            )
        states = {"x": ["batch", F], "h": ["batch", H]}
        if cell == "LSTMCell":
            states["c"] = ["batch", H]
        add(
            f"{low}_step",
            Spec(
                f"nn.{cell}({F}, {H}) one step, the state in and out",
                cell[:-4],
                _cell_step(cell),
                states,
                ("h_out", "c_out") if cell == "LSTMCell" else ("h_out",),
                {"cell": cell, "streaming": True},
            ),
        )
    for cell in ("LSTMCell", "GRUCell", "RNNCell"):
        # streaming steps at a hidden size real ones use (issue 42), still small files
        states = {"x": ["batch", F], "h": ["batch", STEP_H]}
        if cell == "LSTMCell":
            states["c"] = ["batch", STEP_H]
        add(
            f"{cell.lower()}_step_h{STEP_H}",
            Spec(
                f"nn.{cell}({F}, {STEP_H}) one step, the state in and out",
                cell[:-4],
                _cell_step(cell, STEP_H),
                states,
                ("h_out", "c_out") if cell == "LSTMCell" else ("h_out",),
                {"cell": cell, "streaming": True, "hidden": STEP_H},
            ),
        )
    add(
        "gru_seq2seq_encoder_steps",
        Spec(
            f"nn.GRU({F}, {H}, batch_first=True) called once per step on x[:, t:t+1]",
            "GRU",
            _seq2seq_encoder(),
            BF,
            ("y", "h_n"),
            {"num_layers": 1, "batch_first": True, "calls": "one per step"},
            notes="a chain of seq-1 GRU nodes, each reading one step of x",
        ),
    )
    for cls_name in ("LSTM", "GRU"):
        low = cls_name.lower()
        add(
            f"{low}_linear_between",
            Spec(
                f"nn.{cls_name}(batch_first) -> Linear -> ReLU -> nn.{cls_name} -> Linear",
                cls_name,
                _linear_between(cls_name),
                BF,
                ("y",),
                {"batch_first": True, "between": "Linear+ReLU"},
                notes="the Linear's run-time Reshape glue between the layers",
            ),
        )
        state_axes = [2, "batch", H]
        char_inputs: dict = {
            "tokens": {"axes": ["batch", "seq"], "values": {"low": 0, "high": VOCAB}},
            "h0": state_axes,
        }
        if cls_name == "LSTM":
            char_inputs["c0"] = state_axes
        add(
            f"char_rnn_{low}",
            Spec(
                f"Embedding({VOCAB}, {F}) -> nn.{cls_name}({F}, {H}, num_layers=2, "
                f"batch_first=True)(x, state) -> Linear({H}, {VOCAB})",
                cls_name,
                _char_rnn(cls_name),
                char_inputs,
                ("logits", "h_n", "c_n") if cls_name == "LSTM" else ("logits", "h_n"),
                {"num_layers": 2, "batch_first": True, "vocab": VOCAB},
                notes="per-layer initial states sliced from one [2, batch, H] input",
            ),
        )
        step_inputs = {"x": ["batch", 1, F], "h": [1, "batch", H]}
        if cls_name == "LSTM":
            step_inputs["c"] = [1, "batch", H]
        add(
            f"{low}_step",
            Spec(
                f"nn.{cls_name}({F}, {H}, batch_first=True) on one frame, the state in and "
                "out -> Linear",
                cls_name,
                _rnn_step(cls_name),
                step_inputs,
                ("y", "h_out", "c_out") if cls_name == "LSTM" else ("y", "h_out"),
                {"batch_first": True, "seq": 1, "streaming": True},
            ),
        )
    controls = [
        ("lstm_2layer", "LSTM", {"num_layers": 2}, TM),
        (
            "lstm_bidirectional_batch_first",
            "LSTM",
            {"bidirectional": True, "batch_first": True},
            BF,
        ),
        ("gru_2layer_batch_first", "GRU", {"num_layers": 2, "batch_first": True}, BF),
        ("gru_bidirectional_2layer", "GRU", {"bidirectional": True, "num_layers": 2}, TM),
    ]
    for name, cls_name, kw, inputs in controls:
        args = ", ".join(f"{k}={v}" for k, v in kw.items())
        outputs = ("y", "h_n", "c_n") if cls_name == "LSTM" else ("y", "h_n")
        add(
            name,
            Spec(
                f"nn.{cls_name}({F}, {H}, {args})",
                cls_name,
                _plain(cls_name, **kw),
                inputs,
                outputs,
                kw,
                notes="a control: a form the package already rewrites",
            ),
        )
    for cls_name in ("LSTM", "GRU"):
        h0 = [2, "batch", H]
        inputs = {**BF, "h0": h0, **({"c0": h0} if cls_name == "LSTM" else {})}
        add(
            f"{cls_name.lower()}_bidirectional_h0",
            Spec(
                f"nn.{cls_name}({F}, {H}, bidirectional=True, batch_first=True)(x, h0)",
                cls_name,
                _with_state(cls_name, bidirectional=True, batch_first=True),
                inputs,
                ("y", "h_n", "c_n") if cls_name == "LSTM" else ("y", "h_n"),
                {"bidirectional": True, "batch_first": True, "initial_state": "inputs"},
                notes="a control: a form the package already rewrites",
            ),
        )
    add(
        "streaming_enhancer_cache",
        Spec(
            "Linear -> GRUCell -> GRUCell -> Linear -> sigmoid mask; both states in one "
            "cache tensor (chunk in, cat out)",
            "GRU",
            _enhancer(),
            {"frame": ["batch", F], "cache_in": ["batch", 2 * H]},
            ("enhanced", "cache_out"),
            {"cells": 2, "streaming": True, "cache": "concatenated"},
        ),
    )
    add(
        "vad_decoder_plain_lstm_step",
        Spec(
            "Linear(cat[x, h]) -> chunk(4) -> sigmoid x3, tanh x2 (an LSTM step as plain "
            "ops) -> Linear -> sigmoid; (h, c) in and out",
            "LSTM",
            _vad_decoder(),
            {"x": ["batch", F], "h": ["batch", H], "c": ["batch", H]},
            ("prob", "h_out", "c_out"),
            {"streaming": True, "cell": "plain ops", "gate_order": "ifgo"},
        ),
    )
    return specs


SPECS = _specs()


# ---- export --------------------------------------------------------------------------------


def _axes(spec) -> list:
    return list(spec["axes"] if isinstance(spec, dict) else spec)


def _example(spec: Spec, sizes: dict[str, int], seed: int) -> tuple:
    import torch

    generator = torch.Generator().manual_seed(seed)
    args = []
    for axes_spec in spec.inputs.values():
        shape = [sizes[a] if isinstance(a, str) else a for a in _axes(axes_spec)]
        values = axes_spec.get("values") if isinstance(axes_spec, dict) else None
        if isinstance(values, dict):
            args.append(torch.randint(values["low"], values["high"], shape, generator=generator))
        else:
            args.append(torch.randn(shape, generator=generator))
    return tuple(args)


def _dynamo(module, args, spec: Spec, path: Path) -> str:
    """Export with every role axis ``Dim.DYNAMIC``, else ``Dim.AUTO``; returns which."""
    import torch
    from torch.export import Dim

    def shapes(dim):
        return tuple(
            {i: dim for i, a in enumerate(_axes(axes)) if isinstance(a, str)}
            for axes in spec.inputs.values()
        )

    common = dict(
        dynamo=True,
        input_names=list(spec.inputs),
        output_names=list(spec.outputs),
        external_data=False,
    )
    try:
        torch.onnx.export(module, args, str(path), dynamic_shapes=shapes(Dim.DYNAMIC), **common)
        return "Dim.DYNAMIC"
    except Exception as error:
        refused = _reason(error)
    torch.onnx.export(module, args, str(path), dynamic_shapes=shapes(Dim.AUTO), **common)
    return f"Dim.AUTO (Dim.DYNAMIC refused: {refused})"


def _reason(error: BaseException) -> str:
    """The torch.export error's own message (the ONNX wrapper's is generic), one line."""
    cause = error.__cause__ or error
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(cause))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[:3])[:400]


#: Node metadata dropped from dynamo's files: stack traces and FX text name local paths
#: (not reproducible elsewhere) and make up most of a small file.
_DROPPED_METADATA = ("pkg.torch.onnx.stack_trace", "pkg.torch.onnx.fx_node")


def _strip_metadata(path: Path) -> None:
    import onnx

    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    while nodes:
        node = nodes.pop()
        kept = [p for p in node.metadata_props if p.key not in _DROPPED_METADATA]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
        for attr in node.attribute:
            nodes.extend(attr.g.node)
            for graph in attr.graphs:
                nodes.extend(graph.node)
    onnx.save(model, str(path))


def _torchscript(module, args, spec: Spec, path: Path) -> str:
    import torch

    dynamic_axes = {
        name: {i: a for i, a in enumerate(_axes(axes)) if isinstance(a, str)}
        for name, axes in spec.inputs.items()
    }
    torch.onnx.export(
        module,
        args,
        str(path),
        dynamo=False,
        input_names=list(spec.inputs),
        output_names=list(spec.outputs),
        dynamic_axes={k: v for k, v in dynamic_axes.items() if v},
    )
    return "dynamic_axes"


def _export(exporter: str, name: str, path: Path) -> dict:
    import numpy as np
    import onnx
    import torch

    from tools.exporters.checks import check_against_source

    spec = SPECS[name]
    seed = zlib.crc32(name.encode())
    torch.manual_seed(seed)
    module = spec.build().eval()
    sizes = {"batch": BATCH, "seq": SEQ}
    args = _example(spec, sizes, seed)
    with torch.no_grad():
        how = (_dynamo if exporter == "torch_dynamo" else _torchscript)(module, args, spec, path)
    _strip_metadata(path)
    model = onnx.load(str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))

    def source(feeds):
        tensors = [torch.from_numpy(np.asarray(feeds[n])) for n in spec.inputs]
        with torch.no_grad():
            result = module(*tensors)
        result = result if isinstance(result, tuple) else (result,)
        return [r.numpy() for r in result]

    roles = {a for axes in spec.inputs.values() for a in _axes(axes) if isinstance(a, str)}
    entry = {
        "source": spec.source,
        "layer": spec.layer,
        "config": {**spec.config, "opset": opset, "dynamic": how, "seed": seed},
        "inputs": spec.inputs,
        "export_sizes": {r: sizes[r] for r in sorted(roles)},
        "frozen": [],
        "expect": "rewrite",
        "notes": spec.notes,
    }
    return check_against_source(path, entry, source, seed=seed)


def _header(exporter: str) -> dict:
    from tools.exporters.manifest import versions

    found = versions("torch", "onnxscript", "onnx", "onnx-ir", "onnxruntime", "numpy")
    return {"exporter": exporter, "versions": found, "script": SCRIPT}


def _models(exporter: str) -> dict:
    if exporter not in EXPORTERS:
        raise SystemExit(f"{SCRIPT} exports {' and '.join(EXPORTERS)}, not {exporter}")
    return {
        name: (lambda path, n=name: _export(exporter, n, path))
        for name, spec in SPECS.items()
        if exporter in spec.exporters
    }


if __name__ == "__main__":
    from tools.exporters.manifest import main

    sys.exit(main("tools.exporters.torch_models", _models, _header))
