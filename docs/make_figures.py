"""Generate docs/figures: each rule family's before/after graph, from the test builders.

Every figure is a small model from :mod:`rnn_rewrite_rules.testing` (torchlib's export
or another exporter's shape) rewritten by exactly one rule family with
``rnn_rewrite_rules.rewrite(model, [family])``. The picture shows the region the rule
changed: red nodes are removed, green nodes are new, white nodes are unchanged
neighbours (blue: unchanged RNN nodes). Constant inputs are written inside the node
(``shape=[0, 0, 6]``, ``W 1x16x4``), ``⋯`` marks a value that comes from or goes to
a node outside the picture, and a dashed ``unused`` edge an RNN output nobody reads.

    python docs/make_figures.py          # write docs/figures/*.dot and render *.svg with dot
    python docs/make_figures.py --check  # exit 1 if a committed .dot is stale (no dot needed)

``tox -e docs`` runs the first; ``tests/test_figures.py`` runs the second's comparison,
so a rule change that alters a picture fails the tests until the figures are regenerated.
Only the ``.dot`` text is compared: it is deterministic; the SVG depends on the graphviz
version that rendered it.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import pathlib
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir

import rnn_rewrite_rules
from rnn_rewrite_rules import costs
from rnn_rewrite_rules.rules import families
from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model, thirdparty
from rnn_rewrite_rules.testing.exporters import ExporterSpec, build_exporter_model
from rnn_rewrite_rules.testing.loops import LoopSpec, build_loop_model
from rnn_rewrite_rules.testing.one_step import StepConfig, build_step
from rnn_rewrite_rules.testing.unrolled import (
    UnrolledCellConfig,
    UnrolledRnnConfig,
    build_unrolled_cell,
    build_unrolled_rnn,
)

FIGURES_DIR = pathlib.Path(__file__).resolve().parent / "figures"

_RNN_OPS = frozenset({"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"})
#: The attributes shown on RNN nodes (the others do not change the graph's shape).
_RNN_ATTRIBUTES = ("hidden_size", "direction", "layout")
_SCHEMA_NAMES = {
    "LSTM": (
        ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
        ("Y", "Y_h", "Y_c"),
    ),
    "GRU": (("X", "W", "R", "B", "sequence_lens", "initial_h"), ("Y", "Y_h")),
    "RNN": (("X", "W", "R", "B", "sequence_lens", "initial_h"), ("Y", "Y_h")),
}
_MAX_VARIADIC = 64
_STUB = 'shape=plaintext, style=""'
_REMOVED, _ADDED, _KEPT, _KEPT_RNN = "#f6c9c4", "#c8ebc4", "#ffffff", "#d9e6f7"


@dataclasses.dataclass(frozen=True)
class Figure:
    """One picture: a model from a builder, rewritten by one family."""

    name: str
    family: str
    title: str
    build: Callable[[], onnx.ModelProto]
    #: The rewrite target; the portable default never emits ``RNN`` (rten has none).
    target: str | None = None


FIGURES: tuple[Figure, ...] = (
    Figure(
        "weight_folding_torchlib",
        "weight_folding",
        "torchlib LSTM(4, 3), weights above the exporter's fold limit",
        lambda: build_torchlib_model(
            RnnConfig(input_size=4, hidden_size=3, initial_states=True, fold_limit=0)
        ),
    ),
    Figure(
        "initial_state_torchlib",
        "initial_state",
        "torchlib 2-layer LSTM without h0/c0",
        lambda: build_torchlib_model(RnnConfig(input_size=4, hidden_size=3, num_layers=2)),
    ),
    Figure(
        "initial_state_torchscript",
        "initial_state",
        "TorchScript (dynamo=False) GRU without h0",
        lambda: build_exporter_model(
            ExporterSpec(
                op_type="GRU", style="torchscript", initial_state="constant_of_shape", opset=14
            )
        ),
    ),
    Figure(
        "layer_output_torchlib",
        "layer_output",
        "torchlib 1-layer LSTM, unidirectional",
        lambda: build_torchlib_model(RnnConfig(input_size=4, hidden_size=3, initial_states=True)),
    ),
    Figure(
        "layer_output_torchlib_bidirectional",
        "layer_output",
        "torchlib 1-layer GRU, bidirectional",
        lambda: build_torchlib_model(
            RnnConfig(
                op_type="GRU", input_size=4, hidden_size=3, bidirectional=True, initial_states=True
            )
        ),
    ),
    Figure(
        "layer_output_tf2onnx_directions",
        "layer_output",
        "tf2onnx (keras) Bidirectional LSTM: Y and Y_h read per direction",
        lambda: thirdparty.tf2onnx_bidirectional("LSTM", hidden=3),
    ),
    Figure(
        "layer_glue_tf2onnx",
        "layer_glue",
        "tf2onnx (keras) 2-layer LSTM",
        lambda: build_exporter_model(ExporterSpec(style="tf2onnx", num_layers=2, outputs=("y",))),
    ),
    Figure(
        "layer_glue_torchscript",
        "layer_glue",
        "TorchScript batch_first bidirectional LSTM",
        lambda: build_exporter_model(
            ExporterSpec(direction="bidirectional", batch_first=True, outputs=("y",))
        ),
    ),
    Figure(
        "initial_state_paddle",
        "initial_state",
        "Paddle2ONNX 2-layer bidirectional LSTM: Tile, Transpose, per-layer Slices",
        lambda: thirdparty.paddle_states("LSTM", num_layers=2, hidden=3),
    ),
    Figure(
        "bidirectional_hand_built",
        "bidirectional",
        "hand-built bidirectional GRU: two forward GRUs, Slice reversals, Concat",
        lambda: thirdparty.hand_built_bidirectional("GRU", hidden=3),
    ),
    Figure(
        "fold_if_rank_checks",
        "fold_if",
        "rank checks in If around a GRU (torch's unbatched-input support)",
        lambda: thirdparty.rank_checks("GRU", hidden=3),
    ),
    Figure(
        "unused_outputs_torchscript",
        "unused_outputs",
        "TorchScript LSTM whose h_n and c_n are discarded",
        lambda: build_exporter_model(ExporterSpec(outputs=("y",))),
    ),
    Figure(
        "layout_plain",
        "layout",
        "hand-written batch-first LSTM with layout=1",
        lambda: build_exporter_model(
            ExporterSpec(style="plain", layout=1, batch_first=True, outputs=("y", "h"))
        ),
    ),
    Figure(
        "reroll_torch_dynamo",
        "reroll",
        "torch dynamo nn.RNN(4, 3), 3 steps, unrolled",
        lambda: build_unrolled_rnn(UnrolledRnnConfig(input_size=4, hidden_size=3, seq=3)),
        target="onnxruntime",
    ),
    Figure(
        "reroll_gru_cell",
        "reroll",
        "torch dynamo loop over nn.GRUCell(4, 3), 2 steps",
        lambda: build_unrolled_cell(
            UnrolledCellConfig(op_type="GRU", input_size=4, hidden_size=3, seq=2)
        ),
    ),
    Figure(
        "one_step_lstm_cell",
        "one_step",
        "torch dynamo nn.LSTMCell(4, 3) called once, (h, c) in and out, batch 1",
        lambda: build_step(StepConfig(op_type="LSTM", input_size=4, hidden_size=3, batch=1)),
    ),
    Figure(
        "loop_scan_keras_backward",
        "loop_scan",
        "tf2onnx Keras LSTM(3, go_backwards): a Loop between ReverseSequences",
        lambda: build_loop_model(
            LoopSpec(input_size=4, hidden_size=3, steps=5, direction="reverse")
        ),
    ),
)


def available_figures() -> list[Figure]:
    """The figures whose family exists (a family still being written has none yet)."""
    present = families()
    return [figure for figure in FIGURES if figure.family in present]


# ------------------------------------------------------------------------ graph reading


def _const_array(value: ir.Value) -> np.ndarray | None:
    if value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def _format_array(array: np.ndarray) -> str:
    if array.size <= 8:
        values = array.tolist()
        if array.dtype.kind == "f":
            values = np.round(array, 4).tolist()
        return str(values).replace(" ", "") if array.ndim else str(values)
    kind = {"f": "f", "i": "i", "u": "u", "b": "bool"}.get(array.dtype.kind, array.dtype.kind)
    bits = "" if kind == "bool" else str(array.dtype.itemsize * 8)
    return f"{kind}{bits}[" + "x".join(str(d) for d in array.shape) + "]"


def _format_attribute(attr: ir.Attr) -> str | None:
    value = attr.value
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, ir.TensorProtocol):
        return _format_array(value.numpy())
    return None  # graphs and the like


def _input_names(node: ir.Node) -> tuple[str, ...]:
    if node.op_type in _SCHEMA_NAMES:
        return _SCHEMA_NAMES[node.op_type][0]
    try:
        schema = onnx.defs.get_schema(node.op_type, 21, node.domain)
    except onnx.defs.SchemaError:
        return ()
    names = [formal.name for formal in schema.inputs]
    if names and schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        last = names.pop()  # Concat's inputs[0], inputs[1], ...
        names += [f"{last}[{i}]" for i in range(_MAX_VARIADIC)]
    return tuple(names)


def _output_name(node: ir.Node, index: int) -> str:
    names = _SCHEMA_NAMES.get(node.op_type, ((), ("Y", "Y_h", "Y_c")))[1]
    return names[index] if node.op_type in _RNN_OPS and index < len(names) else ""


def _is_constant_node(node: ir.Node) -> bool:
    return node.domain == "" and node.op_type == "Constant"


def _label(node: ir.Node) -> str:
    """An HTML-like graphviz label: op type, shown attributes, constant inputs."""
    lines = []
    rnn = node.op_type in _RNN_OPS
    for name, attr in node.attributes.items():
        if rnn and name not in _RNN_ATTRIBUTES:
            continue
        text = _format_attribute(attr)
        if text is not None:
            lines.append(f"{name}={text}")
    names = _input_names(node)
    for index, value in enumerate(node.inputs):
        if value is None:
            continue
        array = _const_array(value)
        if array is None:
            continue
        name = names[index] if index < len(names) else f"in{index}"
        lines.append(f"{name}={_format_array(array)}")
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    rows = [f"<b>{html.escape(op)}</b>"]
    if lines:
        small = "<br/>".join(html.escape(line) for line in lines)
        rows.append(f'<font point-size="8">{small}</font>')
    return "<" + "<br/>".join(rows) + ">"


def _plain(text: str) -> str:
    """A quoted-string graphviz label: escape quotes, keep line breaks."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _dims(value: ir.Value) -> str:
    if value.shape is None:
        return ""
    return "[" + ", ".join(str(d) for d in value.shape) + "]"


@dataclasses.dataclass
class _Side:
    graph: ir.Graph
    nodes: list[ir.Node]  # the region, in graph order
    colour: dict[int, str]  # id(node) -> fill colour


def _signature(node: ir.Node) -> tuple:
    """A node is the same node after the rewrite when this is equal: a rewritten node keeps
    its name, so inputs and attributes tell; outputs only count where they are used (the
    cleanup drops trailing unused RNN outputs whatever the family)."""
    inputs = tuple(None if v is None else v.name for v in node.inputs)
    attributes = tuple(sorted((k, str(v)) for k, v in node.attributes.items()))
    used = tuple(i for i, v in enumerate(node.outputs) if v.uses() or v.is_graph_output())
    return (node.name, node.op_type, inputs, attributes, used)


def _regions(before: ir.Model, after: ir.Model) -> tuple[_Side, _Side]:
    """Removed/added nodes, plus the unchanged nodes next to them and unchanged RNNs."""
    before_nodes = [n for n in before.graph if not _is_constant_node(n)]
    after_nodes = [n for n in after.graph if not _is_constant_node(n)]
    before_names = {n.name for n in before_nodes}
    after_names = {n.name for n in after_nodes}
    before_keys = {_signature(n) for n in before_nodes}
    after_keys = {_signature(n) for n in after_nodes}
    removed = [n for n in before_nodes if _signature(n) not in after_keys]
    added = [n for n in after_nodes if _signature(n) not in before_keys]

    def neighbours(nodes: list[ir.Node]) -> set[str]:
        names = set()
        for node in nodes:
            for value in node.inputs:
                if value is not None and value.producer() is not None:
                    names.add(value.producer().name)
            for value in node.outputs:
                names.update(use.node.name for use in value.uses())
        return names

    context = (neighbours(removed) | neighbours(added)) & before_names & after_names
    context |= {n.name for n in before_nodes if n.op_type in _RNN_OPS} & after_names

    def side(model: ir.Model, nodes: list[ir.Node], changed: list[ir.Node], fill: str) -> _Side:
        changed_ids = {id(n) for n in changed}
        region = [n for n in nodes if id(n) in changed_ids or n.name in context]
        colour = {}
        for node in region:
            if id(node) in changed_ids:
                colour[id(node)] = fill
            else:
                colour[id(node)] = _KEPT_RNN if node.op_type in _RNN_OPS else _KEPT
        return _Side(model.graph, region, colour)

    return side(before, before_nodes, removed, _REMOVED), side(after, after_nodes, added, _ADDED)


def _cluster(side: _Side, prefix: str, title: str) -> list[str]:
    """The dot statements of one side; ids are positional, so the text is deterministic."""
    ids = {id(node): f"{prefix}{i}" for i, node in enumerate(side.nodes)}
    lines = [f"  subgraph cluster_{prefix} {{", f'    label="{title}";']
    edges: list[str] = []
    extra: list[str] = []
    counter = 0

    def stub(label: str, style: str) -> str:
        nonlocal counter
        name = f"{prefix}x{counter}"
        counter += 1
        extra.append(f'    {name} [label="{label}", {style}];')
        return name

    inputs: dict[str, str] = {}
    outputs: dict[str, str] = {}
    graph_inputs = {v.name for v in side.graph.inputs}
    for node in side.nodes:
        lines.append(
            f'    {ids[id(node)]} [label={_label(node)}, fillcolor="{side.colour[id(node)]}"];'
        )
    for node in side.nodes:
        target = ids[id(node)]
        names = _input_names(node)
        for index, value in enumerate(node.inputs):
            if value is None or _const_array(value) is not None:
                continue
            label = names[index] if node.op_type in _RNN_OPS and index < len(names) else ""
            producer = value.producer()
            if producer is not None and id(producer) in ids:
                out_label = _output_name(producer, producer.outputs.index(value))
                source = ids[id(producer)]
                label = out_label or label
            elif value.name in graph_inputs:
                if value.name not in inputs:
                    inputs[value.name] = stub(
                        _plain(f"{value.name}\n{_dims(value)}".strip()),
                        'shape=ellipse, fillcolor="#eeeeee"',
                    )
                source = inputs[value.name]
            else:
                source = stub("⋯", _STUB)
            attrs = f' [label="{label}"]' if label else ""
            edges.append(f"    {source} -> {target}{attrs};")
        for index, value in enumerate(node.outputs):
            if not value.name:
                continue
            label = _output_name(node, index)
            attrs = f' [label="{label}"]' if label else ""
            if value.is_graph_output():
                outputs[value.name] = stub(
                    _plain(f"{value.name}\n{_dims(value)}".strip()),
                    'shape=ellipse, fillcolor="#eeeeee"',
                )
                edges.append(f"    {target} -> {outputs[value.name]}{attrs};")
            readers = {id(use.node): use.node for use in value.uses()}
            outside = [r for key, r in readers.items() if key not in ids]
            if outside:
                edges.append(f"    {target} -> {stub('⋯', _STUB)}{attrs};")
            if not readers and not value.is_graph_output() and node.op_type in _RNN_OPS:
                unused = stub("unused", 'shape=plaintext, style="", fontcolor="#888888"')
                edges.append(f'    {target} -> {unused} [label="{label}", style=dashed];')
    return [*lines, *extra, *edges, "  }"]


def render(figure: Figure) -> str:
    """The .dot text of ``figure`` (pure: builds, rewrites, formats)."""
    proto = figure.build()
    for index, node in enumerate(proto.graph.node):
        node.name = f"fig_{index}"  # names tell unchanged nodes from new ones
    before = ir.serde.deserialize_model(proto)
    # a figure shows what a rule emits, not where the table lets it
    ignored = costs.Context(ignore=True)
    rewritten = rnn_rewrite_rules.rewrite(
        proto, [figure.family], target=figure.target, context=ignored
    )
    after = ir.serde.deserialize_model(rewritten)
    left, right = _regions(before, after)
    if left.nodes == [] and right.nodes == []:
        raise AssertionError(f"{figure.name}: the {figure.family} rules changed nothing")
    header = [
        f"// {figure.name}: {figure.title}; rnn_rewrite_rules.rewrite(model, [{figure.family!r}]"
        + (f", target={figure.target!r})" if figure.target else ")"),
        "// generated by docs/make_figures.py: do not edit",
        f"digraph {figure.name} {{",
        f'  label="{figure.family}: {figure.title}";',
        "  labelloc=t; fontname=Helvetica; fontsize=11; nodesep=0.25; ranksep=0.3;",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=10,'
        ' margin="0.08,0.03"];',
        "  edge [fontname=Helvetica, fontsize=8, arrowsize=0.6];",
    ]
    return "\n".join(
        [
            *header,
            *_cluster(left, "b", f"before: {len(left.graph)} nodes in the model"),
            *_cluster(right, "a", f"after: {len(right.graph)} nodes in the model"),
            "}",
            "",
        ]
    )


def render_all() -> dict[str, str]:
    """File name -> .dot text for every available figure."""
    return {f"{figure.name}.dot": render(figure) for figure in available_figures()}


def stale(directory: pathlib.Path = FIGURES_DIR) -> list[str]:
    """The .dot files missing, different or left over in ``directory``."""
    wanted = render_all()
    problems = [
        name
        for name, text in wanted.items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]
    known = {f"{figure.name}.dot" for figure in FIGURES}
    problems += sorted(
        path.name
        for path in directory.glob("*.dot")
        if path.name not in wanted and path.name not in known
    )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale .dot files")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
        for name in problems:
            print(f"stale: docs/figures/{name}")
        return 1 if problems else 0
    FIGURES_DIR.mkdir(exist_ok=True)
    for name, text in render_all().items():
        dot = FIGURES_DIR / name
        dot.write_text(text)
        svg = dot.with_suffix(".svg")
        subprocess.run(["dot", "-Tsvg", str(dot), "-o", str(svg)], check=True)
        print(f"wrote {dot.relative_to(FIGURES_DIR.parent.parent)} and {svg.name}")
    missing = sorted({f.family for f in FIGURES} - set(families()))
    if missing:
        print(f"no figures yet for families not available: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
