"""Whether the exact zero-step guard of a Loop over ``X``'s length is no slower, from its
measured table (``costs/exact_zero_step.json``, ``python -m
benchmarks.exact_zero_step_costs``; beside initial states whose batch is not proven
``X``'s, with their broadcast: ``costs/exact_broadcast.json``, ``python -m
benchmarks.exact_zero_step_costs --broadcast``).

The guard ``If(Size(X) == 0, the Loop as written, the node)`` runs the node wherever
``X`` is not empty, and the Loop, behind an ``If``, where it is (length or batch 0). So
it fires where the table says it is no slower (:meth:`costs.CostTable.decide`) at every
measured length from 1 (the length is symbolic: each must agree), and where, at length
0, the time it adds to a call (the ``If`` around a Loop that runs no step) is at most
the time it saves on a call of length 1, the least it saves once a step runs: on every
runtime of the target, at every batch and hidden size measured. Measured on jax2onnx's
files (ONNX Runtime 1.32, one thread, hidden 8): 1.16x-1.30x of a 9-12 us call at
length 0 (+2.0 to +3.3 us, against 3.0-5.4 us saved at length 1), 0.74x-0.82x at 1,
0.22x-0.35x at 8, 0.05x-0.12x at 64.
"""

from __future__ import annotations

from rnn_rewrite_rules import costs

__all__ = ["EXACT_BROADCAST_FORM", "EXACT_COST_REASON", "guard_cost_reason"]

#: The cost-table form of the exact guard beside initial states of a batch not proven
#: ``X``'s (the Expands broadcasting them and ``X`` in the node's branch).
EXACT_BROADCAST_FORM = "exact_broadcast"

#: The refusal where the table says the guard is slower (``why``: the decision's reason).
EXACT_COST_REASON = (
    "the Loop runs {cell} cell over X's length and carries X around it: its exact"
    " zero-step guard (the Loop kept for length 0) is not no slower: {why}"
)


def _zero_reason(table: costs.CostTable, runtimes: list[str], op: str, form: str) -> str | None:
    """Why the guard's cost at length 0 is more than it saves at length 1 (on a runtime,
    batch and hidden size measured at both), or None."""
    at: dict[tuple, costs.Point] = {}
    for point in table.points:
        if point.op == op and point.form == form and point.runtime in runtimes:
            at[point.runtime, point.hidden, point.batch, point.model, point.seq] = point
    for (runtime, hidden, batch, model, seq), zero in at.items():
        one = at.get((runtime, hidden, batch, model, 1))
        if seq != 0 or one is None:
            continue
        added = (zero.ratio - 1) * zero.original_us
        saved = (1 - one.ratio) * one.original_us
        if added > saved:
            return (
                f"at length 0 it adds {added:.1f} us a call ({zero.ratio:.2f}x of"
                f" {zero.original_us:.0f} us, {costs.RUNTIMES[runtime]}, hidden {hidden},"
                f" batch {batch}), more than the {saved:.1f} us it saves at length 1"
            )
    return None


def guard_cost_reason(
    context: costs.Context, target: str, op: str, hidden: int, batch: int | None, form: str
) -> str | None:
    """Why the guarded form ``form`` of a Loop running an ``op`` cell of ``hidden`` units
    over a batch ``batch`` (None: symbolic) is not no slower on ``target`` (see the
    module), or None: it fires."""
    if context.ignore:
        return None
    table = context.table_for(form)
    lengths = [seq for seq in table.lengths(op, form) if seq > 0]
    if not lengths:
        return f"no measurement of the {op} form"
    for seq in lengths:
        decision = table.decide(target, op, hidden, seq, batch, "forward", form)
        if not decision.fires:
            return decision.reason
    runtimes = [r for r in costs.TIMED_RUNTIMES[target] if r in table.runtimes()]
    return _zero_reason(table, runtimes, op, form)
