"""What the normalisation passes changed, put back where no rule used it.

A normalisation is a spelling change: it helps a rule match and is equal to what it
replaced. Where no rule then rewrote the values it touched, the model keeps the
exporter's spelling (node names, output names, declared types and shapes): each edit
is undone when every node it left reading the normalised value still reads it.
Undoing an edit is a spelling change too, so the outputs stay equal either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Sequence
from typing import Protocol

import onnx_ir as ir

__all__ = ["Bypassed", "Edit", "Journal", "Replaced"]


class Edit(Protocol):
    """One normalisation's change, undone by ``undo`` when no rule used it."""

    def undo(self, original: Container[ir.Node]) -> bool: ...


def _alive(value: ir.Value) -> bool:
    """``value`` is still computed: a graph input or initializer, or its producer is in
    a graph."""
    node = value.producer()
    return node is None or node.graph is not None


def _insert_after_source(graph: ir.Graph | ir.Function, value: ir.Value, node: ir.Node) -> None:
    """Put ``node`` (reading ``value``) right after ``value``'s producer when that is in
    ``graph``, else first: before every reader, in topological order."""
    producer = value.producer()
    if producer is not None and producer.graph is graph:
        graph.insert_after(producer, node)
    elif len(graph) > 0:
        graph.insert_before(next(iter(graph)), node)
    else:
        graph.append(node)


def _reads(user: ir.Node, index: int, value: ir.Value) -> bool:
    return index < len(user.inputs) and user.inputs[index] is value


def _successors(
    readers: Sequence[tuple[ir.Node, int]],
    source: ir.Value,
    graph: ir.Graph | ir.Function,
    original: Container[ir.Node],
) -> list[tuple[ir.Node, int]]:
    """For each of ``readers`` a rule replaced, the node it emitted in its place: one not
    in ``original``, of the same op, reading ``source`` at the same input (an LSTM
    re-emitted with another layout reads its weights as the one it replaced did)."""
    gone = [(user.op_type, user.domain, index) for user, index in readers if user.graph is None]
    found: list[tuple[ir.Node, int]] = []
    for user, index in list(source.uses()):
        key = (user.op_type, user.domain, index)
        if key in gone and user.graph is graph and user not in original:
            gone.remove(key)
            found.append((user, index))
    return found


@dataclasses.dataclass
class Bypassed:
    """``chain`` (the removed node last; a round trip's first Cast before it) was
    bypassed: ``readers`` and the graph outputs at ``outputs`` read ``source`` instead
    of the last node's output; ``declaration``: ``source``'s name, type and shape
    before it took a graph output's."""

    graph: ir.Graph | ir.Function
    chain: Sequence[ir.Node]
    source: ir.Value
    readers: Sequence[tuple[ir.Node, int]]
    outputs: Sequence[int]
    declaration: tuple[str | None, ir.TypeProtocol | None, ir.Shape | None] | None

    def undo(self, original: Container[ir.Node]) -> bool:
        graph, source = self.graph, self._current_source()
        if source is None or self.chain[-1].graph is not None:
            return False
        readers = [(user, index) for user, index in self.readers if _reads(user, index, source)]
        readers += _successors(self.readers, source, graph, original)
        outputs = [i for i in self.outputs if i < len(graph.outputs) and graph.outputs[i] is source]
        if not (readers or outputs):
            return False
        current = source
        for node in self.chain:
            if node.graph is None:  # removed (the bypassed node, or a dead round trip)
                node.replace_input_with(0, current)
                _insert_after_source(graph, current, node)
            current = node.outputs[0]
        for user, index in readers:
            user.replace_input_with(index, current)
        for i in outputs:
            graph.outputs[i] = current
        if self.declaration is not None and outputs and source is self.source:
            source.name, source.type, source.shape = self.declaration
        return True

    def _current_source(self) -> ir.Value | None:
        """``source``, or where a rule replaced it (an equal value: the rewriter replaces
        values by equal ones) the one value the readers still in the graph read in its
        place; None when neither."""
        if _alive(self.source):
            return self.source
        values = {
            id(user.inputs[index]): user.inputs[index]
            for user, index in self.readers
            if user.graph is self.graph and index < len(user.inputs)
        }
        if len(values) != 1:
            return None
        (value,) = values.values()
        if value is None or not _alive(value):
            return None
        types = (value.dtype, self.source.dtype)
        if None not in types and types[0] != types[1]:
            return None  # a Cast put back on a value of another type would convert it
        return value


@dataclasses.dataclass
class Replaced:
    """``old`` (reading ``inputs``) was replaced by ``new``, a node whose first output
    took the place of ``old``'s; ``helpers``: nodes made for ``new`` alone (a
    ``Transpose`` of an operand)."""

    graph: ir.Graph | ir.Function
    old: ir.Node
    inputs: Sequence[ir.Value | None]
    new: ir.Node
    helpers: Sequence[ir.Node] = ()
    #: ``old``'s inputs that were initializers, with their graph: a cleanup between the
    #: passes and the undo drops an initializer ``new`` left unread (a ``Gemm``'s bias).
    initializers: Sequence[tuple[ir.Graph, ir.Value]] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.initializers = [
            (v.graph, v)
            for v in self.inputs
            if v is not None and v.is_initializer() and isinstance(v.graph, ir.Graph)
        ]

    def undo(self, original: Container[ir.Node]) -> bool:
        del original  # the replacement's readers read what the original's did
        graph, new = self.graph, self.new
        if new.graph is not graph or self.old.graph is not None:
            return False
        if any(h.graph is not graph or len(h.outputs[0].uses()) != 1 for h in self.helpers):
            return False
        if not all(v is None or _alive(v) for v in self.inputs):
            return False
        dropped = [(g, v) for g, v in self.initializers if not v.is_initializer()]
        if any(v.name in g.initializers for g, v in dropped):
            return False  # another value took the name: the bias cannot come back as it was
        for g, v in dropped:
            g.register_initializer(v)
        for index, value in enumerate(self.inputs):
            self.old.replace_input_with(index, value)
        graph.insert_before(new, self.old)
        result, replaced = self.old.outputs[0], new.outputs[0]
        name = replaced.name
        ir.convenience.replace_all_uses_with(replaced, result, replace_graph_outputs=True)
        graph.remove([new, *self.helpers], safe=True)
        replaced.name, result.name = None, name
        return True


class Journal:
    """The edits of the normalisation passes, in the order made."""

    def __init__(self) -> None:
        self.edits: list[Edit] = []

    def record(self, edit: Edit) -> None:
        self.edits.append(edit)

    def restore(self, original: Container[ir.Node] = ()) -> int:
        """Undo, last first, every edit no rule used (see the module docstring); the
        number undone. ``original``: the nodes before the rules ran (a node not among
        them that took a reader's place reads the exporter's spelling too). The journal
        is emptied."""
        undone = sum(edit.undo(original) for edit in reversed(self.edits))
        self.edits.clear()
        return undone
