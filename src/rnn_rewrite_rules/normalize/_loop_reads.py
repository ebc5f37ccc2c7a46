"""What the proof of a ``Loop``'s conditions (``_condition_proof``) reads of the
Loop: values through the ``Cast``\\ s that keep integers exact, ``And`` trees of
``Less``/``Greater`` leaves, constants, the step number and counters, and each carried
input that passes through the body (an invariant) as the outer value it is."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._values import ElementTypes
from rnn_rewrite_rules.normalize.no_op_cast import holds_exactly
from rnn_rewrite_rules.shape import ShapeProver

__all__ = [
    "LoopReads",
    "Read",
    "comparison",
    "exact_digits",
    "identity_source",
    "is_true",
    "label",
    "leaves",
    "read_loop",
    "scalar_number",
]

#: Integers a floating type holds exactly: every one of magnitude up to 2**digits.
_EXACT_DIGITS = {ir.DataType.FLOAT16: 11, ir.DataType.FLOAT: 24, ir.DataType.DOUBLE: 53}


def label(node: ir.Node) -> str:
    return f"'{node.name}'" if node.name else f"a {node.op_type}"


@dataclasses.dataclass
class Read:
    """A value read through ``Cast``\\ s: its ``base`` and the narrowest floating ``Cast``
    on the way (None: integers throughout)."""

    base: ir.Value
    float_cast: ir.Node | None = None


def _through_casts(value: ir.Value, types: ElementTypes) -> Read:
    """``value`` without the ``Cast``\\ s above it that keep every integer value exact
    below a floating type's range (integer widening, or to a floating type: recorded)."""
    read = Read(value)
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
                if known is None or digits < exact_digits(known):
                    read.float_cast = node
            elif not holds_exactly(frm, to):
                return read
        read.base = source


def exact_digits(cast: ir.Node) -> int:
    """How many binary digits of an integer the floating type ``cast`` writes holds exactly."""
    return _EXACT_DIGITS[ir.DataType(cast.attributes.get_int("to", 0))]


def leaves(value: ir.Value) -> Iterator[ir.Value]:
    """The operands of the ``And`` tree ``value`` is (``value`` itself when none)."""
    node = value.producer()
    if node is not None and node.op_type == "And" and node.domain == "" and len(node.inputs) == 2:
        for operand in node.inputs:
            if operand is not None:
                yield from leaves(operand)
    else:
        yield value


def comparison(value: ir.Value) -> tuple[ir.Value, ir.Value] | None:
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


def scalar_number(value: ir.Value) -> float | None:
    """A constant scalar's value (an integer or floating one: tf2onnx starts at ``0.0``)."""
    array = const_array(value)
    if array is None or array.size != 1 or array.dtype.kind not in "iuf":
        return None
    number = float(array.reshape(()))
    return number if np.isfinite(number) else None


@dataclasses.dataclass
class LoopReads:
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

    def bound(self, value: ir.Value) -> Read | Refusal:
        """``value``, an invariant of the loop, as the outer value it is."""
        read = _through_casts(value, self.types)
        outer = self.invariants.get(read.base, read.base)
        if outer is not read.base:
            again = _through_casts(outer, self.types)
            read = Read(again.base, read.float_cast or again.float_cast)
        producer = read.base.producer()
        if read.base in self.body.inputs or (producer is not None and producer.graph is self.body):
            return Refusal(
                f"Loop {label(self.node)}: the condition compares with a value it computes"
            )
        return read

    def step(self, value: ir.Value) -> tuple[int, Read] | Refusal:
        """``(offset, read)`` when ``value`` is ``k + offset`` after step ``k``."""
        read = Read(value)
        offset, current = 0, value
        while True:
            inner = _through_casts(current, self.types)
            current = inner.base
            if inner.float_cast is not None and (
                read.float_cast is None
                or exact_digits(inner.float_cast) < exact_digits(read.float_cast)
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
                    f"Loop {label(self.node)}: the condition reads more than the step number"
                )
            pairs = [(node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])]
            for operand, constant in pairs:
                added = None if constant is None else _scalar_int(constant)
                if operand is not None and added is not None:
                    offset, current = offset + added, operand
                    break
            else:
                return Refusal(
                    f"Loop {label(self.node)}: the condition reads more than the step number"
                )


def read_loop(
    node: ir.Node, types: ElementTypes, prover: ShapeProver, trips: ir.Value | None = None
) -> LoopReads | Refusal:
    """What the proofs read of ``node`` (a ``Loop``); ``trips``: the value taken as its
    trip count (default: its ``M``), against which a counter's type must not wrap."""
    attr = node.attributes.get("body")
    if attr is None or attr.type != ir.AttributeType.GRAPH:
        return Refusal("the Loop has no body")
    body = attr.as_graph()
    initial = list(node.inputs[2:])
    carried_in, carried_out = list(body.inputs[2:]), list(body.outputs[1:])
    if trips is None and node.inputs:
        trips = node.inputs[0]
    if trips is None or len(carried_in) != len(initial):
        return Refusal(f"Loop {label(node)}: it has no trip count")
    if len(carried_out) < len(initial):
        return Refusal(f"Loop {label(node)}: the body does not match it")
    read = _through_casts(trips, types)
    invariants: dict[ir.Value, ir.Value] = {}
    counters: dict[ir.Value, int] = {}
    for v0, v_in, v_out in zip(initial, carried_in, carried_out, strict=False):
        if v0 is None:
            continue
        source = identity_source(v_out)
        start = _scalar_int(v0)
        if source is v_in:
            invariants[v_in] = v0
        elif start is not None and _is_increment(source, v_in) and _holds(types, v_in, read.base):
            counters[v_in] = start
    return LoopReads(node, body, read.base, invariants, counters, types, prover)


def _holds(types: ElementTypes, counter: ir.Value, trips: ir.Value) -> bool:
    """The counter's type holds every value of the trip count's (no wrap before it)."""
    counter_type, trips_type = counter.dtype, types(trips)
    return (
        counter_type is not None
        and trips_type is not None
        and holds_exactly(trips_type, counter_type)
    )


def identity_source(value: ir.Value) -> ir.Value:
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


def is_true(value: ir.Value) -> bool:
    array = const_array(value)
    return array is not None and array.size == 1 and bool(array.reshape(()))
