"""Make a ``Loop``'s conditions constant true where they provably are on every iteration
but the last (tf2onnx's ``while_loop``: ``time < T and counter < T``), or where they
compare the step with the trip count in floating point, make the trip count the number
of steps they let run.

Pattern: ``Loop(M, c0, ...)`` whose initial condition ``c0`` is an ``And`` tree of
``Less(a, B)`` leaves and whose body condition is an ``And`` tree of ``Less(s, B)``
leaves; ``a`` a constant number (tf2onnx: ``0.0``), ``s`` a step value (the iteration
number, a counter ``+ 1`` per step from a constant scalar, either plus a constant
scalar), ``B`` a bound
(an outer value, or a carried value the body passes through: its initial value). Each
side may be read through ``Cast``\\ s (tf2onnx compares in float).
Condition: every leaf is true wherever the Loop still has an iteration to run. With
``n`` the trip count ``M`` without its widening integer ``Cast``\\ s: a bound that is
``n`` (through widening integer ``Cast``\\ s) needs ``a <= 0`` (initial leaf: ``0 < n``
whenever the Loop runs at all) and a step offset ``<= 1`` (body leaf after step ``k``:
``k + 1 < n`` for ``k <= M - 2``); ``M`` and a bound both known (constants, or sizes the
main graph's inputs declare, which ONNX Runtime enforces) are checked at the last step
that reads the condition (a step value grows with ``k``; a rounding ``Cast`` keeps that
order). A step value read through a ``Cast`` to a floating type is exact only below its
mantissa's range (``2**24`` for float32): there ``k + 1`` and ``n`` may round to one
value and the loop ends early. An initial leaf ``a <= 0`` against ``n >= 1`` holds in any
float type. The counter's own type holds ``n``'s (no wrap before the bound).
Counted leaves: a body leaf ``Less(to(k + offset), to(n))`` with ``to`` float32 or
float64 on both sides, ``offset <= 1`` and ``n`` not known in ``to``'s exact range is
not always true, but monotone: ``to`` rounds to nearest and never decreases, so the
leaf is true for the first steps and false from one on. Of several such leaves (one
``to``), the one with the largest offset turns false first. Float16 is refused: ONNX
Runtime has no float16 ``Less`` and compares in float32 between Casts it inserts, so its
steps are not float16's.
Replacement: ``c0`` reads a ``Constant`` true and the body's condition output is
``Identity(cond_in)`` (so true on every iteration); with a counted leaf, ``M`` becomes
``ReduceSum(Cast(Less(Cast(Range(offset - 1, n + offset - 1), to), Cast(n, to)),
int64))`` (``_step_count``), else it stays.
Equality: the original runs ``min(M, first false)`` iterations; every leaf is true on
every iteration before the ``M``-th, so it runs ``M``, as the replacement does. The
condition after the last iteration is not read (``M`` ends the loop). Counted: step
``j >= 1`` runs when ``j < M`` and the leaf read after step ``j - 1`` holds,
``to(j - 1 + offset) < to(n)``; step 0 runs when ``M >= 1`` (the initial leaves), where
``to(offset - 1) <= to(0) < to(n)`` holds too. The leaf being monotone, the steps run are
the ``j`` in ``0..M-1`` where it holds, which the ``ReduceSum`` counts (``Cast`` to a
floating type rounds an integer's value, whatever integer type holds it, so ``Range``
in ``n``'s type gives the original's floats). That is ``n`` below ``2**24`` and fewer
above, as in the original. ``O(n)`` memory: ``n`` elements of four types.

onnx_ir and onnxscript have no pass that reads a Loop's condition; ``LoopToRnn`` needs
a constant trip count, ``X``'s length or a count of steps, and a condition that cannot
end the loop early, hence this pass. :func:`condition_refusal` says why a Loop's
condition was left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterator

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array, free_name, opset_version, taken_names
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._node_pass import NodePass
from rnn_rewrite_rules.normalize._step_count import StepCount, emit_step_count
from rnn_rewrite_rules.normalize._values import ElementTypes
from rnn_rewrite_rules.normalize.no_op_cast import holds_exactly
from rnn_rewrite_rules.shape import ShapeProver

__all__ = [
    "Conditions",
    "ConditionsMadeTrue",
    "Counted",
    "LoopConditionPass",
    "Unread",
    "condition_refusal",
    "read_conditions",
]

#: Integers a floating type holds exactly: every one of magnitude up to 2**digits.
_EXACT_DIGITS = {ir.DataType.FLOAT16: 11, ir.DataType.FLOAT: 24, ir.DataType.DOUBLE: 53}


#: Floating types whose comparisons ONNX Runtime runs as written (float16: Less runs in
#: float32 between inserted Casts, so its steps differ from a float16 count).
_COUNTED = frozenset((ir.DataType.FLOAT, ir.DataType.DOUBLE))


def _label(node: ir.Node) -> str:
    return f"'{node.name}'" if node.name else f"a {node.op_type}"


@dataclasses.dataclass
class _Read:
    """A value read through ``Cast``\\ s: its ``base`` and the narrowest floating ``Cast``
    on the way (None: integers throughout)."""

    base: ir.Value
    float_cast: ir.Node | None = None


def _through_casts(value: ir.Value, types: ElementTypes) -> _Read:
    """``value`` without the ``Cast``\\ s above it that keep every integer value exact
    below a floating type's range (integer widening, or to a floating type: recorded)."""
    read = _Read(value)
    while True:
        node = read.base.producer()
        if node is None or node.op_type not in ("Cast", "Identity") or node.domain != "":
            return read
        source = node.inputs[0] if node.inputs else None
        if source is None:
            return read
        if node.op_type == "Cast":
            to = ir.DataType(node.attributes.get_int("to", 0))
            frm = types(source)
            if frm is None or not frm.is_integer():
                return read
            if to in _EXACT_DIGITS:
                digits = _EXACT_DIGITS[to]
                known = read.float_cast
                if known is None or digits < _digits(known):
                    read.float_cast = node
            elif not holds_exactly(frm, to):
                return read
        read.base = source


def _digits(cast: ir.Node) -> int:
    return _EXACT_DIGITS[ir.DataType(cast.attributes.get_int("to", 0))]


def _leaves(value: ir.Value) -> Iterator[ir.Value]:
    """The operands of the ``And`` tree ``value`` is (``value`` itself when none)."""
    node = value.producer()
    if node is not None and node.op_type == "And" and node.domain == "" and len(node.inputs) == 2:
        for operand in node.inputs:
            if operand is not None:
                yield from _leaves(operand)
    else:
        yield value


def _comparison(value: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    """``(a, b)`` when ``value`` is ``a < b`` (``Less(a, b)`` or ``Greater(b, a)``)."""
    node = value.producer()
    if node is None or node.domain != "" or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if a is None or b is None:
        return None
    if node.op_type == "Less":
        return a, b
    if node.op_type == "Greater":
        return b, a
    return None


def _scalar_int(value: ir.Value) -> int | None:
    return _integer(const_array(value))


def _integer(array: np.ndarray | None) -> int | None:
    """A one-element integer constant's value, else None."""
    if array is None or array.size != 1 or array.dtype.kind not in "iu":
        return None
    return int(array.reshape(()))


def _scalar_number(value: ir.Value) -> float | None:
    """A constant scalar's value (an integer or floating one: tf2onnx starts at ``0.0``)."""
    array = const_array(value)
    if array is None or array.size != 1 or array.dtype.kind not in "iuf":
        return None
    number = float(array.reshape(()))
    return number if np.isfinite(number) else None


@dataclasses.dataclass
class _Loop:
    """What the proof reads of one ``Loop``: its body, trip count without widening
    ``Cast``\\ s, the outer value each invariant carried input is, and each counter's
    start."""

    node: ir.Node
    body: ir.Graph
    trips: ir.Value
    invariants: dict[ir.Value, ir.Value]
    counters: dict[ir.Value, int]
    types: ElementTypes
    prover: ShapeProver

    def integer(self, value: ir.Value) -> int | None:
        """``value``'s one integer when a constant or proven from the main graph's
        declared input sizes, else None."""
        found = _integer(const_array(value))
        if found is None:
            ints = self.prover.ints(value)
            found = ints[0] if ints is not None and len(ints) == 1 else None
        return found

    def bound(self, value: ir.Value) -> _Read | Refusal:
        """``value``, an invariant of the loop, as the outer value it is."""
        read = _through_casts(value, self.types)
        outer = self.invariants.get(read.base, read.base)
        if outer is not read.base:
            again = _through_casts(outer, self.types)
            read = _Read(again.base, read.float_cast or again.float_cast)
        producer = read.base.producer()
        if read.base in self.body.inputs or (producer is not None and producer.graph is self.body):
            return Refusal(
                f"Loop {_label(self.node)}: the condition compares with a value it computes"
            )
        return read

    def step(self, value: ir.Value) -> tuple[int, _Read] | Refusal:
        """``(offset, read)`` when ``value`` is ``k + offset`` after step ``k``."""
        read = _Read(value)
        offset, current = 0, value
        while True:
            inner = _through_casts(current, self.types)
            current = inner.base
            if inner.float_cast is not None and (
                read.float_cast is None or _digits(inner.float_cast) < _digits(read.float_cast)
            ):
                read.float_cast = inner.float_cast
            if current is self.body.inputs[0]:
                return offset, read
            if current in self.counters:
                return offset + self.counters[current], read
            node = current.producer()
            if (
                node is None
                or node.op_type != "Add"
                or node.domain != ""
                or node.graph is not self.body
            ):
                return Refusal(
                    f"Loop {_label(self.node)}: the condition reads more than the step number"
                )
            pairs = [(node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])]
            for operand, constant in pairs:
                added = None if constant is None else _scalar_int(constant)
                if operand is not None and added is not None:
                    offset, current = offset + added, operand
                    break
            else:
                return Refusal(
                    f"Loop {_label(self.node)}: the condition reads more than the step number"
                )


def _read_loop(node: ir.Node, types: ElementTypes, prover: ShapeProver) -> _Loop | Refusal:
    attr = node.attributes.get("body")
    if attr is None or attr.type != ir.AttributeType.GRAPH:
        return Refusal("the Loop has no body")
    body = attr.as_graph()
    initial = list(node.inputs[2:])
    carried_in, carried_out = list(body.inputs[2:]), list(body.outputs[1:])
    if not node.inputs or node.inputs[0] is None or len(carried_in) != len(initial):
        return Refusal(f"Loop {_label(node)}: it has no trip count")
    if len(carried_out) < len(initial):
        return Refusal(f"Loop {_label(node)}: the body does not match it")
    trips = _through_casts(node.inputs[0], types)
    invariants: dict[ir.Value, ir.Value] = {}
    counters: dict[ir.Value, int] = {}
    for v0, v_in, v_out in zip(initial, carried_in, carried_out, strict=False):
        if v0 is None:
            continue
        source = _identity_source(v_out)
        start = _scalar_int(v0)
        if source is v_in:
            invariants[v_in] = v0
        elif start is not None and _is_increment(source, v_in) and _holds(types, v_in, trips.base):
            counters[v_in] = start
    return _Loop(node, body, trips.base, invariants, counters, types, prover)


def _holds(types: ElementTypes, counter: ir.Value, trips: ir.Value) -> bool:
    """The counter's type holds every value of the trip count's (no wrap before it)."""
    counter_type, trips_type = counter.dtype, types(trips)
    return (
        counter_type is not None
        and trips_type is not None
        and holds_exactly(trips_type, counter_type)
    )


def _identity_source(value: ir.Value) -> ir.Value:
    node = value.producer()
    while (
        node is not None
        and node.op_type == "Identity"
        and node.domain == ""
        and node.inputs[0] is not None
    ):
        value = node.inputs[0]
        node = value.producer()
    return value


def _is_increment(value: ir.Value, value_in: ir.Value) -> bool:
    node = value.producer()
    if node is None or node.op_type != "Add" or node.domain != "" or len(node.inputs) != 2:
        return False
    a, b = node.inputs
    return (a is value_in and b is not None and _scalar_int(b) == 1) or (
        b is value_in and a is not None and _scalar_int(a) == 1
    )


@dataclasses.dataclass(frozen=True)
class Counted:
    """A body leaf ``Less(to(k + offset), to(n))`` (``offset <= 1``, ``to`` a floating
    type, ``n`` the trip count) that is not proven exact: the Loop then runs
    ``#{j in 0..n-1 : to(j - 1 + offset) < to(n)}`` steps (see the module docstring),
    which :class:`LoopConditionPass` computes as its trip count."""

    offset: int
    to: ir.DataType


def _leaf_verdict(loop: _Loop, leaf: ir.Value, initial: bool) -> Refusal | Counted | None:
    """None when ``leaf`` is true wherever the loop has an iteration left (see the
    module docstring); :class:`Counted` when it is monotone against the trip count in
    floating point; else why not, naming the node."""
    found = _comparison(leaf)
    where = "initial condition" if initial else "condition"
    name = _label(loop.node)
    if found is None:
        return Refusal(f"Loop {name}: the {where} is not a conjunction of Less")
    a, b = found
    bound = loop.bound(b)
    if isinstance(bound, Refusal):
        return bound
    if initial:
        return _initial_reason(loop, a, bound)
    step = loop.step(a)
    if isinstance(step, Refusal):
        return step
    offset, read = step
    cast = read.float_cast or bound.float_cast
    same = bound.base is loop.trips
    if same and cast is None:
        return None if offset <= 1 else Refusal(f"Loop {name}: it ends before its trip count")
    reason = _exact_reason(loop, offset, bound, cast)
    if reason is None or not same:
        return reason
    if offset > 1:  # to(k + offset) >= to(n) after step n - 2: to() does not decrease
        return Refusal(f"Loop {name}: it ends before its trip count")
    assert cast is not None
    if (
        read.float_cast is None
        or bound.float_cast is None
        or _to(read.float_cast) != _to(bound.float_cast)
    ):
        return reason  # one side compared in another type: not the count below
    if _to(cast) not in _COUNTED:
        return Refusal(
            f"Loop {name}: the condition compares in {_to(cast).name.lower()}"
            f" ({_label(cast)}) beyond its exact range; ONNX Runtime has no Less kernel of"
            " it and compares in another type, so its steps are not counted"
        )
    return Counted(offset, _to(cast))


def _to(cast: ir.Node) -> ir.DataType:
    return ir.DataType(cast.attributes.get_int("to", 0))


def _initial_reason(loop: _Loop, a: ir.Value, bound: _Read) -> Refusal | None:
    """None when the initial leaf ``a < bound`` is true whenever the Loop runs a step."""
    name = _label(loop.node)
    start = _scalar_number(a)
    if start is None:
        return Refusal(f"Loop {name}: the initial condition does not compare a constant")
    if bound.base is loop.trips:
        if start <= 0:
            return None
        return Refusal(f"Loop {name}: it may not start: {start} < trip count")
    trips, limit = loop.integer(loop.trips), loop.integer(bound.base)
    if trips is None or limit is None:
        return Refusal(f"Loop {name}: the initial condition is not against its trip count")
    if trips >= 1 and not start < limit:
        return Refusal(f"Loop {name}: the initial condition is false")
    return None


def _exact_reason(loop: _Loop, offset: int, bound: _Read, cast: ir.Node | None) -> Refusal | None:
    """None when the body leaf ``k + offset < bound`` (compared through ``cast``) is
    true after every step but the last, from a known trip count and bound."""
    name = _label(loop.node)
    trips, limit = loop.integer(loop.trips), loop.integer(bound.base)
    if trips is None or limit is None:
        if cast is not None:
            return Refusal(
                f"Loop {name}: the condition compares in floating point ({_label(cast)}):"
                f" exact only below 2**{_digits(cast)}, and its bound is not a constant"
            )
        return Refusal(f"Loop {name}: the condition is not against its trip count")
    if trips < 2:
        return None  # no condition is read before the last iteration
    last = trips - 2 + offset  # the step value after the last iteration but one
    if cast is not None and max(abs(last), abs(limit)) > 2 ** _digits(cast):
        return Refusal(
            f"Loop {name}: the condition compares in floating point ({_label(cast)})"
            f" beyond 2**{_digits(cast)}, where integers round"
        )
    if last < limit:
        return None
    return Refusal(f"Loop {name}: the condition is false after step {trips - 2}: it ends early")


@dataclasses.dataclass
class Conditions:
    """What the proof found of one Loop's conditions: ``counted``, the body leaf that
    decides how many steps run when one compares in floating point beyond its exact
    range (None: every leaf is true before the last iteration)."""

    loop: _Loop
    counted: Counted | None


def read_conditions(node: ir.Node, main_graph: ir.Graph | None = None) -> Conditions | Refusal:
    """Why ``node`` (a ``Loop``)'s conditions are neither provably true wherever it has
    an iteration left nor a count of its steps; else what was proven. ``main_graph``: the
    model's graph, whose inputs' declared sizes are facts (a static sequence length
    makes the bound a constant)."""
    types = ElementTypes()
    loop = _read_loop(node, types, ShapeProver(main_graph))
    if isinstance(loop, Refusal):
        return loop
    first = node.inputs[1] if len(node.inputs) > 1 else None
    cond_out = loop.body.outputs[0]
    checks: list[tuple[ir.Value, bool]] = []
    if first is not None and not _is_true(first):
        checks += [(leaf, True) for leaf in _leaves(first)]
    if _identity_source(cond_out) is not loop.body.inputs[1]:
        checks += [(leaf, False) for leaf in _leaves(cond_out)]
    counted: list[Counted] = []
    for leaf, initial in checks:
        verdict = _leaf_verdict(loop, leaf, initial)
        if isinstance(verdict, Refusal):
            return verdict
        if verdict is not None:
            counted.append(verdict)
    if len({c.to for c in counted}) > 1:
        return Refusal(f"Loop {_label(node)}: the condition compares in two floating types")
    # the largest offset is the first leaf to turn false: to() does not decrease
    return Conditions(loop, max(counted, key=lambda c: c.offset, default=None))


def condition_refusal(node: ir.Node, main_graph: ir.Graph | None = None) -> Refusal | None:
    """Why ``node`` (a ``Loop``)'s conditions are left as they are (see
    :func:`read_conditions`); None when :class:`LoopConditionPass` makes them true."""
    found = read_conditions(node, main_graph)
    return found if isinstance(found, Refusal) else None


def _is_true(value: ir.Value) -> bool:
    array = const_array(value)
    return array is not None and array.size == 1 and bool(array.reshape(()))


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


@dataclasses.dataclass
class ConditionsMadeTrue:
    """``node``'s initial condition ``first`` and its body's ``cond_out`` were replaced
    by ``constant`` (a ``Constant`` node) and ``identity`` (``Identity(cond_in)``);
    ``count``: the step count that replaced its trip count ``trips`` (None: kept);
    ``unread``: what computed them alone, put back with them."""

    node: ir.Node
    first: ir.Value | None
    constant: ir.Node | None
    cond_out: ir.Value
    identity: ir.Node | None
    unread: list[Unread]
    trips: ir.Value | None = None
    count: StepCount | None = None

    def undo(self, original: Container[ir.Node]) -> bool:
        del original
        node, identity, constant = self.node, self.identity, self.constant
        graph = node.graph
        if graph is None:
            return False  # a rule replaced the Loop
        body = node.attributes["body"].as_graph()
        if identity is not None and body.outputs[0] is not identity.outputs[0]:
            return False
        if constant is not None and node.inputs[1] is not constant.outputs[0]:
            return False
        if self.count is not None and node.inputs[0] is not self.count.value:
            return False
        if not all(unread.restorable() for unread in self.unread):
            return False
        for unread in self.unread:
            unread.restore(node)
        if identity is not None:
            body.outputs[0] = self.cond_out
            body.remove(identity, safe=True)
        if constant is not None and self.first is not None:
            node.replace_input_with(1, self.first)
            graph.remove(constant, safe=True)
        if self.count is not None:
            node.replace_input_with(0, self.trips)
            self.count.remove()
        return True


class LoopConditionPass(NodePass):
    """Every Loop condition provably true before the last iteration, made constant true,
    a float one against the trip count replaced by the count of steps it lets run (see
    the module docstring); ``journal`` records each, to put back where no rule used it."""

    op_type = "Loop"

    def start(self, model: ir.Model) -> None:
        self.model = model
        #: the first Loop (in graph order) that read each trip count or first condition
        #: replaced: one two Loops share is put back before the first (see ``_loop``)
        self._first_reader: dict[ir.Value, ir.Node] = {}
        self._taken = taken_names(model)  # the model's value names, and those given

    def edit(self, node: ir.Node, model: ir.Model) -> bool:
        return self._loop(node, model)

    def _name(self, base: str) -> str:
        name = free_name(self._taken, base)
        self._taken.add(name)
        return name

    def _count(self, node: ir.Node, found: Conditions) -> StepCount | Refusal | None:
        """The step count replacing ``node``'s trip count (None: none needed)."""
        counted, model = found.counted, self.model
        if counted is None:
            return None
        assert node.graph is not None
        opset = opset_version(model, node.graph)
        if isinstance(opset, Refusal) or opset < 11:
            return Refusal(f"Loop {_label(node)}: opset {opset} has no Range to count its steps")
        trips = found.loop.trips
        trips_type = found.loop.types(trips)
        return emit_step_count(
            node, trips, trips_type, counted.offset, counted.to, model.graph, self._taken
        )

    def _loop(self, node: ir.Node, model: ir.Model) -> bool:
        attr = node.attributes.get("body")
        graph = node.graph
        if attr is None or attr.type != ir.AttributeType.GRAPH or graph is None:
            return False
        found = read_conditions(node, model.graph)
        if isinstance(found, Refusal):
            return False
        count = self._count(node, found)
        if isinstance(count, Refusal):
            self.refuse(node, count)
            return False
        body = attr.as_graph()
        first = node.inputs[1] if len(node.inputs) > 1 else None
        trips = node.inputs[0]
        for value in (first, trips):
            if value is not None:
                self._first_reader.setdefault(value, node)
        if count is not None:
            node.replace_input_with(0, count.value)
        constant = None
        if first is not None and not _is_true(first):
            constant = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(True))})
            constant.outputs[0].name = self._name(f"{first.name or 'cond'}_true")
            graph.insert_before(node, constant)
            node.replace_input_with(1, constant.outputs[0])
        cond_out, cond_in = body.outputs[0], body.inputs[1]
        identity = None
        if _identity_source(cond_out) is not cond_in:
            identity = ir.node("Identity", [cond_in])
            identity.outputs[0].name = self._name(f"{cond_out.name or 'cond'}_true")
            identity.outputs[0].type, identity.outputs[0].shape = cond_out.type, cond_out.shape
            body.append(identity)
            body.outputs[0] = identity.outputs[0]
        if constant is None and identity is None:
            assert count is None  # a count comes from a condition
            return False
        if self.journal is not None:
            unread = [Unread.of(cond_out, body, None)] if identity is not None else []
            if constant is not None and first is not None:
                unread.append(Unread.of(first, graph, self._first_reader[first]))
            if count is not None and trips is not None:
                unread.append(Unread.of(trips, graph, self._first_reader[trips]))
            edit = ConditionsMadeTrue(node, first, constant, cond_out, identity, unread)
            edit.trips, edit.count = trips, count
            self.record(edit)
        return True
