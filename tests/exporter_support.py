"""Helpers for tests over :mod:`rnn_rewrite_rules.testing.exporters` models."""

from __future__ import annotations

import collections
import dataclasses
import functools
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

import rnn_rewrite_rules
from rnn_rewrite_rules import RewriteOptions, runtime
from rnn_rewrite_rules.rules.initial_state import explicit_zero_form
from rnn_rewrite_rules.rules.loop_scan import EXACT_BRANCH
from rnn_rewrite_rules.shape import ShapeProver
from rnn_rewrite_rules.testing.exporters import ExporterSpec, exporter_inputs
from tests.support import apply

#: (batch, seq): several, pairwise different, so an axis frozen at one size shows.
SIZES: tuple[tuple[int, int], ...] = ((1, 1), (3, 5), (7, 2))

RNN_OP_TYPES = ("LSTM", "GRU", "RNN", "DynamicQuantizeLSTM")


def all_nodes(graph: onnx.GraphProto, exact: bool = True) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of its subgraphs, depth first; ``exact=False``: not
    those of an exact zero-step branch (``loop_scan``: a Loop kept as written where it
    runs no step)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                if exact or not attr.g.name.endswith(EXACT_BRANCH):
                    yield from all_nodes(attr.g, exact)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from all_nodes(g, exact)


def rnn_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in all_nodes(model.graph) if n.op_type in RNN_OP_TYPES]


def all_op_counts(model: onnx.ModelProto, exact: bool = True) -> collections.Counter[str]:
    """Op counts over the main graph and every subgraph (``exact``: see ``all_nodes``)."""
    return collections.Counter(n.op_type for n in all_nodes(model.graph, exact))


@dataclasses.dataclass(frozen=True)
class FileRewrite:
    """What ``rewrite_file(path, out)`` did: its ``report`` (a NoRecurrence's too), the
    model it wrote (None: none), and ``error``, what it raised other than NoRecurrence."""

    report: rnn_rewrite_rules.Report | None
    written: onnx.ModelProto | None
    error: Exception | None = None

    @property
    def refused(self) -> bool:
        """NoRecurrence: the model has no recurrence to rewrite."""
        return self.report is not None and self.report.found_no_recurrence


@functools.cache
def rewrite_file_once(path: Path, target: str | None = None) -> FileRewrite:
    """``rewrite_file(path, out, RewriteOptions(target=target, hazards=False))``, once per
    file and target in a process (an xdist worker): tests/test_exporter_files.py checks
    the model written, tests/test_exporter_table.py docs/exporters.md's row of the report."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch, "out.onnx")
        options = RewriteOptions(target=target, hazards=False)
        try:
            report = rnn_rewrite_rules.rewrite_file(path, out, options)
        except rnn_rewrite_rules.NoRecurrence as nothing:
            report = nothing.report
        except Exception as error:  # the tests say what it means for the file
            return FileRewrite(None, None, error)
        return FileRewrite(report, onnx.load(out) if out.exists() else None)


def has_layout1(model: onnx.ModelProto) -> bool:
    return any(a.name == "layout" and a.i == 1 for n in rnn_nodes(model) for a in n.attribute)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], engine: str) -> list[np.ndarray]:
    if engine == "ort":
        return runtime.run(model, feeds)
    if engine == "reference":
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]
    raise ValueError(engine)


def assert_spec_equivalent(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    spec: ExporterSpec,
    sizes: Iterable[tuple[int, int]] = SIZES,
    *,
    before_engine: str | None = None,
    after_engine: str = "ort",
    atol: float = 1e-5,
) -> None:
    """Same outputs, same shapes at every (batch, seq): ORT, or the reference evaluator
    for a model ORT cannot run (layout=1)."""
    if before_engine is None:
        before_engine = "reference" if has_layout1(before) else "ort"
    if before_engine != after_engine:
        atol = max(atol, 1e-4)
    if spec.initial_state == "wrong_shape_constant":
        sizes = [(1, s) for _, s in sizes]  # the original only runs at batch 1
    for seed, (batch, seq) in enumerate(sizes):
        for cond in (True, False) if spec.wrap == "if" else (True,):
            feeds = exporter_inputs(spec, batch, seq, rng=seed, cond=cond)
            expected = run(before, feeds, before_engine)
            actual = run(after, feeds, after_engine)
            diff = runtime.max_abs_diff(expected, actual)
            assert diff <= atol, f"batch={batch} seq={seq} cond={cond}: max abs diff {diff}"


def apply_family(names: Sequence[str], model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """One pass of the named families' rules, dead nodes removed, checked."""
    return apply(rnn_rewrite_rules.rules(list(names)), model)


def _state_inputs(node: onnx.NodeProto) -> list[str]:
    states = node.input[5:7] if node.op_type in ("LSTM", "DynamicQuantizeLSTM") else node.input[5:6]
    return [name for name in states if name]


def _static_batch(model: onnx.ModelProto) -> bool:
    """Every RNN node's ``X`` has a batch size the shape prover fixes to a number."""
    graph = ir.serde.deserialize_model(model).graph
    nodes = [n for n in graph.all_nodes() if n.op_type in RNN_OP_TYPES]
    prover = ShapeProver(graph)

    def static(node: ir.Node) -> bool:
        layout = node.attributes.get_int("layout", 0)
        dim = prover.dim(node.inputs[0], 0 if layout == 1 else 1)
        return dim is not None and dim.value is not None

    return bool(nodes) and all(static(n) for n in nodes)


def assert_target_form(
    model: onnx.ModelProto, target: str, before: onnx.ModelProto | None = None
) -> None:
    """Every RNN state is gone (onnxruntime; portable with a static batch, which every
    runtime takes without a state) or explicit zeros shared per form (portable), as many
    states as ``before`` had (when given)."""
    if target == "onnxruntime" or _static_batch(model):
        assert all(not _state_inputs(n) for n in rnn_nodes(model))
        return
    if before is not None:
        count = sum(len(_state_inputs(n)) for n in rnn_nodes(before))
        assert sum(len(_state_inputs(n)) for n in rnn_nodes(model)) == count, "a state dropped"
    ir_model = ir.serde.deserialize_model(model)
    for graph in (ir_model.graph, *ir_model.graph.subgraphs()):
        forms: dict = collections.defaultdict(set)
        for node in graph:
            if node.op_type not in RNN_OP_TYPES:
                continue
            for index in (5, 6) if node.op_type in ("LSTM", "DynamicQuantizeLSTM") else (5,):
                state = node.inputs[index] if index < len(node.inputs) else None
                if state is None:
                    assert before is not None, f"{node.name}: state {index} dropped"
                    continue
                form = explicit_zero_form(state)
                assert form is not None, f"{node.name}: state {index} is not explicit zeros"
                forms[form].add(state)
        # one ConstantOfShape per (type, shape) form in each graph
        assert all(len(values) == 1 for values in forms.values()), forms


def assert_same_on_sequences(
    original: onnx.ModelProto,
    result: onnx.ModelProto,
    sizes: Sequence[tuple[int, int]] = ((2, 5), (1, 1), (3, 0)),
    features: int = 6,
) -> None:
    """``result`` gives ``original``'s outputs in ONNX Runtime on its one input
    ``[batch, seq, features]`` at each ``(batch, seq)`` of ``sizes``."""
    for batch, seq in sizes:
        x = np.random.default_rng(seq).standard_normal((batch, seq, features))
        feeds = {original.graph.input[0].name: x.astype(np.float32)}
        want, got = runtime.run(original, feeds), runtime.run(result, feeds)
        assert [g.shape for g in got] == [w.shape for w in want], (batch, seq)
        assert runtime.max_abs_diff(want, got) <= 1e-5, (batch, seq)
