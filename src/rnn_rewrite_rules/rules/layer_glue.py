"""Collapse Transpose/Squeeze/Unsqueeze/Reshape chains after an RNN to the fewest equal nodes.

Pattern: a chain ``Y -> op_1 -> ... -> op_n`` of ``Transpose``, ``Squeeze``,
``Unsqueeze``, ``Reshape`` and ``Identity`` nodes starting at an output of an
``LSTM``/``GRU``/``RNN``/``DynamicQuantizeLSTM`` node, rooted at its last node, or
such a chain feeding an RNN's ``X`` (the two ``Transpose(1,0,2)`` that a batch-first
input and the ``layout`` rule leave), for example tf2onnx's
``Transpose(2,1,0,3) -> Squeeze(1) -> Transpose(1,0,2)``, keras'
``Squeeze(1) -> Transpose -> Transpose``, TorchScript's batch-first
``Transpose(0,2,1,3) -> Reshape([0,0,-1]) -> Transpose(1,0,2)``.

Condition: each intermediate value has exactly one reader (so the chain dies) and
the chain's effect is proven symbolically. The tensor is tracked as a list of axis
groups of ``Y`` (``Y``'s sizes from the shape prover, ``rnn_rewrite_rules.shape``: ``D``
and ``H`` are numbers, ``seq`` and ``batch`` are symbols): ``Transpose`` permutes groups,
``Squeeze`` may only drop provably unit groups, ``Unsqueeze`` inserts them, and a
``Reshape`` target (constant, or computed from ``Shape``) must partition the
flattened axes into runs whose sizes equal its elements (``0`` copies, one ``-1``
takes the rest). A target element that is a number where a symbolic axis sits (an
axis frozen at export) fails the proof, so such chains are never touched. Two chains
with the same order of non-unit axes and the same output sizes compute the same
tensor (a reshape keeps the row-major order).

Replacement: at most one ``Transpose`` of ``Y`` (only if non-unit axes move) and one
``Squeeze``/``Unsqueeze``/``Reshape`` whose target uses ``0`` and ``-1`` for the
symbolic axes, so dynamic axes stay dynamic; applied only when that is fewer nodes
than the chain (a computed Reshape target counts as one more node, and a last
``Transpose`` read only by ``Reduce*``/``ArgMax``/``ArgMin`` nodes counts as none: ONNX
Runtime's transpose optimizer moves it past them, where it vanishes, and the collapsed
chain hands the reduction another layout: a ``ReduceMean`` over axis 1 of ``[1, T, C]``
measured 12x slower in ONNX Runtime 1.32 than over axis 0 of ``[T, 1, C]``).

A second rule, ``SplitLayerStates``, takes the glue before a stack's initial states:
TorchScript's per-layer ``Slice(h0, [l*D], [(l+1)*D], [0])`` of one ``[L*D, batch, H]``
input become one ``Split`` (pattern, condition, replacement and measurement in
``rules._split_reads``; its scope in the class).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import MatchContext, MatchResult, RewriteRule, RewriteRuleClassBase

from rnn_rewrite_rules._ir import const_array, opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules._rnn_ops import rnn_op
from rnn_rewrite_rules.rules._family import RuleFamily
from rnn_rewrite_rules.rules._graph import int64_constant, read_axes
from rnn_rewrite_rules.rules._rnn_node import keep_identity
from rnn_rewrite_rules.rules._split_reads import SplitReads
from rnn_rewrite_rules.shape import ONE, Dim, ShapeProver, known, normalize_axes, product
from rnn_rewrite_rules.shape.values import is_all_zeros

__all__ = ["FAMILY", "CollapseRnnGlue", "SplitLayerStates", "make_rules"]


_GLUE_OPS = ("Transpose", "Squeeze", "Unsqueeze", "Reshape", "Identity")
_MAX_CHAIN = 8

#: A group of Y's non-unit axes, flattened in order; () is a unit dimension.
Group = tuple[int, ...]


def _product(group: Group, sizes: list[Dim]) -> Dim:
    return product(sizes[axis] for axis in group)


def _step(
    node: ir.Node, groups: list[Group], sizes: list[Dim], prover: ShapeProver
) -> list[Group] | Refusal:
    """The groups after ``node``, or why its effect cannot be proven."""
    op_type = node.op_type
    if op_type == "Identity":
        return groups
    if op_type == "Transpose":
        perm_attr = node.attributes.get("perm")
        perm = list(perm_attr.as_ints()) if perm_attr else list(reversed(range(len(groups))))
        if sorted(perm) != list(range(len(groups))):
            return Refusal("Transpose perm does not match the rank")
        return [groups[p] for p in perm]
    if op_type in ("Squeeze", "Unsqueeze"):
        axes = read_axes(node, prover.ints)
        if axes is None:
            return Refusal(f"{op_type} axes are not constant")
        if op_type == "Squeeze":
            squeezed = normalize_axes(axes, len(groups))
            if squeezed is None or any(groups[a] for a in squeezed):
                return Refusal("Squeeze of an axis that is not provably 1")
            return [g for i, g in enumerate(groups) if i not in squeezed]
        inserted = normalize_axes(axes, len(groups) + len(axes))
        if inserted is None:
            return Refusal("Unsqueeze axes out of range or repeated")
        result = list(groups)
        for a in sorted(inserted):
            result.insert(a, ())
        return result
    # Reshape
    terms = prover.vector(node.inputs[1]) if len(node.inputs) > 1 else None
    if terms is None or None in terms:
        return Refusal("Reshape target is not a provable shape computation")
    allowzero = node.attributes.get_int("allowzero", 0)
    wanted: list[Dim | None] = []
    for i, term in enumerate(terms):
        assert term is not None
        if term.value == 0:
            if allowzero or i >= len(groups):
                return Refusal("Reshape target has a 0 that does not copy an axis")
            term = _product(groups[i], sizes)
        elif term.value is not None and term.value < 0:
            if term.value != -1 or None in wanted:
                return Refusal("Reshape target has a negative element other than one -1")
            term = None
        elif term.value is None and not allowzero and not term.positive:
            copy = _product(groups[i], sizes) if i < len(groups) else None
            if term != copy:  # a computed 0 copies the input's axis instead
                return Refusal(
                    "Reshape target has a computed element that may be 0 and copy an axis"
                )
        wanted.append(term)
    flat = [a for g in groups for a in g]
    unknown = wanted.index(None) if None in wanted else len(wanted)
    head, tail = known(wanted[:unknown]), known(wanted[unknown + 1 :])
    if head is None or tail is None:  # never: a second -1 is refused above
        return Refusal("Reshape target has more than one -1")
    left = _consume(flat, list(head), sizes)
    if isinstance(left, Refusal):
        return left
    taken = sum(len(g) for g in left)
    if unknown == len(wanted):
        return left if taken == len(flat) else Refusal("Reshape target does not cover every axis")
    right = _consume(list(reversed(flat[taken:])), list(reversed(tail)), sizes)
    if isinstance(right, Refusal):
        return right
    right = [tuple(reversed(g)) for g in reversed(right)]
    middle = tuple(flat[taken : len(flat) - sum(len(g) for g in right)])
    return [*left, middle, *right]


def _consume(flat: list[int], wanted: list[Dim], sizes: list[Dim]) -> list[Group] | Refusal:
    """Split a prefix of ``flat`` into runs of the wanted sizes."""
    groups: list[Group] = []
    position = 0
    for want in wanted:
        run: list[int] = []
        size = ONE
        while size != want:
            if position >= len(flat) or want.divide(size) is None:
                return Refusal(
                    "Reshape target element is not a product of the input's axes (frozen?)"
                )
            run.append(flat[position])
            size = size * sizes[flat[position]]
            position += 1
        if want.divide(size) is None:
            return Refusal("Reshape target element is not a product of the input's axes (frozen?)")
        groups.append(tuple(run))
    return groups


def _removal(longer: list[Group], shorter: list[Group]) -> list[int] | None:
    """Indices of unit groups whose removal from ``longer`` leaves ``shorter``."""
    removed, j = [], 0
    for i, group in enumerate(longer):
        if j < len(shorter) and group == shorter[j]:
            j += 1
        elif group == ():
            removed.append(i)
        else:
            return None
    return removed if j == len(shorter) else None


def _one_op(base: list[Group], goal: list[Group], sizes: list[Dim]) -> tuple[str, list[int]] | None:
    """One Squeeze / Unsqueeze / constant Reshape from ``base`` to ``goal`` (same flat order)."""
    if base == goal:
        return ("", [])
    squeezed = _removal(base, goal)
    if squeezed is not None:
        return ("Squeeze", squeezed)
    unsqueezed = _removal(goal, base)
    if unsqueezed is not None:
        return ("Unsqueeze", unsqueezed)
    target: list[int] = []
    for i, group in enumerate(goal):
        size = _product(group, sizes)
        if group and i < len(base) and base[i] == group:
            target.append(0)  # copy: keeps a dynamic axis dynamic
        elif size.value is not None:
            target.append(size.value)
        elif -1 not in target:
            target.append(-1)
        else:
            return None
    if -1 in target:
        # -1 next to a zero-sized element fails at run time: only when the others are > 0
        others = [
            _product(base[i], sizes) if v == 0 else Dim.const(v)
            for i, v in enumerate(target)
            if v != -1
        ]
        if not product(others).positive:
            return None
    return ("Reshape", target)


def _realize(
    sizes: list[Dim], goal: list[Group]
) -> tuple[list[int] | None, tuple[str, list[int]]] | None:
    """The cheapest (perm or None, second op) computing ``goal`` from ``Y``."""
    rank = len(sizes)
    units = [a for a in range(rank) if sizes[a] == ONE]
    base: list[Group] = [() if sizes[a] == ONE else (a,) for a in range(rank)]
    order = [a for g in goal for a in g]
    if order == [a for a in range(rank) if a not in units]:
        second = _one_op(base, goal, sizes)
        if second is not None:
            return None, second
    candidates = []
    spare = list(units)
    aligned: list[int] = []
    for group in goal:
        if group:
            aligned.extend(group)
        elif spare:
            aligned.append(spare.pop(0))
    candidates += [aligned + spare, spare + aligned]
    candidates.append(order + units)
    best = None
    for perm in candidates:
        if sorted(perm) != list(range(rank)) or perm == list(range(rank)):
            continue
        transposed: list[Group] = [() if sizes[a] == ONE else (a,) for a in perm]
        second = _one_op(transposed, goal, sizes)
        if second is not None and (best is None or _cost(None, second) < _cost(None, best[1])):
            best = (perm, second)
    return best


def _cost(perm: list[int] | None, second: tuple[str, list[int]]) -> int:
    return (perm is not None) + bool(second[0])


def _only_shape_readers(value: ir.Value, others: int) -> bool:
    """``value`` has ``others`` readers that are not ``Shape`` nodes (only its shape is read
    by the rest: a Reshape target computed from the tensor's own shape)."""
    count = sum(not (u.node.domain == "" and u.node.op_type == "Shape") for u in value.uses())
    return count == others


_MAX_DYING = 64

#: Readers ONNX Runtime's transpose optimizer moves a Transpose past (onto their reduced
#: output): a chain's last Transpose read only by these costs nothing there.
_TRANSPOSE_SINKS = frozenset(
    {
        "ArgMax",
        "ArgMin",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceProd",
        "ReduceSum",
        "ReduceSumSquare",
    }
)


def _sunk(node: ir.Node) -> bool:
    """``node`` is a Transpose whose every reader is a reduction it is moved past."""
    out = node.outputs[0]
    readers = out.uses()
    return (
        node.op_type == "Transpose"
        and bool(readers)
        and not out.is_graph_output()
        and all(
            u.node.domain == "" and u.node.op_type in _TRANSPOSE_SINKS and u.idx == 0
            for u in readers
        )
    )


def _dying(chain: list[ir.Node]) -> set[ir.Node]:
    """The nodes that die when the chain's last output is replaced: the chain's and those
    computing its nodes' other inputs (Reshape targets, Squeeze axes) whose every reader
    dies (a fixpoint). At most ``_MAX_DYING`` nodes are looked at: of a longer target
    computation, only the part nearest the chain is found to die."""
    candidates: list[ir.Node] = list(chain)
    for node in chain:
        stack = list(node.inputs[1:])
        while stack and len(candidates) < _MAX_DYING:
            value = stack.pop()
            producer = None if value is None else value.producer()
            if producer is None or producer in candidates:
                continue
            candidates.append(producer)
            stack.extend(producer.inputs)
    dying = {chain[-1]}
    changed = True
    while changed:
        changed = False
        for node in candidates:
            if node in dying or any(out.is_graph_output() for out in node.outputs):
                continue
            if all(use.node in dying for out in node.outputs for use in out.uses()):
                dying.add(node)
                changed = True
    return dying


def _chain_back(root: ir.Node, x: ir.Value, prover: ShapeProver) -> tuple[list[ir.Node], ir.Value]:
    """The glue nodes ending at ``root`` (which reads ``x``), first to last, and the value
    the first reads: back to an RNN output, a value other nodes read or a non-glue op, at
    most ``_MAX_CHAIN`` nodes."""
    chain = [root]
    value = x
    while True:
        producer = value.producer()
        if producer is not None and not isinstance(rnn_facts(producer, prover), str):
            break
        if (
            producer is None
            or producer.domain != ""
            or producer.op_type not in _GLUE_OPS
            or not _only_shape_readers(value, 1)
            or value.is_graph_output()
            or len(chain) >= _MAX_CHAIN
        ):
            break
        source = producer.inputs[0]
        if source is None:
            break
        chain.insert(0, producer)
        value = source
    return chain, value


def _chain_rank(y: ir.Value, out: ir.Value, prover: ShapeProver) -> int | Refusal:
    """The rank of ``y``, the chain's input: an RNN's ``Y`` (4) or ``Y_h``/``Y_c`` (3),
    else the proven rank where the chain (ending at ``out``) feeds RNNs' ``X`` only (its
    input glue); else why the chain is not the rule's."""
    facts = rnn_facts(y.producer(), prover)
    if not isinstance(facts, Refusal):
        return 4 if y is facts.node.outputs[0] else 3
    readers = tuple(out.uses())
    feeds_rnn = readers and all(
        use.idx == 0 and not isinstance(rnn_facts(use.node, prover), str) for use in readers
    )
    if not feeds_rnn or out.is_graph_output():
        return Refusal("chain neither starts at an RNN output nor feeds X")
    y_rank = prover.rank(y)
    if y_rank is None:
        return Refusal("rank of the chain's input is unknown")
    return y_rank


def _cost_of_chain(chain: list[ir.Node], dying: set[ir.Node]) -> int:
    """The nodes the rewrite removes: the chain's that die (one another reader keeps, a
    Shape that lives on, does not), and a dying Reshape's runtime target computation."""
    cost = 0
    for node in chain:
        if node not in dying:
            continue  # another reader (a Shape that lives on) keeps it
        cost += 1
        if node.op_type == "Reshape":
            target = node.inputs[1]
            if target is not None and const_array(target) is None and target.producer() in dying:
                cost += 1  # its runtime target computation dies with it
    return cost


class CollapseRnnGlue(RewriteRuleClassBase):
    """Chain of Transpose/Squeeze/Unsqueeze/Reshape from Y -> at most Transpose + one reshape."""

    def __init__(self, op_type: str) -> None:
        super().__init__(name=f"CollapseRnnGlue[{op_type}]")
        self.op_type = op_type

    def pattern(self, op, x):
        return getattr(op, self.op_type)(x, _allow_other_inputs=True, _allow_other_attributes=True)

    def check(self, context: MatchContext, x: ir.Value, **_: Any) -> MatchResult:
        check_result = MatchResult()
        prover = ShapeProver(context.model.graph)
        root = context.root
        out = root.outputs[0]
        readers = tuple(out.uses())
        next_glue = [
            use
            for use in readers
            if use.node.domain == "" and use.node.op_type in _GLUE_OPS and use.idx == 0
        ]
        if len(next_glue) == 1 and not out.is_graph_output() and _only_shape_readers(out, 1):
            return check_result.fail("the chain goes on: rewritten at its last node", out)
        chain, y = _chain_back(root, x, prover)
        rank = _chain_rank(y, out, prover)
        if isinstance(rank, Refusal):
            return check_result.fail(rank, y)
        dims = prover.dims(y)
        assert dims is not None and len(dims) == rank
        sizes = list(dims)
        groups: list[Group] = [() if sizes[a] == ONE else (a,) for a in range(rank)]
        dying = _dying(chain)
        for node in chain:
            result = _step(node, groups, sizes, prover)
            if isinstance(result, Refusal):
                return check_result.fail(result, node)
            groups = result
        old_cost = _cost_of_chain(chain, dying)
        sunk = root in dying and _sunk(root)
        old_cost -= sunk
        plan = _realize(sizes, groups)
        if plan is None:
            reason = "no constant-target realization keeps the axes dynamic"
            return check_result.fail(reason, context.root)
        perm, second = plan
        new_cost = _cost(perm, second)
        keep_name = out.is_graph_output() or y.is_graph_output() or y.is_graph_input()
        if new_cost == 0 and keep_name:
            new_cost = 1  # an Identity keeps both names
        if new_cost >= old_cost:
            reason = f"already minimal ({old_cost} nodes, best {new_cost})"
            if sunk:
                reason += (
                    "; the last Transpose is not counted: ONNX Runtime moves it past the"
                    f" {readers[0].node.op_type} that reads it"
                )
            return check_result.fail(reason, context.root)
        self._plan = (y, perm, second)
        opset = opset_version(context.model, context.graph_or_function)
        if isinstance(opset, Refusal):
            return check_result.fail(opset, context.root)
        self._opset = opset
        self._main_graph = context.graph_or_function is context.model.graph
        self._graph = context.graph_or_function
        self._keep_name = keep_name
        self._root = root
        return check_result

    def rewrite(self, op, x: ir.Value, **_):
        y, perm, (kind, values) = self._plan
        current = y
        if perm is not None:
            current = op.Transpose(current, perm=perm)
        if kind in ("Squeeze", "Unsqueeze"):
            if self._opset >= 13:
                current = getattr(op, kind)(
                    current, int64_constant(op, self._graph, values, as_node=not self._main_graph)
                )
            else:
                current = getattr(op, kind)(current, axes=values)
        elif kind == "Reshape":
            current = op.Reshape(
                current, int64_constant(op, self._graph, values, as_node=not self._main_graph)
            )
        if current is y and self._keep_name:
            current = op.Identity(y)
        if current is not y:
            keep_identity(current.producer(), self._root)
        return current


class SplitLayerStates(SplitReads):
    """Slice(h0, [l*D], [(l+1)*D]) per layer -> one Split(h0) (see ``rules._split_reads``).

    Scope: every Slice of the value is read only as an RNN node's initial state
    (TorchScript's per-layer ``h0``/``c0`` of a stacked ``[L*D, batch, H]`` input), and
    the value is not provably zeros (those states are ``initial_state``'s
    ``ShareZeroInitialState`` and ``DropZeroInitialState``, which remove the Slices altogether)."""

    def scope(
        self, v: ir.Value, slices: list[ir.Node], axis: int, prover: ShapeProver
    ) -> Refusal | None:
        if is_all_zeros(v):
            return Refusal("the stacked states are zeros: the zero-state rules take them")
        for node in slices:
            uses = list(node.outputs[0].uses())
            if not uses:
                return Refusal("a Slice of the value is not read")
            for use in uses:
                spec = rnn_op(use.node)
                if spec is None or use.idx not in spec.state_inputs:
                    return Refusal("a Slice of the value is read other than as an initial state")
        return None


def make_rules() -> list[RewriteRule]:
    return [*(CollapseRnnGlue.rule(op_type) for op_type in _GLUE_OPS), SplitLayerStates.rule()]


FAMILY = RuleFamily(
    name="layer_glue",
    description=(__doc__ or "").partition("\n")[0],
    make_rules=make_rules,
    install_by_default=True,
    fixes=("runtime-shape-chain",),
)
