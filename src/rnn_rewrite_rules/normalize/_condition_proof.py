"""The proof :class:`~rnn_rewrite_rules.normalize.loop_condition.LoopConditionPass`
rests on: each leaf of a ``Loop``'s conditions is true wherever the Loop has an iteration
left, or (a float comparison with the trip count beyond its exact range) monotone, so it
counts the steps run. The argument is in ``loop_condition``'s docstring."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._loop_reads import (
    LoopReads,
    Read,
    comparison,
    exact_digits,
    identity_source,
    is_true,
    label,
    leaves,
    read_loop,
    scalar_number,
)
from rnn_rewrite_rules.normalize._values import ElementTypes
from rnn_rewrite_rules.shape import ShapeProver

__all__ = ["Conditions", "Counted", "condition_refusal", "read_conditions"]

#: Floating types whose comparisons ONNX Runtime runs as written (float16: Less runs in
#: float32 between inserted Casts, so its steps differ from a float16 count).
_COUNTED = frozenset((ir.DataType.FLOAT, ir.DataType.DOUBLE))


@dataclasses.dataclass(frozen=True)
class Counted:
    """A body leaf ``Less(to(k + offset), to(n))`` (``offset <= 1``, ``to`` a floating
    type, ``n`` the trip count) that is not proven exact: the Loop then runs
    ``#{j in 0..n-1 : to(j - 1 + offset) < to(n)}`` steps (see ``loop_condition``'s
    docstring), which ``LoopConditionPass`` computes as its trip count."""

    offset: int
    to: ir.DataType


def _leaf_verdict(loop: LoopReads, leaf: ir.Value, initial: bool) -> Refusal | Counted | None:
    """None when ``leaf`` is true wherever the loop has an iteration left (see
    ``loop_condition``'s docstring); :class:`Counted` when it is monotone against the trip count in
    floating point; else why not, naming the node."""
    found = comparison(leaf)
    where = "initial condition" if initial else "condition"
    name = label(loop.node)
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
            f" ({label(cast)}) beyond its exact range; ONNX Runtime has no Less kernel of"
            " it and compares in another type, so its steps are not counted"
        )
    return Counted(offset, _to(cast))


def _to(cast: ir.Node) -> ir.DataType:
    return ir.DataType(cast.attributes.get_int("to", 0))


def _initial_reason(loop: LoopReads, a: ir.Value, bound: Read) -> Refusal | None:
    """None when the initial leaf ``a < bound`` is true whenever the Loop runs a step."""
    name = label(loop.node)
    start = scalar_number(a)
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


def _exact_reason(
    loop: LoopReads, offset: int, bound: Read, cast: ir.Node | None
) -> Refusal | None:
    """None when the body leaf ``k + offset < bound`` (compared through ``cast``) is
    true after every step but the last, from a known trip count and bound."""
    name = label(loop.node)
    trips, limit = loop.integer(loop.trips), loop.integer(bound.base)
    if trips is None or limit is None:
        if cast is not None:
            return Refusal(
                f"Loop {name}: the condition compares in floating point ({label(cast)}):"
                f" exact only below 2**{exact_digits(cast)}, and its bound is not a constant"
            )
        return Refusal(f"Loop {name}: the condition is not against its trip count")
    if trips < 2:
        return None  # no condition is read before the last iteration
    last = trips - 2 + offset  # the step value after the last iteration but one
    if cast is not None and max(abs(last), abs(limit)) > 2 ** exact_digits(cast):
        return Refusal(
            f"Loop {name}: the condition compares in floating point ({label(cast)})"
            f" beyond 2**{exact_digits(cast)}, where integers round"
        )
    if last < limit:
        return None
    return Refusal(f"Loop {name}: the condition is false after step {trips - 2}: it ends early")


@dataclasses.dataclass
class Conditions:
    """What the proof found of one Loop's conditions: ``counted``, the body leaf that
    decides how many steps run when one compares in floating point beyond its exact
    range (None: every leaf is true before the last iteration)."""

    loop: LoopReads
    counted: Counted | None


def read_conditions(node: ir.Node, main_graph: ir.Graph | None = None) -> Conditions | Refusal:
    """Why ``node`` (a ``Loop``)'s conditions are neither provably true wherever it has
    an iteration left nor a count of its steps; else what was proven. ``main_graph``: the
    model's graph, whose inputs' declared sizes are facts (a static sequence length
    makes the bound a constant)."""
    types = ElementTypes()
    loop = read_loop(node, types, ShapeProver(main_graph))
    if isinstance(loop, Refusal):
        return loop
    first = node.inputs[1] if len(node.inputs) > 1 else None
    cond_out = loop.body.outputs[0]
    checks: list[tuple[ir.Value, bool]] = []
    if first is not None and not is_true(first):
        checks += [(leaf, True) for leaf in leaves(first)]
    if identity_source(cond_out) is not loop.body.inputs[1]:
        checks += [(leaf, False) for leaf in leaves(cond_out)]
    counted: list[Counted] = []
    for leaf, initial in checks:
        verdict = _leaf_verdict(loop, leaf, initial)
        if isinstance(verdict, Refusal):
            return verdict
        if verdict is not None:
            counted.append(verdict)
    if len({c.to for c in counted}) > 1:
        return Refusal(f"Loop {label(node)}: the condition compares in two floating types")
    # the largest offset is the first leaf to turn false: to() does not decrease
    return Conditions(loop, max(counted, key=lambda c: c.offset, default=None))


def condition_refusal(node: ir.Node, main_graph: ir.Graph | None = None) -> Refusal | None:
    """Why ``node`` (a ``Loop``)'s conditions are left as they are (see
    :func:`read_conditions`); None when :class:`LoopConditionPass` makes them true."""
    found = read_conditions(node, main_graph)
    return found if isinstance(found, Refusal) else None
