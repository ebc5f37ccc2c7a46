"""Read a sequence a ``Loop`` collects step by step as a scan output (TorchScript's
``torch.jit.script``ed cell loops collect with ``SequenceInsert``).

Pattern: ``Loop(M, cond, ..., s0, ...)`` with ``s0 = SequenceEmpty()``; its body appends
one value per step, ``s_out = SequenceInsert(s_in, y_t)`` (no position), and the final
sequence ``s`` is read after the Loop by one ``ConcatFromSequence(s, axis=0,
new_axis=1)``, or by ``ConcatFromSequence(s, axis=0)`` where ``y_t = Unsqueeze(z_t, [0])``.
Condition: the body reads ``s_in`` in that ``SequenceInsert`` alone and reads ``s_out``
nowhere (it is only the carried output); nothing but the ``ConcatFromSequence`` reads the
final ``s``. Anything else is left as written, the reason recorded (``refusals``).
Replacement: the same Loop (name, doc string, metadata) without the carried sequence and
with one more scan output, ``y_t`` (``z_t``), read in place of the ``ConcatFromSequence``
under its name; an ``Identity`` gives the scan output where ``y_t`` is not a value the
body computes (an input, an outer value) or is already an output of it.
Equality: ``SequenceInsert`` without a position appends and nothing else reads or writes
``s``, so by induction after ``k`` steps ``s`` is ``[y_0, ..., y_(k-1)]``.
``ConcatFromSequence(axis=0, new_axis=1)`` stacks them on a new first axis, which is what a
Loop's scan output is; both need every ``y_t`` of one shape (ONNX Runtime's Loop fails
otherwise, as the Concat does). In the ``Unsqueeze`` form the pieces are ``[1, ...]``
concatenated on axis 0: the stack of the ``z_t``, which Concat, like the scan output, needs
of one shape. At zero steps ``s`` is empty and ``ConcatFromSequence`` fails (ONNX Runtime
1.32: "Must have 1 or more inputs"; ``onnx.reference`` too), so the original fails there;
the rewrite gives an empty stack, as the equality rule allows where the original fails.

onnx-ir and onnxscript have no such pass; the Loop rules (``loop_scan``) read scan
outputs, hence this pass, which every Loop rule gets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Sequence

import onnx_ir as ir

from rnn_rewrite_rules._ir import const_array, free_name, taken_names
from rnn_rewrite_rules._refusal import Refusal
from rnn_rewrite_rules.normalize._journal import Journal
from rnn_rewrite_rules.normalize._values import model_graphs

__all__ = [
    "STACK_FAILS_WITHOUT_STEPS",
    "Collected",
    "SequenceScanPass",
    "stack_fails_without_steps",
]

#: Key of ``ir.Node.meta`` (kept in memory, never written) set on a Loop this pass made
#: when the model fails wherever it runs no step (see :func:`stack_fails_without_steps`).
STACK_FAILS_WITHOUT_STEPS = "rnn_rewrite_rules.stack_fails_without_steps"


def _label(node: ir.Node) -> str:
    return f"'{node.name}'" if node.name else node.op_type


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = None if value is None else value.producer()
    if node is None or node.domain != "" or node.op_type != op_type:
        return None
    return node


@dataclasses.dataclass
class _Found:
    """Carried value ``index`` of a Loop is a sequence ``insert`` fills with ``element``
    (its scan output), read by ``concat`` alone."""

    index: int
    insert: ir.Node
    concat: ir.Node
    element: ir.Value


def _unsqueezed(value: ir.Value) -> ir.Value | None:
    """``z`` when ``value`` is ``Unsqueeze(z, [0])`` (axes an input or an attribute)."""
    node = _producer(value, "Unsqueeze")
    if node is None or not node.inputs or node.inputs[0] is None:
        return None
    attr = node.attributes.get("axes")
    axes: list[int] | None = None
    if attr is not None:
        axes = list(attr.as_ints())
    elif len(node.inputs) > 1:
        array = const_array(node.inputs[1])
        axes = None if array is None else [int(a) for a in array.reshape(-1)]
    return node.inputs[0] if axes == [0] else None


def _element(concat: ir.Node, y_t: ir.Value) -> ir.Value | Refusal:
    """What the scan output stacks for ``concat`` reading the collected ``y_t``."""
    axis = concat.attributes.get_int("axis", None)
    new_axis = concat.attributes.get_int("new_axis", 0)
    if axis == 0 and new_axis == 1:
        return y_t
    if axis == 0 and new_axis == 0:
        inner = _unsqueezed(y_t)
        if inner is not None:
            return inner
        return Refusal(
            f"{_label(concat)} concatenates on axis 0 without new_axis and the collected"
            f" {y_t.name} is not Unsqueeze(z, [0]): not a stack of the steps"
        )
    return Refusal(
        f"{_label(concat)} concatenates on axis {axis} (new_axis={new_axis}): not a stack"
        " on a new first axis, which a scan output is"
    )


def _collected(node: ir.Node, body: ir.Graph, index: int) -> _Found | Refusal | None:
    """Carried value ``index`` of ``node`` as a collected sequence (see the module
    docstring), why not, or None when the body does not append to it."""
    s_in, s_out = body.inputs[2 + index], body.outputs[1 + index]
    insert = _producer(s_out, "SequenceInsert")
    if insert is None or not insert.inputs or insert.inputs[0] is not s_in:
        return None
    if len(insert.inputs) > 2 and insert.inputs[2] is not None:
        return Refusal(
            f"{_label(insert)} inserts at a position: only appending (no position) collects"
            " the steps in order"
        )
    start = node.inputs[2 + index]
    if _producer(start, "SequenceEmpty") is None:
        return Refusal(f"the sequence {_label(insert)} appends to does not start empty")
    readers = [user for user, _ in s_in.uses() if user is not insert]
    if readers or s_out.uses() or list(body.outputs).count(s_out) != 1:
        return Refusal(
            f"the body reads the sequence {s_in.name} that {_label(insert)} appends to"
            " besides appending: not a scan output"
        )
    uses = list(node.outputs[index].uses())
    concat = uses[0][0] if len(uses) == 1 and uses[0][1] == 0 else None
    if (
        concat is None
        or concat.op_type != "ConcatFromSequence"
        or concat.domain != ""
        or concat.graph is not node.graph
        or node.outputs[index].is_graph_output()
    ):
        return Refusal(
            f"the sequence {_label(insert)} collects is read otherwise than by one"
            " ConcatFromSequence after the Loop"
        )
    y_t = insert.inputs[1]
    if y_t is None:
        return Refusal(f"{_label(insert)} appends no value")
    element = _element(concat, y_t)
    if isinstance(element, Refusal):
        return element
    return _Found(index, insert, concat, element)


def stack_fails_without_steps(node: ir.Node) -> bool:
    """``node`` (a Loop this pass made) is one whose original fails wherever it runs no
    step: its ``ConcatFromSequence`` of the empty sequence ran (ONNX Runtime: "Must have
    1 or more inputs"), since it computed a model output or a value one is computed from
    in the model's graph, and a run computes every model output. A rule replacing it may
    then run where the Loop ran no step (the equality rule: where the original fails, the
    rewrite may run), without a zero-step guard."""
    return bool(node.meta.get(STACK_FAILS_WITHOUT_STEPS, False))


def _computes_an_output(node: ir.Node, model: ir.Model) -> bool:
    """``node`` is in the model's graph and computes a model output or a value one is
    computed from there (values read only inside a subgraph, which may not run, do not
    count)."""
    if node.graph is not model.graph:
        return False
    pending = list(node.outputs)
    seen = set(pending)
    while pending:
        current = pending.pop()
        if current.is_graph_output():
            return True
        for user, _ in current.uses():
            if user.graph is model.graph:
                fresh = [v for v in user.outputs if v not in seen]
                seen.update(fresh)
                pending += fresh
    return False


def _move(old: ir.Value, new: ir.Value) -> None:
    """``new`` takes ``old``'s readers, graph-output places, name and declaration."""
    name = old.name
    new.type, new.shape = old.type, old.shape
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    old.name, new.name = None, name


@dataclasses.dataclass
class Collected:
    """Loop ``old`` became ``new`` (see the module docstring): ``s_in`` and ``y_t`` are
    what ``found.insert`` read; ``pairs`` each old value and the one that took its place
    (``concat``'s output and the scan output last); ``helper``: the body's ``Identity``
    giving the scan output ``scan``, if made."""

    graph: ir.Graph | ir.Function
    old: ir.Node
    old_inputs: Sequence[ir.Value | None]
    new: ir.Node
    found: _Found
    s_in: ir.Value
    y_t: ir.Value
    scan: ir.Value
    helper: ir.Node | None
    pairs: Sequence[tuple[ir.Value, ir.Value]]
    #: the body node after ``found.insert`` (it goes back before it), if any
    follower: ir.Node | None = None

    def undo(self, original: Container[ir.Node]) -> bool:
        del original  # a rule that used the scan output replaced the Loop
        graph, new, body = self.graph, self.new, _body(self.new)
        if new.graph is not graph or body is None or body.outputs[-1] is not self.scan:
            return False
        self._restore_body(body)
        index, old = self.found.index, self.old
        graph.insert_before(new, old)
        for i, value in enumerate(self.old_inputs):
            old.replace_input_with(i, value)
        start = self.old_inputs[2 + index]
        made = None if start is None else start.producer()
        if made is not None and made.graph is None:  # dropped by a cleanup meanwhile
            graph.insert_before(old, made)
        concat = self.found.concat
        graph.insert_after(old, concat)
        concat.replace_input_with(0, old.outputs[index])
        for value, replacement in self.pairs:
            _move(replacement, value)
        graph.remove(new, safe=True)
        return True

    def _restore_body(self, body: ir.Graph) -> None:
        index, insert = self.found.index, self.found.insert
        del body.outputs[-1]
        if self.helper is not None:
            body.remove(self.helper, safe=True)
        body.inputs.insert(2 + index, self.s_in)
        if self.follower is not None and self.follower.graph is body:
            body.insert_before(self.follower, insert)
        else:
            body.append(insert)
        insert.replace_input_with(0, self.s_in)
        insert.replace_input_with(1, self.y_t)
        body.outputs.insert(1 + index, insert.outputs[0])


def _body(node: ir.Node) -> ir.Graph | None:
    attr = node.attributes.get("body")
    if attr is None or attr.type != ir.AttributeType.GRAPH:
        return None
    return attr.as_graph()


def _scan_value(
    body: ir.Graph, element: ir.Value, taken: set[str]
) -> tuple[ir.Value, ir.Node | None]:
    """The body output to stack: ``element``, or an ``Identity`` of it where it is not a
    value the body computes or is already an output (ONNX Runtime needs a node there)."""
    made = element.producer()
    if made is not None and made.graph is body and not element.is_graph_output():
        return element, None
    helper = ir.Node("", "Identity", [element], name=free_name(taken, "SequenceScan_Identity"))
    scan = helper.outputs[0]
    scan.name = free_name(taken, f"{element.name or 'element'}_scan")
    taken.update((helper.name or "", scan.name))
    scan.type, scan.shape = element.type, element.shape
    body.append(helper)
    return scan, helper


def _rewrite(node: ir.Node, body: ir.Graph, found: _Found, model: ir.Model) -> Collected:
    """Replace ``node`` by the Loop stacking ``found.element`` (see the module docstring)."""
    graph = node.graph
    assert graph is not None
    index, insert = found.index, found.insert
    s_in, y_t = body.inputs[2 + index], insert.inputs[1]
    assert y_t is not None
    scan, helper = _scan_value(body, found.element, taken_names(model))
    nodes = list(body)
    after = nodes.index(insert) + 1
    follower = nodes[after] if after < len(nodes) else None
    del body.outputs[1 + index]
    body.remove(insert, safe=True)
    del body.inputs[2 + index]
    body.outputs.append(scan)
    old_inputs = list(node.inputs)
    attributes = [
        ir.Attr(name, ir.AttributeType.GRAPH, body) if name == "body" else attr
        for name, attr in node.attributes.items()
    ]
    new = ir.Node(
        "",
        "Loop",
        [*old_inputs[: 2 + index], *old_inputs[3 + index :]],
        attributes,
        num_outputs=len(node.outputs),
        name=node.name,
        doc_string=node.doc_string,
        metadata_props=dict(node.metadata_props),
        version=node.version,
    )
    graph.insert_before(node, new)
    if _computes_an_output(found.concat, model):
        new.meta[STACK_FAILS_WITHOUT_STEPS] = True
    kept = [v for k, v in enumerate(node.outputs) if k != index]
    pairs = [*zip(kept, new.outputs[:-1], strict=True), (found.concat.outputs[0], new.outputs[-1])]
    for old, replacement in pairs:
        _move(old, replacement)
    if new.outputs[-1].type is None:
        new.outputs[-1].type = scan.type
    graph.remove([found.concat, node], safe=True)
    return Collected(graph, node, old_inputs, new, found, s_in, y_t, scan, helper, pairs, follower)


class SequenceScanPass(ir.passes.InPlacePass):
    """Every sequence a Loop collects step by step for one ``ConcatFromSequence`` becomes
    a scan output (see the module docstring); ``journal`` records each, to put back
    where no rule used it."""

    def __init__(self, journal: Journal | None = None) -> None:
        super().__init__()
        self.journal = journal
        #: (Loop name, reason) for each sequence a Loop appends to, left as written
        self.refusals: list[tuple[str, Refusal]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for graph in model_graphs(model):
            for node in list(graph):
                if node.op_type == "Loop" and node.domain == "" and node.graph is graph:
                    modified |= self._loop(node, model)
        return ir.passes.PassResult(model, modified=modified)

    def _loop(self, node: ir.Node, model: ir.Model) -> bool:
        body = _body(node)
        if body is None or len(body.inputs) != len(node.inputs):
            return False
        modified, index = False, 0
        while index < len(node.inputs) - 2 and 1 + index < len(body.outputs):
            found = _collected(node, body, index)
            if not isinstance(found, _Found):
                if found is not None:
                    self.refusals.append((node.name or "", found))
                index += 1
                continue
            edit = _rewrite(node, body, found, model)
            if self.journal is not None:
                self.journal.record(edit)
            node, modified = edit.new, True
        return modified
