"""When the lean zero-step guard of a Loop over ``X``'s length gives the Loop's stack of no
step, shape included, in ONNX Runtime.

What ONNX Runtime does (``loop.cc``, 1.32): a Loop that runs no step outputs each scan
output with the shape ``(0, *dims)``, ``dims`` being the shape ONNX Runtime holds for the
body's scan output, a symbolic or unknown size read as 0, ``(0,)`` with no shape at all.
The shape it holds is the body output's declaration merged with its own inference of the
body (which its graph optimisations redo): inference fills an axis the declaration leaves
without a number, and a number it infers against another declared one is merged by a
rule that differs by optimisation level (measured: ``[1, H]`` declared, ``h`` declared
``[2, H]``: ``(0, 2, H)`` optimised, ``(0, 0, H)`` not).

The lean guard's pass-through Loop declares its stack as the original body's scan output
and its state with no shape, so ONNX Runtime holds the declaration for it (inference of an
``Identity`` of a shapeless state adds nothing). The two are equal when the original's
inference adds no number to the declaration and contradicts none of its numbers; the
checks below prove that from the graph:

- the stack is declared with rank 2 and ``H`` (the cell's hidden size) as its last axis:
  inference of the body gives that axis ``H`` or nothing (``H`` is what the cell computes),
  never another number; left undeclared, inference fills it from the weights, or not,
  depending on the body's form and the optimisation level (h4's jax2onnx measurements);
- the batch axis: inference of the body can get a number for it only from a number it
  knows for ``X``'s batch (``Gather(X, t)``), for the initial states (proven to have
  ``X``'s batch, and computed from ``X``'s shape or graph inputs of the same size), or
  from the declarations of the body's state inputs. So the numbers inference may know
  for ``X``'s batch (:func:`_inferred_numbers`) must be none or the declared number: a
  graph input's size that is no number gives none (the model runs at more than one batch:
  a number inferred for it would be wrong at another, and ONNX's inference propagates a
  symbol, not a number); an ``If`` output's size only a number both branches may give
  (a second layer reading the first layer's guard; at a fixed batch 1, that 1); an axis
  a ``Transpose``, ``Identity`` or ``Slice`` of other axes reads, the numbers of the axis
  read; and each state input declared with rank 2 must declare on each axis nothing or
  the stack's own number.

Where every check holds, the original gives ``(0, b, H)`` with ``b`` the declared batch
number or 0, and so does the guard. A stack of no step read twice (two scan outputs both
``h_t``) comes from one pass-through: their declarations must then give one shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.rules.cell import through_identity
from rnn_rewrite_rules.shape import Dim, ShapeProver

__all__ = [
    "EXACT_BRANCH_REASON",
    "EXACT_FORM",
    "ZERO_STEP_REASON",
    "batch_dim",
    "exact_branch_reason",
    "is_zero_step_loop",
    "through_transposes",
    "zero_step_reason",
    "zero_tests",
]

#: The cost table's form of the exact guard (``costs/exact_zero_step.json``).
EXACT_FORM = "exact_zero_step"

#: Why a Loop in the zero-step branch of its own guard is kept (the survey counts it as a
#: Loop left in an exact zero-step branch).
EXACT_BRANCH_REASON = (
    "exact zero-step branch: the Loop is the branch of an If that runs only where its trip"
    " count is 0 or X is empty, kept as written there (only it gives its stack of no step"
    " as ONNX Runtime shapes it, and it runs at batch 0 where ONNX Runtime's LSTM and GRU"
    " abort); the If's other branch runs the steps"
)

#: The refusal's text; ``why`` names the declaration or size that leaves the shape open.
ZERO_STEP_REASON = (
    "the trip count is X's length, which can be 0, and at 0 ONNX Runtime shapes the {loop}'s"
    " stack of no step from its inference of the body where the body's scan output {stack}"
    " leaves it open: {why}"
)


#: ``If`` outputs followed back to a graph input's size (one per guarded layer below).
_MAX_IF_DEPTH = 8


def _spelling(value: ir.Value) -> str:
    """A declaration as written: ``[?, 8]``, ``[batch, 8]``, or ``no shape``."""
    if value.shape is None:
        return "no shape"
    dims = [d if isinstance(d, int) else (d.value or "?") for d in value.shape]
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _number(dim: object) -> int | None:
    return dim if isinstance(dim, int) else None


def _stack_reason(stack: ir.Value, hidden: int) -> str | None:
    """Why ``stack``'s declaration does not fix its last axis as ``hidden``."""
    shape = stack.shape
    if shape is None or len(shape) != 2:
        return f"its rank is not declared 2 ({_spelling(stack)})"
    if _number(shape[1]) != hidden:
        return f"its last axis is not declared {hidden}, the hidden size ({_spelling(stack)})"
    return None


def _inferred_numbers(
    dim: Dim | None, model: ir.Model, prover: ShapeProver, depth: int = 0
) -> frozenset[int] | None:
    """The numbers ONNX's inference may know for ``dim`` (a superset), None where
    unbounded: a number is itself; a main-graph input's size that is no number gives
    none (the model runs at more than one size: a number inferred for it would be wrong
    at another, and inference propagates a symbol, not a number); an axis read from
    another (:func:`_read_axis`) gives what that gives; an ``If`` output's size gives
    the numbers every branch may give that are bounded, since inference of an ``If``
    keeps a number only where both branches infer that number (the guard ``loop_scan``
    writes around a first layer gives the second layer's ``X`` such a batch, and a third
    layer's reads the second's through a Slice of steps and tf2onnx's Transpose pair)."""
    if dim is not None and dim.value is not None:
        return frozenset({dim.value})
    symbol = None if dim is None else dim.symbol
    if symbol is None or symbol.narrowed or depth > _MAX_IF_DEPTH:
        return None
    if symbol.value in model.graph.inputs:
        shape = symbol.value.shape
        declared = None if shape is None or symbol.axis >= len(shape) else shape[symbol.axis]
        return frozenset({declared}) if isinstance(declared, int) else frozenset()
    read = _read_axis(symbol.value, symbol.axis)
    if read is not None:
        dim = prover.dim(*read) or Dim.sym(*read)
        return _inferred_numbers(dim, model, prover, depth + 1)
    bounded = []
    for branch in prover.branch_dims(symbol.value):
        size = None if branch is None or symbol.axis >= len(branch) else branch[symbol.axis]
        numbers = _inferred_numbers(size, model, prover, depth + 1)
        if numbers is not None:
            bounded.append(numbers)
    return frozenset.intersection(*bounded) if bounded else None


def _read_axis(value: ir.Value, axis: int) -> tuple[ir.Value, int] | None:
    """The input and axis ``value``'s ``axis`` is read from by its ``Transpose`` (with a
    ``perm``), ``Identity`` or ``Slice`` of other constant ``axes``, else None: ONNX's
    inference knows a number for such an axis only where it knows one for the axis read
    (it permutes, copies or keeps it, or leaves it unknown)."""
    node = value.producer()
    if node is None or node.domain != "" or not node.inputs or node.inputs[0] is None:
        return None
    if node.op_type in ("Identity", "Transpose"):
        moved = _moved_axis(node, axis)
        return None if moved is None else (node.inputs[0], moved)
    if node.op_type != "Slice":
        return None
    axes: Sequence[int] | None
    if len(node.inputs) > 1:  # axes absent: the first len(starts), not known here
        listed = const_array(node.inputs[3]) if len(node.inputs) > 3 else None
        axes = None if listed is None else [int(a) for a in listed.reshape(-1)]
    else:
        axes = node.attributes.get_ints("axes", None)
    if axes is None or any(a < 0 for a in axes):  # a negative axis may be ``axis``
        return None
    return None if axis in axes else (node.inputs[0], axis)


def _batch_reason(
    batch: Dim | None, declared: int | None, model: ir.Model, prover: ShapeProver
) -> str | None:
    """Why ONNX Runtime's inference may know a number for X's batch other than
    ``declared`` (None: the declaration gives no number)."""
    if batch is not None and batch.value is not None:
        if batch.value == declared:
            return None
        if declared is None:
            return f"X's batch is the number {batch.value}, which inference fills in"
        return f"X's batch is the number {batch.value}, not the declared {declared}"
    numbers = _inferred_numbers(batch, model, prover)
    if numbers is None:
        return "X's batch is not a graph input's size, so inference may know it as a number"
    extra = sorted(numbers - {declared})
    if extra:
        return f"inference may know X's batch as the number {extra[0]}" + (
            ", which the declaration leaves open"
            if declared is None
            else f", not the declared {declared}"
        )
    return None


def batch_dim(x: ir.Value, prover: ShapeProver) -> Dim | None:
    """``x``'s batch (axis 1) as the prover proves it, else, for ``x`` a ``Transpose`` (or
    ``Identity``) chain of an ``If`` output (tf2onnx's pair between two Keras layers), that
    output's axis the chain moves there: ONNX's inference permutes an axis it knows, so
    it knows ``x``'s batch as a number only where it knows that axis as one, which
    :func:`_inferred_numbers` reads from the ``If``'s branches."""
    dim = prover.dim(x, 1)
    if dim is not None:
        return dim
    value, axis = through_transposes(x, 1)
    if value is x or axis is None or not prover.branch_dims(value):
        return None
    return Dim.sym(value, axis)


#: ``Transpose``s (tf2onnx's pair between Keras layers) and ``Identity``s followed back.
_MAX_TRANSPOSES = 8


def through_transposes(value: ir.Value, axis: int | None = None) -> tuple[ir.Value, int | None]:
    """``value`` followed back through ``Transpose`` and ``Identity`` nodes (each gives as
    many elements as it reads, so ``value`` is empty exactly where the value reached is),
    and ``axis`` of ``value`` as an axis of the value reached (None where a ``Transpose``
    has no ``perm`` or ``axis`` is outside it, or none was asked)."""
    for _ in range(_MAX_TRANSPOSES):
        node = value.producer()
        if node is None or node.domain != "" or node.op_type not in ("Transpose", "Identity"):
            break
        source = node.inputs[0] if node.inputs else None
        if source is None:
            break
        axis = None if axis is None else _moved_axis(node, axis)
        value = source
    return value, axis


def _moved_axis(node: ir.Node, axis: int) -> int | None:
    """The input axis that ``node`` (an ``Identity`` or ``Transpose``) moves to ``axis``:
    the same for an ``Identity``, ``perm[axis]`` for a ``Transpose`` (None without a
    ``perm`` or ``axis`` outside it)."""
    if node.op_type == "Identity":
        return axis
    perm = node.attributes.get_ints("perm", None)
    return None if perm is None or axis >= len(perm) else perm[axis]


def _state_reason(state: ir.Value, stack: tuple[int | None, int]) -> str | None:
    """Why ``state``'s declaration may give inference a number the stack's lacks."""
    shape = state.shape
    if shape is None:
        return None
    if len(shape) != 2:
        return f"the body's state input {state.name} is declared {_spelling(state)}, not rank 2"
    for axis, (dim, want) in enumerate(zip(shape, stack, strict=True)):
        number = _number(dim)
        if number is not None and number != want:
            return (
                f"the body's state input {state.name} declares axis {axis} as {number}"
                f" ({_spelling(state)}), which inference carries to the stack"
            )
    return None


def zero_step_reason(
    node: ir.Node,
    stacks: Sequence[ir.Value],
    states: Sequence[ir.Value],
    batch: Dim | None,
    hidden: int,
    model: ir.Model,
    prover: ShapeProver,
) -> Refusal | None:
    """Why the lean guard of Loop ``node`` may not give its stack of no step as ONNX
    Runtime does (see the module docstring), or None: ``stacks`` are the body's read scan
    outputs that stack ``h_t``, ``states`` the body's ``h``/``c`` inputs, ``batch`` X's
    batch as ``prover`` proves it."""
    loop = f"Loop {node.name or '(unnamed)'}"
    shapes: set[tuple[int | None, int]] = set()
    for stack in stacks:
        why = _stack_reason(stack, hidden)
        if why is None:
            assert stack.shape is not None
            declared = _number(stack.shape[0])
            why = _batch_reason(batch, declared, model, prover)
            shapes.add((declared, hidden))
            for state in states:
                why = why or _state_reason(state, (declared, hidden))
        if why is not None:
            return Refusal(ZERO_STEP_REASON.format(loop=loop, stack=stack.name, why=why))
    if len(shapes) > 1:
        return Refusal(f"the {loop}'s scan outputs of h_t are declared with different shapes")
    return None


def is_zero_step_loop(node: ir.Node) -> bool:
    """``node`` is the ``Loop`` of a lean zero-step guard (``_common._empty_stack``): a
    body of three ``Identity`` nodes passing one state through and stacking it. It holds
    no cell: it gives the stack of no step its shape, in the guard's branch taken where
    ``X`` is empty (at length 0 it runs no step; at batch 0 it stacks the empty state)."""
    if (node.domain, node.op_type) != ("", "Loop") or len(node.inputs) != 3:
        return False
    body = node.attributes.get("body")
    if body is None or body.type != ir.AttributeType.GRAPH:
        return False
    graph = body.as_graph()
    nodes = list(graph)
    if len(nodes) != 3 or len(graph.inputs) != 3 or len(graph.outputs) != 3:
        return False
    if any((inner.domain, inner.op_type) != ("", "Identity") for inner in nodes):
        return False
    _, cond, state = graph.inputs
    sources = [through_identity(v) for v in graph.outputs]
    return sources == [cond, state, state]


def _guard_of(graph: ir.Graph | None, model: ir.Model) -> ir.Node | None:
    """The ``If`` whose ``then_branch`` is ``graph``, else None."""
    for node in model.graph.all_nodes():
        if node.op_type != "If" or node.domain != "":
            continue
        attr = node.attributes.get("then_branch")
        if attr is not None and attr.type == ir.AttributeType.GRAPH and attr.as_graph() is graph:
            return node
    return None


def _zero_test(test: ir.Value | None, prover: ShapeProver) -> ir.Value | None:
    """``n`` where ``test`` is ``Equal(n, 0)`` (either order), else None."""
    node = None if test is None else test.producer()
    if node is None or (node.domain, node.op_type) != ("", "Equal") or len(node.inputs) != 2:
        return None
    for count, zero in (node.inputs, node.inputs[::-1]):
        if prover.ints(zero) == [0]:
            return count
    return None


def zero_tests(condition: ir.Value | None, prover: ShapeProver) -> list[ir.Value | None]:
    """``n`` for each ``Equal(n, 0)`` of ``condition`` (one, or an ``Or`` of two; None
    for a test of another form): what a zero-step guard tests against 0."""
    node = None if condition is None else condition.producer()
    tests: list[ir.Value | None] = [condition]
    if node is not None and (node.domain, node.op_type) == ("", "Or") and len(node.inputs) == 2:
        tests = list(node.inputs)
    return [_zero_test(test, prover) for test in tests]


def _sizes_tested(loop: ir.Node, condition: ir.Value, prover: ShapeProver) -> list[str | None]:
    """What each ``Equal(n, 0)`` of ``condition`` (one, or an ``Or`` of two) tests:
    ``"steps"`` where ``n`` is the Loop's trip count, ``"empty"`` where ``n`` is
    ``Size(v)`` of a value the Loop reads whose length is its trip count, or not proven
    another (a second layer's ``X`` from the guard before it has no rank the prover
    proves for every run), else None."""
    trips = prover.elements(loop.inputs[0])
    found: list[str | None] = []
    for count in zero_tests(condition, prover):
        size = None if count is None else count.producer()
        if count is not None and trips is not None and prover.elements(count) == trips:
            found.append("steps")
        elif (
            size is not None
            and (size.domain, size.op_type) == ("", "Size")
            and size.inputs[0] in loop.inputs[1:]
        ):
            length = prover.dim(size.inputs[0], 0)
            unknown = trips is None or None in trips or length is None
            found.append("empty" if unknown or (length,) == trips else None)
        else:
            found.append(None)
    return found


def exact_branch_reason(node: ir.Node, model: ir.Model) -> Refusal | None:
    """Why Loop ``node`` is kept: it is the ``then_branch`` of an ``If`` whose condition
    is ``Equal(n, 0)``, ``n`` the Loop's trip count (its elements, as the shape prover
    proves them, a scalar or ``[n]``) or ``Size(v)`` of a value ``v`` the Loop reads whose
    length is its trip count, or an ``Or`` of two such: so it runs only where it runs no
    step or reads an empty value, as the exact zero-step guard writes it
    (``_common._guard_condition``), where only the Loop itself gives its outputs (or
    runs at all: ONNX Runtime's LSTM and GRU abort at batch 0). Rewriting it again would
    nest guards without end."""
    guard = _guard_of(node.graph, model)
    if guard is None or not guard.inputs or guard.inputs[0] is None or not node.inputs:
        return None
    prover = ShapeProver(model.graph)
    tested = _sizes_tested(node, guard.inputs[0], prover)
    if None in tested:
        return None
    return Refusal(EXACT_BRANCH_REASON)
