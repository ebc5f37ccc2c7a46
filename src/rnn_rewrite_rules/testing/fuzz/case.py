"""One generated model and what its feeds must respect."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["Case", "Graph", "fresh_names", "main_values"]


@dataclasses.dataclass
class Case:
    """A model, the feeds whose values matter, and the sizes it needs.

    ``fixed``: graph inputs fed with exactly this array (runtime axes, a condition);
    ``min_sizes``: a symbolic dimension's smallest valid size (a sequence axis made
    symbolic over a fixed number of unrolled steps); ``steps``: what built it, in order,
    as ``name(arguments)`` strings (the report of a failure); ``zero_dims``: symbolic
    dimensions whose size 0 the case is about: plans with a 0 in these only are compared
    on ONNX Runtime in child processes even when the run leaves other zero plans out.
    """

    model: onnx.ModelProto
    fixed: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    min_sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    steps: list[str] = dataclasses.field(default_factory=list)
    zero_dims: set[str] = dataclasses.field(default_factory=set)

    def note(self, step: str) -> None:
        self.steps.append(step)


def main_values(model: onnx.ModelProto) -> list[str]:
    """Names of the main graph's node outputs, in node order."""
    return [o for node in model.graph.node for o in node.output if o]


def fresh_names(model: onnx.ModelProto, prefix: str):
    """An iterator of names with ``prefix`` that the model does not use yet."""
    used = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    for node in _all_nodes(model.graph):
        used.add(node.name)
        used.update(node.input)
        used.update(node.output)
    return (f"{prefix}{n}" for n in itertools.count() if f"{prefix}{n}" not in used)


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            for g in attr.graphs:
                yield from _all_nodes(g)


class Graph:
    """Helpers that append nodes and initializers to a model's main graph."""

    def __init__(self, model: onnx.ModelProto, prefix: str = "fz_") -> None:
        self.model = model
        self.graph = model.graph
        self._names = fresh_names(model, prefix)

    @property
    def opset(self) -> int:
        return next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))

    def fresh(self) -> str:
        return next(self._names)

    def const(self, array: np.ndarray) -> str:
        name = self.fresh()
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> list[str]:
        outs = [self.fresh() for _ in range(n_out)]
        self.graph.node.append(helper.make_node(op_type, inputs, outs, name=self.fresh(), **attrs))
        return outs

    def one(self, op_type: str, *inputs: str, **attrs) -> str:
        return self.node(op_type, list(inputs), **attrs)[0]

    def input(self, name: str, elem: int, dims: list) -> str:
        self.graph.input.append(helper.make_tensor_value_info(name, elem, dims))
        return name

    def output(self, value: str, elem: int, rank: int) -> str:
        """``value`` as a graph output of ``elem`` and ``rank`` (sizes unknown)."""
        self.graph.output.append(helper.make_tensor_value_info(value, elem, [None] * rank))
        return value
