"""The shape prover: the facts of a value, from the graph alone.

Facts come only from what a runtime enforces: initializer and ``Constant`` shapes and
contents, the declared shapes of the main graph's inputs (ONNX Runtime rejects a feed of
another rank or static size; it does not check a Loop or Scan body's inputs, so theirs
are not facts), attributes, and op semantics (:mod:`.ops`, and for an op without a
transfer function ONNX's own shape function, :mod:`.schema`). value_info and the
declared shapes of computed values are never read. A size no fact determines is the
symbol "axis k of this value", equal only to itself; an unknown rank is None.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array, subgraph_owners
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.shape.dim import Dim, known
from rnn_rewrite_rules.shape.fact import MAX_ELEMENTS, TRACKED_ELEMENT_TYPES, UNKNOWN, Fact
from rnn_rewrite_rules.shape.ops import TRANSFER, rnn_sizes
from rnn_rewrite_rules.shape.schema import infer

__all__ = ["ShapeProver"]

#: Values a single query may visit before the rest is unknown (bounds the cost).
_MAX_VISITS = 20_000


class ShapeProver:
    """Answers shape questions about the values of one model, memoising per instance.

    Create one per rule check: the graph changes between checks. ``main_graph`` is the
    model's main graph (``context.model.graph`` in a check): the declared shapes of its
    inputs are facts, and a Scan body's scan inputs are slices of the Scan's inputs.
    Without it no graph input has a fact.
    """

    def __init__(
        self, main_graph: ir.Graph | None = None, else_taken: Collection[ir.Node] = ()
    ) -> None:
        """``else_taken``: ``If`` nodes read as their ``else`` branch. Every fact this
        prover gives downstream of one holds only where that branch runs: the caller
        proves it runs wherever what it builds on those facts runs
        (``rules.loop_scan.guarded_input``)."""
        self._facts: dict[ir.Value, Fact] = {}
        self._main_graph = main_graph
        self._owners: dict[ir.Graph, ir.Node] | None = None
        self._else_taken = frozenset(else_taken)

    # ------------------------------------------------------------ queries

    def fact(self, value: ir.Value | None) -> Fact:
        if value is None:
            return UNKNOWN
        if value not in self._facts:
            self._compute(value)
        return self._facts.get(value, UNKNOWN)

    def dims(self, value: ir.Value | None) -> tuple[Dim, ...] | None:
        """Every size of ``value`` (a symbol where no fact fixes one), or None: rank unknown.

        A stored fact names every unknown size (:func:`_anchor`), so a known rank has
        every size; :func:`known` only narrows the type."""
        return known(self.fact(value).dims)

    def rank(self, value: ir.Value | None) -> int | None:
        return self.fact(value).rank

    def dim(self, value: ir.Value | None, axis: int) -> Dim | None:
        dims = self.dims(value)
        if dims is None or not -len(dims) <= axis < len(dims):
            return None
        return dims[axis]

    def elements(self, value: ir.Value | None) -> tuple[Dim | None, ...] | None:
        """The content of a rank-0/1 int tensor (a shape computation), None if untracked."""
        return self.fact(value).elements

    def vector(self, value: ir.Value | None) -> tuple[Dim | None, ...] | None:
        """:meth:`elements` of a rank-1 tensor only (a Reshape or Expand target)."""
        fact = self.fact(value)
        return fact.elements if fact.rank == 1 else None

    def ints(self, value: ir.Value | None) -> list[int] | None:
        """The content of a rank-0/1 int tensor when every element is a constant."""
        return self.fact(value).ints()

    def branch_dims(self, value: ir.Value) -> list[tuple[Dim, ...] | None]:
        """For an output of an ``If``: the sizes of that output in each branch (None where
        a branch's rank is unknown); else ``[]``. Where the branches disagree on a size,
        :meth:`dims` names it by the ``If``'s own axis; this says what each branch gives."""
        node, index = value.producer(), value.index()
        if node is None or index is None or (node.domain, node.op_type) != ("", "If"):
            return []
        found: list[tuple[Dim, ...] | None] = []
        for name in ("then_branch", "else_branch"):
            attr = node.attributes.get(name)
            outputs = [] if attr is None else list(attr.as_graph().outputs)
            found.append(self.dims(outputs[index]) if index < len(outputs) else None)
        return found

    def narrowed_from(self, dim: Dim, min_bits: int = 32) -> Dim | None:
        """The size ``dim`` narrows when it is one narrowed symbol (:meth:`Sym.narrowing`,
        through narrowings of narrowings, each to a type of at least ``min_bits`` bits),
        else None.

        ``dim`` is that size wherever the size fits the narrow type, and a different
        number wherever it does not: a narrowing cast is the identity on the values the
        type holds and maps every other value to one it holds. So a consumer that fails
        unless this element equals the size (an RNN's state shape, see
        ``rules.initial_state.state_reason``) proves them equal wherever it runs; this
        alone proves nothing."""
        source = dim
        while (symbol := source.symbol) is not None and symbol.narrowed:
            cast = symbol.value.producer()
            if cast is None or cast.op_type != "Cast" or not cast.inputs:
                return None
            to = ir.DataType(cast.attributes.get_int("to", 0))
            if to.bitwidth < min_bits:
                return None
            elements = self.elements(cast.inputs[0])
            if elements is None or symbol.index >= len(elements):
                return None
            element = elements[symbol.index]
            if element is None:
                return None
            source = element
        return None if source is dim else source

    def rnn_sizes(self, node: ir.Node) -> tuple[int, int, int] | Refusal:
        """``(num_directions, hidden_size, layout)`` of an RNN node, or why unknown."""
        return rnn_sizes(node, [None if v is None else self.fact(v) for v in node.inputs])

    # ------------------------------------------------------------ evaluation

    def _compute(self, root: ir.Value) -> None:
        """Evaluate ``root`` and what it depends on, iteratively (chains can be long)."""
        stack: list[tuple[ir.Value, bool]] = [(root, False)]
        visits = 0
        while stack:
            value, ready = stack.pop()
            if value in self._facts:
                continue
            node = value.producer()
            if node is None:
                source = self._scan_source(value)
                if source is not None and source[0] not in self._facts and not ready:
                    stack.append((value, True))
                    stack.append((source[0], False))
                    continue
                self._facts[value] = self._leaf(value, source)
                continue
            deps = _dependencies(node)
            if not ready:
                visits += 1
                if visits > _MAX_VISITS:
                    self._facts[value] = UNKNOWN
                    continue
                stack.append((value, True))
                stack.extend((d, False) for d in deps if d not in self._facts)
                continue
            self._evaluate(node)

    def _evaluate(self, node: ir.Node) -> None:
        if node.op_type == "If" and node.domain == "":
            facts = self._if(node)
        elif node.op_type == "Constant" and node.domain == "":
            facts = [self._constant(node.outputs[0])]
        else:
            transfer = TRANSFER.get((node.domain, node.op_type))
            ins = [None if v is None else self._facts.get(v, UNKNOWN) for v in node.inputs]
            facts = transfer(node, ins) if transfer else infer(node, ins, self._main_graph)
        for index, output in enumerate(node.outputs):
            fact = facts[index] if index < len(facts) else UNKNOWN
            self._facts[output] = _anchor(fact, output)

    def _if(self, node: ir.Node) -> list[Fact]:
        """The branch that runs when the condition is proven, or what both branches agree on."""
        then_branch, else_branch = (node.attributes.get(n) for n in ("then_branch", "else_branch"))
        if then_branch is None or else_branch is None:
            return []
        then_graph, else_graph = then_branch.as_graph(), else_branch.as_graph()
        condition = node.inputs[0] if node.inputs else None
        cond = UNKNOWN if condition is None else self._facts.get(condition, UNKNOWN)
        then_facts = [self._facts.get(v, UNKNOWN) for v in then_graph.outputs]
        else_facts = [self._facts.get(v, UNKNOWN) for v in else_graph.outputs]
        if node in self._else_taken:
            return else_facts
        taken = cond.ints()
        if taken is not None and len(taken) == 1:
            return then_facts if taken[0] else else_facts
        return [_agree(a, b) for a, b in zip(then_facts, else_facts, strict=False)]

    def _leaf(self, value: ir.Value, source: tuple[ir.Value, int] | None) -> Fact:
        if not value.is_graph_input():
            return self._constant(value)
        if self._main_graph is not None and value.graph is self._main_graph:
            return self._declared(value)
        if source is None:  # a Loop body's or a Scan's state: what an iteration computed
            return UNKNOWN
        outer, axis = source
        dims = self._facts.get(outer, UNKNOWN).dims
        if dims is None or not -len(dims) <= axis < len(dims):
            return UNKNOWN
        axis += len(dims) if axis < 0 else 0
        return _anchor(Fact(dims[:axis] + dims[axis + 1 :]), value)

    def _scan_source(self, value: ir.Value) -> tuple[ir.Value, int] | None:
        """For a Scan body's scan input: the Scan's input it slices and the axis it
        slices (its other sizes are that input's); else None (a body input's own
        declaration is not a fact: ONNX Runtime does not hold a Loop body's to it)."""
        graph = value.graph
        if self._main_graph is None or graph is None or graph is self._main_graph:
            return None
        if not value.is_graph_input() or self._main_graph.opset_imports.get("", 0) < 9:
            return None  # Scan-8 has a batch axis and sequence lengths first
        if self._owners is None:
            self._owners = subgraph_owners(self._main_graph)
        node = self._owners.get(graph)
        if node is None or (node.domain, node.op_type) != ("", "Scan"):
            return None
        scan_inputs = node.attributes.get_int("num_scan_inputs", 0)
        index = list(graph.inputs).index(value)
        first = len(graph.inputs) - scan_inputs
        if index < first or index >= len(node.inputs):
            return None
        outer = node.inputs[index]
        axes = node.attributes.get("scan_input_axes")
        axis_list = list(axes.as_ints()) if axes is not None else [0] * scan_inputs
        if outer is None or len(axis_list) != scan_inputs:
            return None
        return outer, axis_list[index - first]

    def _declared(self, value: ir.Value) -> Fact:
        """A main-graph input's declared shape: ONNX Runtime rejects a feed of another rank
        or static size."""
        shape = value.shape
        if shape is None:
            return UNKNOWN
        dims = tuple(
            Dim.const(d) if isinstance(d, int) else Dim.sym(value, axis)
            for axis, d in enumerate(shape.dims)
        )
        return Fact(dims)

    @staticmethod
    def _constant(value: ir.Value) -> Fact:
        tensor = None if value.is_graph_input() else ir.convenience.get_const_tensor(value)
        if tensor is None:
            return UNKNOWN
        shape = tensor.shape.numpy()  # a tensor's shape is static
        dims = tuple(Dim.const(int(d)) for d in shape)
        elements = None
        dtype = tensor.dtype
        if len(dims) <= 1 and dtype in TRACKED_ELEMENT_TYPES:
            size = int(np.prod(shape)) if dims else 1
            if size <= MAX_ELEMENTS:
                array = const_array(value)
                if array is not None:
                    elements = tuple(Dim.const(int(v)) for v in np.atleast_1d(array).tolist())
        return Fact(dims, elements)


def _dependencies(node: ir.Node) -> list[ir.Value]:
    deps = [v for v in node.inputs if v is not None]
    if node.op_type == "If" and node.domain == "":
        for name in ("then_branch", "else_branch"):
            attr = node.attributes.get(name)
            if attr is not None:
                deps.extend(attr.as_graph().outputs)
    return deps


def _anchor(fact: Fact, value: ir.Value) -> Fact:
    """Name every unknown size of ``value`` by its own axis."""
    if fact.dims is None or None not in fact.dims:
        return fact
    dims = tuple(Dim.sym(value, i) if d is None else d for i, d in enumerate(fact.dims))
    return Fact(dims, fact.elements)


def _agree(a: Fact, b: Fact) -> Fact:
    if a.dims is None or b.dims is None or len(a.dims) != len(b.dims):
        return UNKNOWN
    dims = tuple(x if x == y else None for x, y in zip(a.dims, b.dims, strict=True))
    elements = None
    if a.elements is not None and b.elements is not None and len(a.elements) == len(b.elements):
        elements = tuple(x if x == y else None for x, y in zip(a.elements, b.elements, strict=True))
    return Fact(dims, elements)
