"""Differential oracles: what a rewritten model must keep of the original.

:func:`check_case` rewrites a :class:`~.case.Case` with the public API
(``rnn_rewrite_rules.rewrite``) and returns every :class:`Failure`:

* ``crash``: the rewrite raised;
* ``checker``: the original passes ``onnx.checker.check_model(full_check=True)`` and the
  result does not;
* ``interface``: graph output names, count, element types or declared ranks changed;
* ``idempotent``: rewriting the result changes it again;
* ``runs``: the original runs at a size on a runtime (ONNX Runtime without graph
  optimizations, ``onnx.reference``) and the result does not;
* ``outputs``: on such a runtime, the outputs differ (dtype, shape, or values beyond a
  tolerance of the element type), at several sizes, 0 included where the runtime allows;
  unless the runtime computes the original wrongly and the result agrees with
  ``onnx.reference`` on the original (then ``Outcome.runtime_faults`` records it).

ONNX Runtime aborts the process on LSTM/GRU batch 0 and GRU seq 0: sizes with a 0 run
in-process only when neither model has a recurrent op, else in a child process
(``zero_in_child=True``) or not at all.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto
from onnx.reference.ops import op_loop as _op_loop
from onnx.reference.ops.op_loop import Loop as _ReferenceLoop

import rnn_rewrite_rules
from rnn_rewrite_rules.testing.fuzz.case import Case, fresh_names
from rnn_rewrite_rules.testing.fuzz.walk import all_nodes, has_recurrent_op

__all__ = ["RUNTIMES", "Failure", "Outcome", "blame", "check_case", "plans", "reference_evaluator"]

#: Where the result must run when the original does, and give its outputs.
RUNTIMES = ("onnxruntime", "reference")

#: (rtol, atol) per float element type.
_TOLERANCE = {np.float16: (2e-2, 2e-2), np.float32: (1e-4, 1e-5), np.float64: (1e-9, 1e-12)}
_VOCABULARY = 11  # token ids of the embedding cores index an 11-row table


@dataclasses.dataclass(frozen=True)
class Failure:
    """One oracle that failed and how."""

    oracle: str
    detail: str

    def __str__(self) -> str:
        return f"{self.oracle}: {self.detail}"


@dataclasses.dataclass
class Outcome:
    """What :func:`check_case` found: ``failures``, whether a rule changed the model, the
    runtimes the original runs on (``onnxruntime``, ``reference``), how many sizes were
    compared on each, and the runtimes' own faults on the original."""

    failures: list[Failure]
    fired: bool = False
    runtimes: list[str] = dataclasses.field(default_factory=list)
    compared: dict[str, int] = dataclasses.field(default_factory=dict)
    rewritten: onnx.ModelProto | None = None
    #: Where a runtime computed the original wrongly and the result agreed with
    #: ``onnx.reference``: not a failure of the rewrite, kept to be reported.
    runtime_faults: list[str] = dataclasses.field(default_factory=list)


def _checker_error(model: onnx.ModelProto) -> str | None:
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as error:
        return _short(error)
    return None


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:400]


def _interface(before: onnx.ModelProto, after: onnx.ModelProto) -> list[Failure]:
    def describe(model: onnx.ModelProto) -> list[tuple]:
        result = []
        for out in model.graph.output:
            tensor = out.type.tensor_type
            rank = len(tensor.shape.dim) if tensor.HasField("shape") else None
            result.append((out.name, tensor.elem_type, rank))
        return result

    old, new = describe(before), describe(after)
    if [o[:2] for o in old] != [n[:2] for n in new]:
        return [Failure("interface", f"outputs {old} became {new}")]
    for o, n in zip(old, new, strict=True):
        if o[2] is not None and n[2] is not None and o[2] != n[2]:
            return [Failure("interface", f"output {o[0]} rank {o[2]} became {n[2]}")]
    return []


def plans(case: Case) -> list[dict[str, int]]:
    """Sizes for the model's symbolic dimensions: two plans of all-different sizes, all
    ones, and one 0 per dimension whose smallest size allows it."""
    params = sorted(
        {
            d.dim_param
            for i in case.model.graph.input
            for d in i.type.tensor_type.shape.dim
            if d.dim_param
        }
    )
    least = {p: case.min_sizes.get(p, 0) for p in params}
    result = [
        {p: max(least[p], 2 + k) for k, p in enumerate(params)},
        {p: max(least[p], 3 + 2 * k) for k, p in enumerate(params)},
        {p: max(least[p], 1) for p in params},
    ]
    for p in params:
        if least[p] == 0:
            result.append({**result[0], p: 0})
    return result


def _feeds(case: Case, plan: dict[str, int], index: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(index)
    graph = case.model.graph
    feeds = {}
    for value in graph.input:
        tensor = value.type.tensor_type
        if value.name in case.fixed:
            # in the declared type: a mutator that converts the model's element type after
            # a value was fixed (element_type after bias) would feed float32 to float64
            fixed = case.fixed[value.name]
            feeds[value.name] = fixed.astype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
            continue
        dims = [
            d.dim_value if d.HasField("dim_value") else plan.get(d.dim_param, 2)
            for d in tensor.shape.dim
        ]
        elem = tensor.elem_type
        if elem == TensorProto.BOOL:
            feeds[value.name] = np.full(dims, index % 2 == 0)
        elif elem == TensorProto.INT32:  # sequence lengths: the full sequence
            feeds[value.name] = np.full(dims, plan.get("seq", 1), np.int32)
        elif elem == TensorProto.INT64:
            feeds[value.name] = rng.integers(0, _VOCABULARY, dims).astype(np.int64)
        else:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
            feeds[value.name] = rng.standard_normal(dims).astype(dtype)
    return feeds


class _Runner:
    """One model on ONNX Runtime (no graph optimizations) or ``onnx.reference``."""

    def __init__(self, model: onnx.ModelProto, runtime: str) -> None:
        self.names = [o.name for o in model.graph.output]
        if runtime == "onnxruntime":
            import onnxruntime as ort

            ort.set_default_logger_severity(4)
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.log_severity_level = 4
            self._session = ort.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
            # an initializer that is also a graph input is fed like any input: ONNX Runtime
            # lists it apart from the inputs, and leaving it out would run ONNX Runtime on
            # the initializer and onnx.reference on the feed
            session = self._session
            inputs = {
                i.name for i in [*session.get_inputs(), *session.get_overridable_initializers()]
            }
            self._run = lambda feeds: self._session.run(
                None, {k: v for k, v in feeds.items() if k in inputs}
            )
        else:
            evaluator = reference_evaluator(model)
            self._run = lambda feeds: evaluator.run(None, feeds)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(v) for v in self._run(feeds)]


class _NumpyStacking:
    """numpy, but ``vstack`` stacks (one new leading axis) as ``stack`` does."""

    def __getattr__(self, name: str):
        return np.stack if name == "vstack" else getattr(np, name)


class _StackingLoop(_ReferenceLoop):
    """``onnx.reference``'s Loop (1.23), whose scan outputs are stacked, one leading axis
    per iteration, as ONNX Runtime and onnx's own shape inference have them: the
    reference ``np.vstack``s them, which concatenates steps of rank 2 or more on their
    first axis (``[T * batch, H]`` for steps ``[batch, H]``) and gives 0-d steps a
    second axis."""

    op_domain = ""

    def _run(self, *args, **kwargs):
        real = _op_loop.np
        _op_loop.np = _NumpyStacking()  # a module-level shim, restored below
        try:
            return super()._run(*args, **kwargs)
        finally:
            _op_loop.np = real


_StackingLoop.__name__ = "Loop"  # new_ops replaces the op its class is named for


def reference_evaluator(model: onnx.ModelProto):
    """``onnx.reference`` on ``model`` with its Loop's scan outputs stacked (one leading
    axis per step, as ONNX Runtime and ONNX's shape inference have them) and each
    skipped node output named (see :func:`_name_skipped_outputs`)."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(_name_skipped_outputs(model), new_ops=[_StackingLoop])


def _name_skipped_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every skipped node output (``""`` before a used one) given a name
    of its own: the same model for ONNX, but ``onnx.reference`` (1.23) stores a skipped
    output's value under ``""``, the name it reads an absent optional input from, so a
    later ``Loop(M, "", v)`` or ``If`` body reads that tensor as its trip count."""
    if not any("" in node.output for node in _every_node(model)):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    names = fresh_names(model, "reference_skipped_")
    for node in _every_node(model):
        node.output[:] = [name or next(names) for name in node.output]
    return model


def _every_node(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes of the main graph, of the functions and of their subgraphs."""
    found = list(all_nodes(model.graph))
    for node in (n for function in model.functions for n in function.node):
        found.append(node)
        for attr in node.attribute:
            for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                found += all_nodes(graph)
    return found


_CHILD = """
import sys, numpy as np, onnxruntime as ort
model, feeds_path, out_path = sys.argv[1:]
o = ort.SessionOptions(); o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
s = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])
names = {i.name for i in [*s.get_inputs(), *s.get_overridable_initializers()]}
feeds = {k: v for k, v in np.load(feeds_path).items() if k in names}
outs = s.run(None, feeds)  # None: an output the model leaves unset (saved as absent)
np.savez(out_path, count=len(outs), **{f"arr_{k}": v for k, v in enumerate(outs) if v is not None})
"""


def _run_in_child(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list | str:
    """Outputs from ONNX Runtime in a child process, or why there are none."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, n) for n in ("m.onnx", "f.npz", "o.npz")]
        onnx.save(model, paths[0])
        np.savez(paths[1], **feeds)  # type: ignore[arg-type]  # numpy's stub types **kwds as its allow_pickle
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, *paths], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
        with np.load(paths[2]) as data:
            # an unset output as the in-process runner gives it (a 0-d object array);
            # never a pickle: np.load refuses object arrays
            return [
                data[f"arr_{k}"] if f"arr_{k}" in data.files else np.asarray(None)
                for k in range(int(data["count"]))
            ]


def _differences(expected: list[np.ndarray], actual: list[np.ndarray], names) -> str | None:
    for name, a, b in zip(names, expected, actual, strict=True):
        if a.dtype == object and b.dtype != object:
            # the original leaves this output unset on this runtime (ONNX Runtime does so
            # for an If branch returning one value twice): nothing to compare it with here
            continue
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{name}: {a.dtype}{list(a.shape)} became {b.dtype}{list(b.shape)}"
        if a.dtype.type in _TOLERANCE:
            rtol, atol = _TOLERANCE[a.dtype.type]
            if not np.array_equal(np.isnan(a), np.isnan(b)):
                return f"{name}: NaN in one model only ({a.dtype})"
            if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                with np.errstate(invalid="ignore"):
                    worst = np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64)))
                return f"{name}: values differ by up to {worst:.3g} ({a.dtype})"
        elif not np.array_equal(a, b):
            return f"{name}: values differ ({a.dtype})"
    return None


def _unexcused(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    expected: list[np.ndarray],
    actual: list[np.ndarray],
    names: list[str],
) -> str | None:
    """The first output where ``actual`` differs from ``expected`` (the original on a
    runtime) and from ``onnx.reference``'s run of ``model`` (the original) both; None
    when each differing output agrees with the reference (the runtime computed the
    original wrongly there). Output by output: the reference may be wrong elsewhere."""
    try:
        spec = _Runner(model, "reference").run(feeds)
    except Exception:
        return _differences(expected, actual, names)
    for name, a, b, c in zip(names, expected, actual, spec, strict=True):
        difference = _differences([a], [b], [name])
        if difference and _differences([c], [b], [name]):
            return difference
    return None


def _compare_on(
    runtime: str, case: Case, after: onnx.ModelProto, outcome: Outcome, zero_in_child: bool
) -> None:
    """Compare the models on ``runtime`` wherever the original runs."""
    before = case.model
    try:
        original = _Runner(before, runtime)
        original.run(_feeds(case, plans(case)[0], 0))
    except Exception:
        return  # the original does not run here
    outcome.runtimes.append(runtime)
    try:
        rewritten = _Runner(after, runtime)
    except Exception as error:
        outcome.failures.append(Failure("runs", f"{runtime} refuses the result: {_short(error)}"))
        return
    recurrent = has_recurrent_op(before) or has_recurrent_op(after)
    for index, plan in enumerate(plans(case)):
        feeds = _feeds(case, plan, index)
        zero = 0 in plan.values()
        if zero and recurrent and runtime == "onnxruntime":
            wanted = {p for p, size in plan.items() if size == 0} <= case.zero_dims
            if not (zero_in_child or wanted):
                continue
            expected = _run_in_child(before, feeds)
            if isinstance(expected, str):
                continue
            actual = _run_in_child(after, feeds)
            if isinstance(actual, str):
                outcome.failures.append(Failure("runs", f"at {plan}: the result {actual}"))
                continue
        else:
            try:
                expected = original.run(feeds)
            except Exception:
                continue  # the original does not run at these sizes
            try:
                actual = rewritten.run(feeds)
            except Exception as error:
                outcome.failures.append(Failure("runs", f"{runtime} at {plan}: {_short(error)}"))
                continue
        outcome.compared[runtime] = outcome.compared.get(runtime, 0) + 1
        difference = _differences(expected, actual, original.names)
        if difference and runtime != "reference":
            # ONNX Runtime may compute the original wrongly (1.32 returns zeros on the
            # second run of an If branch that returns one value twice) where the result
            # matches the ONNX specification's own evaluator: the runtime's fault
            unexcused = _unexcused(before, feeds, expected, actual, original.names)
            if unexcused is None:
                fault = f"{runtime} at {plan} on the original: {difference}"
                outcome.runtime_faults.append(fault)
            difference = unexcused
        if difference:
            outcome.failures.append(Failure("outputs", f"{runtime} at {plan}: {difference}"))


def check_case(case: Case, *, zero_in_child: bool = False, run: bool = True) -> Outcome:
    """Rewrite ``case.model`` and apply every oracle (see the module docstring)."""
    before = case.model
    outcome = Outcome([])
    try:
        after = rnn_rewrite_rules.rewrite(before)
    except Exception as error:
        outcome.failures.append(Failure("crash", f"{type(error).__name__}: {_short(error)}"))
        return outcome
    outcome.rewritten = after
    outcome.fired = after.SerializeToString() != before.SerializeToString()
    if _checker_error(before) is None:
        refused = _checker_error(after)
        if refused is not None:
            outcome.failures.append(Failure("checker", refused))
    outcome.failures += _interface(before, after)
    try:
        twice = rnn_rewrite_rules.rewrite(after)
    except Exception as error:
        outcome.failures.append(Failure("crash", f"second rewrite: {_short(error)}"))
    else:
        if twice.SerializeToString() != after.SerializeToString():
            outcome.failures.append(Failure("idempotent", "rewriting the result changes it"))
    if run:
        for runtime in RUNTIMES:
            _compare_on(runtime, case, after, outcome, zero_in_child)
    return outcome


def blame(case: Case, oracle: str) -> list[str]:
    """The rule classes (names of ``rnn_rewrite_rules.rules()`` up to ``[``) whose rules
    alone make ``oracle`` fail on ``case``; every class when the cleanup after any rewrite
    does it, none when only several classes together do."""
    groups: dict[str, list[str]] = {}
    for rule in rnn_rewrite_rules.rules().rules:
        name = rule.name or type(rule).__name__  # every rule of the package is named
        groups.setdefault(name.split("[")[0], []).append(name)
    real = rnn_rewrite_rules.rewrite
    guilty = []
    for group, names in groups.items():

        def alone(model: onnx.ModelProto, _names: list[str] = names) -> onnx.ModelProto:
            return real(model, _names)

        try:
            rnn_rewrite_rules.rewrite = alone  # type: ignore[assignment]  # for check_case
            failures = check_case(case).failures
        finally:
            rnn_rewrite_rules.rewrite = real
        if any(f.oracle == oracle for f in failures):
            guilty.append(group)
    return guilty
