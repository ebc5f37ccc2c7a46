"""Merge a forward and a reverse RNN node whose final states are concatenated (bidirectional
family).

Pattern: a forward and a ``direction="reverse"`` ``LSTM``/``GRU``/``RNN`` node on the same
``x``, ``Y`` concatenated as ``Concat(Squeeze(Yf, 1), Squeeze(Yr, 1), axis=-1)`` (or
``Concat(Yf, Yr, axis=1)``), and ``Y_h`` (``Y_c``) read as ``Concat(..., Y_h_f, Y_h_r, ...,
axis=0)``: torch's bidirectional ``nn.RNN`` once ``reroll`` has rerolled it (``h_n`` is
one Concat of every layer's pair), or a converter's pair.

Condition: the pair is one bidirectional layer as for ``MergeHandBuiltBidirectional``;
each state output of both nodes is unread, or read only by one ``Concat`` on the
direction axis (0, or -3 of the rank-3 state the shape prover gives) that takes the
forward node's state and right after it the reverse node's; that Concat comes after
``Y``'s (the merged node is inserted after ``Y``'s Concat).

Replacement: the merged ``direction="bidirectional"`` node (forward first), ``Y`` as
``MergeHandBuiltBidirectional`` gives it, and each read state pair as the two halves of
``Split(Y_h, axis=0)``; :class:`ConcatWholeSplit` then turns the Concat of the two halves
back into ``Y_h`` itself (``[2, batch, H]``, forward first: the pair's Concat).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from rnn_rewrite_rules._compat import emit_node
from rnn_rewrite_rules._ir import opset_version
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules._rnn import rnn_facts
from rnn_rewrite_rules._rnn_ops import rnn_op
from rnn_rewrite_rules.rules._forms import FormRule
from rnn_rewrite_rules.rules._graph import int64_constant, read_axes, same_value
from rnn_rewrite_rules.rules.bidirectional._pair import Half, emit_merged, pair_reason
from rnn_rewrite_rules.shape import Dim, ShapeProver, Sym

__all__ = ["ConcatWholeSplit", "MergeForwardReverse", "MergeForwardReverseY", "state_rules"]


def _axis(node: ir.Node, rank: int | None) -> int | None:
    """The Concat's or Split's axis, non-negative (None when the rank it needs is unknown)."""
    axis = node.attributes.get_int("axis", 0)
    if axis >= 0:
        return axis
    return None if rank is None or axis < -rank else axis + rank


def _single(dim: Dim | None) -> Sym | None:
    if dim is None or len(dim.terms) != 1:
        return None
    monomial, coef = dim.terms[0]
    return monomial[0] if coef == 1 and len(monomial) == 1 else None


def _same_dim(a: Dim | None, b: Dim | None, prover: ShapeProver, depth: int = 4) -> bool:
    """``a == b`` at every size: equal polynomials, or axes of two ``Expand`` outputs that
    broadcast pairwise equal sizes (the prover gives each Expand output its own symbol)."""
    if a is None or b is None:
        return False
    if a == b:
        return True
    sa, sb = _single(a), _single(b)
    if depth == 0 or sa is None or sb is None:
        return False
    ea, eb = sa.value.producer(), sb.value.producer()
    if ea is None or eb is None or sa.axis != sb.axis:
        return False
    if any(e.domain != "" or e.op_type != "Expand" for e in (ea, eb)):
        return False
    return _same_broadcast(ea, eb, sa.axis, prover, depth - 1)


def _same_broadcast(ea: ir.Node, eb: ir.Node, axis: int, prover: ShapeProver, depth: int) -> bool:
    """Axis ``axis`` of ``Expand`` outputs ``ea`` and ``eb``: the same broadcast of the same
    sizes (the data's axis and the target's element, right-aligned: 1 where padded; an
    element the prover does not follow is None, equal to nothing)."""
    operands = []
    for node in (ea, eb):
        dims, target = prover.dims(node.inputs[0]), prover.vector(node.inputs[1])
        if dims is None or target is None:
            return False
        rank = max(len(dims), len(target))
        data = dims[axis - (rank - len(dims))] if axis >= rank - len(dims) else Dim.const(1)
        wanted = target[axis - (rank - len(target))] if axis >= rank - len(target) else Dim.const(1)
        operands.append((rank, data, wanted))
    (rank_a, data_a, want_a), (rank_b, data_b, want_b) = operands
    return (
        rank_a == rank_b
        and _same_dim(data_a, data_b, prover, depth)
        and _same_dim(want_a, want_b, prover, depth)
    )


def same_input(a: ir.Value | None, b: ir.Value | None, prover: ShapeProver) -> bool:
    """``a`` and ``b`` are the same tensor: one computation (``same_value``), or ``Expand``
    of one value to targets that are equal element by element (reroll broadcasts ``X`` per
    direction to the batch of that direction's ``h_0``, two slices of one graph input)."""
    if a is None or b is None:
        return False
    if same_value(a, b):
        return True
    ea, eb = a.producer(), b.producer()
    if ea is None or eb is None or not same_value(ea.inputs[0], eb.inputs[0]):
        return False
    if any(e.domain != "" or e.op_type != "Expand" for e in (ea, eb)):
        return False
    targets = [prover.vector(e.inputs[1]) for e in (ea, eb)]
    if targets[0] is None or targets[1] is None or len(targets[0]) != len(targets[1]):
        return False
    return all(_same_dim(x, y, prover) for x, y in zip(*targets, strict=True))


def _position(graph: ir.Graph | ir.Function, *nodes: ir.Node) -> list[int]:
    order = {node: index for index, node in enumerate(graph)}
    return [order.get(node, -1) for node in nodes]


def state_reason(
    forward: ir.Value, reverse: ir.Value, root: ir.Node, graph, prover: ShapeProver
) -> Refusal | None:
    """Why the pair's state output (``Y_h`` or ``Y_c``) stops the merge (None: it does not).

    Unread on both nodes, or read only by one Concat on axis 0 as ``[forward, reverse]``
    after ``root``.
    """
    rnn = forward.producer()
    spec = rnn_op(rnn) if rnn is not None else None
    name = spec.outputs[forward.index() or 0] if spec else forward.name
    uses = [list(v.uses()) for v in (forward, reverse)]
    outputs = [v.is_graph_output() for v in (forward, reverse)]
    if not any(outputs) and not any(uses):
        return None
    if any(outputs) or [len(u) for u in uses] != [1, 1]:
        return Refusal(f"a half's {name} is read by something other than one Concat of the pair")
    (concat, index), (other, other_index) = uses[0][0], uses[1][0]
    if concat is not other or concat.domain != "" or concat.op_type != "Concat":
        return Refusal(f"the halves' {name} are not read by one Concat")
    if other_index != index + 1:
        return Refusal(
            f"the Concat does not read the forward {name} right before the reverse {name}"
        )
    axis = _axis(concat, prover.rank(forward))
    if axis != 0:
        attr = concat.attributes.get_int("axis", 0)
        return Refusal(f"the {name} Concat is on axis {attr}, not the direction axis 0")
    mine, theirs = _position(graph, root, concat)
    if theirs < 0:
        return Refusal(f"the {name} Concat is in a subgraph")
    if theirs < mine:
        return Refusal(f"the {name} Concat comes before the Y Concat")
    return None


class MergeForwardReverse(RewriteRuleClassBase):
    """Concat(Squeeze(RNN(x)), Squeeze(RNN(x, reverse))) and Concat(Y_h, Y_h) -> one node."""

    #: Y squeezed to ``[seq, batch, H]`` and concatenated on axis -1 (else ``[seq, 2, ...]``).
    squeezed = True

    def __init__(self, op_type: str, num_outputs: int) -> None:
        super().__init__(name=f"{type(self).__name__}[{op_type}/{num_outputs}]")
        self.op_type = op_type
        self.num_outputs = num_outputs

    def pattern(self, op, xf, xr):
        rnn = getattr(op, self.op_type)
        halves = []
        for tag, x in (("f", xf), ("r", xr)):
            outputs = rnn(x, _allow_other_inputs=True, _outputs=self._names(tag))
            halves.append(outputs)
        ys = [h[0] for h in halves]
        if self.squeezed:
            ys = [op.Squeeze(y, _allow_other_inputs=True) for y in ys]
        y = op.Concat(*ys)
        states = [h[k] for k in range(1, self.num_outputs) for h in halves]
        return [y, *states]

    def _names(self, tag: str) -> list[str]:
        return [f"{tag}{k}" for k in range(self.num_outputs)]

    def check(self, context, **bindings) -> MatchResult:
        # the matcher lets a node with fewer outputs than the pattern names through unbound
        names = ["xf", "xr", *self._names("f"), *self._names("r")]
        if any(bindings.get(name) is None for name in names):
            reason = f"an RNN node has fewer than {self.num_outputs} outputs"
            return MatchResult().fail(reason, context.root)
        xf, xr, f0, r0 = (bindings[name] for name in ("xf", "xr", "f0", "r0"))
        check_result = MatchResult()
        prover = ShapeProver(context.model.graph)
        root = context.root
        forward, backward = f0.producer(), r0.producer()
        assert forward is not None and backward is not None
        axis = root.attributes.get_int("axis", 0)
        if self.squeezed:
            if axis not in (2, -1):
                reason = "the halves are not concatenated on the feature axis"
                return check_result.fail(reason, root)
            for value in root.inputs:
                squeeze = value.producer() if value is not None else None
                assert squeeze is not None
                if read_axes(squeeze, prover.ints) not in ([1], [-3]):
                    reason = "the Squeeze does not remove the direction axis"
                    return check_result.fail(reason, squeeze)
        elif axis not in (1, -3):
            reason = "the halves are not concatenated on the direction axis"
            return check_result.fail(reason, root)
        halves = [Half(node, False, self.squeezed) for node in (forward, backward)]
        refusal = pair_reason(halves[0], halves[1], prover, states_read=True)
        if refusal is not None:
            return check_result.fail(refusal, backward)
        if not same_input(xf, xr, prover):
            return check_result.fail("the reverse RNN does not read the forward RNN's input", xr)
        graph = context.graph_or_function
        read = []
        for k in range(1, self.num_outputs):
            pair = bindings[f"f{k}"], bindings[f"r{k}"]
            refused = state_reason(*pair, root, graph, prover)
            if refused is not None:
                return check_result.fail(refused, pair[0])
            read.append(bool(pair[0].uses()))
        opset = opset_version(context.model, graph)
        if isinstance(opset, Refusal):
            return check_result.fail(opset, root)
        facts = rnn_facts(forward, prover)
        assert not isinstance(facts, Refusal)
        self._plan = (forward, backward, xf, 2 * facts.hidden_size, read, opset)
        self._graph = graph
        self._main_graph = graph is context.model.graph
        return check_result

    def rewrite(self, op, **bindings):
        forward, backward, x, width, read, opset = self._plan
        count = 1 + max((k + 1 for k, r in enumerate(read) if r), default=0)
        outputs = emit_merged(
            op, self._graph if self._main_graph else None, forward, backward, x, count
        )
        y = outputs[0]
        if self.squeezed:
            target = int64_constant(op, self._graph, [0, 0, width], as_node=not self._main_graph)
            y = op.Reshape(op.Transpose(y, perm=[0, 2, 1, 3]), target)
        result = [y]
        for k, is_read in enumerate(read, start=1):
            if not is_read:  # proven unread: nothing takes the place of the old values
                result += [bindings[f"f{k}"], bindings[f"r{k}"]]
                continue
            split = {"num_outputs": 2} if opset >= 18 else {}
            result += emit_node(op, "Split", [outputs[k]], {"axis": 0, **split}, domain="",
                                num_outputs=2)  # fmt: skip
        return result


class MergeForwardReverseY(MergeForwardReverse):
    """Concat(RNN(x), RNN(x, reverse), axis=1) and Concat(Y_h, Y_h) -> one node."""

    squeezed = False


class ConcatWholeSplit(RewriteRuleClassBase):
    """Concat(..., Split(v)[0], ..., Split(v)[n-1], ...) on Split's axis -> Concat(..., v, ...)."""

    def pattern(self, op):
        return op.Concat(_allow_other_inputs=True)

    def check(self, context, **_) -> MatchResult:
        check_result = MatchResult()
        root = context.root
        prover = ShapeProver(context.model.graph)
        runs, found = [], False
        index = 0
        while index < len(root.inputs):
            value = root.inputs[index]
            split = value.producer() if value is not None else None
            if split is None or split.domain != "" or split.op_type != "Split":
                index += 1
                continue
            found = True
            outputs = list(split.outputs)
            if (
                value is not outputs[0]
                or list(root.inputs[index : index + len(outputs)]) != outputs
            ):
                index += 1
                continue
            rank = prover.rank(split.inputs[0])
            if _axis(split, rank) is None or _axis(split, rank) != _axis(root, rank):
                index += 1
                continue
            runs.append((index, len(outputs), split.inputs[0]))
            index += len(outputs)
        if not runs:
            reason = "a Split's outputs are not concatenated whole, in order, on its axis"
            return check_result.fail(reason if found else "no input is a Split's output", root)
        self._plan = (list(root.inputs), runs, root.attributes.get_int("axis", 0), root.graph)
        return check_result

    def rewrite(self, op, **_):
        inputs, runs, axis, graph = self._plan
        starts = {start: (count, whole) for start, count, whole in runs}
        new: list[ir.Value | None] = []
        index = 0
        while index < len(inputs):
            count, whole = starts.get(index, (1, inputs[index]))
            new.append(whole)
            index += count
        if len(new) > 1:
            return op.Concat(*new, axis=axis)
        (whole,) = new
        assert whole is not None
        producer = whole.producer()
        outer = producer is not None and producer.graph is not graph
        if whole.is_graph_input() or whole.is_graph_output() or whole.is_initializer() or outer:
            # the rewriter would rename it to the Concat's output; a subgraph's output
            # must be computed in it
            return op.Identity(whole)
        return whole


def state_rules() -> list:
    """The merge rules (most outputs first, so that a read ``Y_c`` is seen) and the fold."""
    counts = {"LSTM": (3, 2), "GRU": (2,), "RNN": (2,)}
    merges = [
        FormRule(f"{cls.__name__}[{op}]", [cls.rule(op, n) for n in numbers])
        for cls in (MergeForwardReverse, MergeForwardReverseY)
        for op, numbers in counts.items()
    ]
    return [*merges, ConcatWholeSplit.rule()]
