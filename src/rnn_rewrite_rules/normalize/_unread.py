"""The nodes that computed only a value a normalisation pass replaced, kept to be put
back by the pass's undo (:mod:`rnn_rewrite_rules.normalize._journal`) where no rule used
the replacement."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

__all__ = ["Unread"]


@dataclasses.dataclass
class Unread:
    """``nodes`` of ``graph`` (in its order) that computed only a replaced condition, with
    their inputs: a cleanup between the passes and the undo removes them (and detaches
    their inputs, and drops the ``initializers`` they alone read, with their graphs),
    :meth:`restore` puts them back before ``anchor`` (None: at the end)."""

    graph: ir.Graph | ir.Function
    nodes: list[ir.Node]
    inputs: list[list[ir.Value | None]]
    anchor: ir.Node | None
    initializers: list[tuple[ir.Graph, ir.Value]] = dataclasses.field(default_factory=list)

    @staticmethod
    def of(value: ir.Value, graph: ir.Graph | ir.Function, anchor: ir.Node | None) -> Unread:
        """The nodes of ``graph`` that ``value`` (no longer read) alone needed."""
        dead: set[ir.Node] = set()
        pending = [value.producer()]
        while pending:
            node = pending.pop()
            if node is None or node.graph is not graph or node in dead:
                continue
            readers = {user for v in node.outputs for user, _ in v.uses()}
            if any(v.is_graph_output() for v in node.outputs) or readers - dead:
                continue
            dead.add(node)
            pending.extend(v.producer() for v in node.inputs if v is not None)
        nodes = [n for n in graph if n in dead]
        initializers = [
            (v.graph, v)
            for n in nodes
            for v in n.inputs
            if v is not None and v.is_initializer() and isinstance(v.graph, ir.Graph)
        ]
        return Unread(graph, nodes, [list(n.inputs) for n in nodes], anchor, initializers)

    def _dropped(self) -> list[tuple[ir.Graph, ir.Value]]:
        return [(g, v) for g, v in self.initializers if not v.is_initializer()]

    def restorable(self) -> bool:
        removed = [n for n in self.nodes if n.graph is None]
        dropped = self._dropped()
        if any(v.name in g.initializers for g, v in dropped):
            return False  # another value took the name
        back = {v for _, v in dropped}
        return all(
            _present(v) or v.producer() in removed or v in back
            for node, inputs in zip(self.nodes, self.inputs, strict=True)
            if node.graph is None
            for v in inputs
            if v is not None
        )

    def restore(self, fallback: ir.Node) -> None:
        """Put the nodes back; before ``fallback`` where ``anchor`` left the graph."""
        anchor = self.anchor
        if anchor is not None and anchor.graph is not self.graph:
            anchor = fallback  # a rule replaced the first reader: the other one reads it
        for g, v in self._dropped():
            g.register_initializer(v)
        for node, inputs in zip(self.nodes, self.inputs, strict=True):
            if node.graph is not None:
                continue
            for index, value in enumerate(inputs):
                node.replace_input_with(index, value)
            if anchor is not None:
                self.graph.insert_before(anchor, node)
            else:
                self.graph.append(node)


def _present(value: ir.Value) -> bool:
    """``value`` is still computed: by a node in a graph, or an input or initializer."""
    producer = value.producer()
    if producer is not None:
        return producer.graph is not None
    return value.is_graph_input() or value.is_initializer()
