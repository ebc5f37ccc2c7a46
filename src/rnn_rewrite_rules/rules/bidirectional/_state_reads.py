"""The final states of a merged pair's halves, read per direction.

A hand-built stack of a streaming model passes each direction's state in and out of
every call: each half's ``Y_h`` (``Y_c``) is read on its own (a ``Squeeze`` to a 1-D
graph output, the next call's state). Merged, those reads become the two halves of
``Split(Y_h, axis=0)`` (forward first: the merged node's direction axis); a lone reversed
half made one reverse node gives its reads that node's ``Y_h`` (``Y_c``) itself.

The readers are not part of the merge rule's match (its root is the ``Y`` Concat), so
the rewriter cannot move them: :class:`StateReads` keeps each (old state, new state) pair
a rewrite made and, once the rewriter has applied the rewrites of a graph, points the old
state's readers (and a graph output) at the new one and restores the graph's topological
order (a reader of a half's state may come before the ``Y`` Concat the merged node is
inserted after). A rewrite the rewriter did not apply (a tracer's dry run) leaves its new
nodes outside every graph: its pairs are dropped.
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules._compat import emit_node
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules._graph import fresh_name
from rnn_rewrite_rules.rules.unused_outputs import PENDING_READS

__all__ = ["StateReads", "cycle_reason", "read_states"]


def read_states(halves: tuple[ir.Node, ...]) -> list[bool]:
    """For each state output (``Y_h``, ``Y_c``): whether either half's is read."""
    count = max(len(node.outputs) for node in halves) - 1
    return [
        any(k < len(node.outputs) and _read(node.outputs[k]) for node in halves)
        for k in range(1, count + 1)
    ]


def _read(value: ir.Value) -> bool:
    return bool(value.uses()) or value.is_graph_output()


def cycle_reason(halves: tuple[ir.Node, ir.Node], limit: int = 100_000) -> Refusal | None:
    """Why the halves' state reads cannot be taken from the merged node: an input of a
    half is computed from a half's output (the merged node would read its own output).
    None when no input is (or ``limit`` nodes were walked without finding one: refused
    then too, as unproven)."""
    seen: set[ir.Node] = set()
    stack = [v for half in halves for v in half.inputs if v is not None]
    while stack:
        producer = stack.pop().producer()
        if producer is None or producer in seen:
            continue
        if producer in halves:
            return Refusal("an input of a half is computed from a half's output")
        seen.add(producer)
        if len(seen) > limit:
            return Refusal(f"the halves' inputs depend on more than {limit} nodes")
        stack.extend(v for v in producer.inputs if v is not None)
    return None


class StateReads:
    """The state pairs of the rewrites of each graph the rewriter is visiting (a stack:
    the rewriter visits a subgraph inside its owner's visit)."""

    def __init__(self) -> None:
        self._stack: list[list[tuple[ir.Value, ir.Value]]] = []

    def enter(self) -> None:
        self._stack.append([])

    def emit(self, op, opset: int, merged: ir.Value, halves: tuple[ir.Node, ir.Node], k: int):
        """Split the merged node's state output ``merged`` (output ``k``) into the halves'."""
        split = {"num_outputs": 2} if opset >= 18 else {}
        parts = emit_node(op, "Split", [merged], {"axis": 0, **split}, domain="", num_outputs=2)
        if self._stack:
            self._stack[-1] += [
                (half.outputs[k], new)
                for half, new in zip(halves, parts, strict=True)
                if k < len(half.outputs)
            ]

    def keep(self, old: ir.Value, new: ir.Value) -> None:
        """Give ``old``'s readers ``new`` (the same state, of a node that replaces
        ``old``'s) once the graph's rewrites are applied; until then ``new`` counts as
        read (no rule drops it as unused)."""
        if self._stack:
            new.meta[PENDING_READS] = True
            self._stack[-1].append((old, new))

    def leave(self) -> None:
        pairs = self._stack.pop() if self._stack else []
        graphs: list[ir.Graph] = []
        for old, new in pairs:
            new.meta.pop(PENDING_READS, None)
            producer = new.producer()
            graph = None if producer is None else producer.graph
            if graph is None:  # the rewrite was not applied
                continue
            _take_reads(graph, old, new)
            if graph not in graphs:
                graphs.append(graph)
        for graph in graphs:
            if not _sorted(graph):
                graph.sort()


def _take_reads(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Point ``old``'s readers at ``new``; a graph output keeps its name, type and shape."""
    if old.is_graph_output():
        name = old.name
        old.name = fresh_name(graph, f"{name}_before_merge")
        new.name, new.type, new.shape = name, old.type, old.shape
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)


def _sorted(graph: ir.Graph) -> bool:
    """Every node's inputs from this graph's nodes are computed before it (subgraphs'
    reads of outer values included)."""
    done: set[ir.Node] = set()
    members = set(graph)
    for node in graph:
        for value in _reads(node):
            producer = value.producer()
            if producer in members and producer not in done:
                return False
        done.add(node)
    return True


def _reads(node: ir.Node):
    yield from (v for v in node.inputs if v is not None)
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield from (v for n in ir.traversal.RecursiveGraphIterator(attr.value)
                        for v in n.inputs if v is not None)  # fmt: skip
        elif attr.type == ir.AttributeType.GRAPHS:
            for sub in attr.value:
                yield from (v for n in ir.traversal.RecursiveGraphIterator(sub)
                            for v in n.inputs if v is not None)  # fmt: skip
