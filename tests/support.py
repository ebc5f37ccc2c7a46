"""Test helpers: equivalence in ONNX Runtime at several sizes, op counts, recurrent nodes
and their directions, rule application, and running the ``rnn-rewrite`` command in a
subprocess."""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper
from onnxscript.rewriter import RewriteRuleSet
from tools.corpus import runtimes
from tools.mutation.order import mutant_under_test

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules._verify import child_pythonpath
from rnn_rewrite_rules.passes.batch_zero_guard import guarded_branch
from rnn_rewrite_rules.testing import RnnConfig, random_inputs

SCRIPT = Path(sys.executable).with_name("rnn-rewrite")
#: The subprocesses' environment, copied once at import: jobs start in pool threads while
#: pytest sets and deletes PYTEST_CURRENT_TEST, so copying os.environ there races
#: (``KeyError: 'PYTEST_CURRENT_TEST'``).
BASE_ENV = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

#: A custom domain whose ops no runtime implements (see :func:`without_a_runtime`).
NO_RUNTIME_DOMAIN = "test.no_runtime"

#: (batch, seq) sizes, none of them equal to each other, so a frozen axis shows.
SIZES: tuple[tuple[int, int], ...] = ((1, 1), (3, 5), (7, 2))


def without_a_runtime(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with one more output computed by an op of a domain no runtime implements:
    every ONNX Runtime release (and ``onnx.reference``) refuses to load it, whatever IR
    version it reads, while the ONNX checker and the rules accept it."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    graph.node.append(
        onnx.helper.make_node(
            "Opaque", [graph.output[0].name], ["opaque"], domain=NO_RUNTIME_DOMAIN, name="opaque"
        )
    )
    graph.output.append(onnx.helper.make_tensor_value_info("opaque", onnx.TensorProto.FLOAT, ["n"]))
    result.opset_import.append(onnx.helper.make_opsetid(NO_RUNTIME_DOMAIN, 1))
    return result


def layout1_model() -> onnx.ModelProto:
    """A batch-first LSTM that ONNX Runtime's CPU kernels reject."""
    rng = np.random.default_rng(0)
    hidden, size = 4, 3
    w = numpy_helper.from_array(rng.uniform(-1, 1, (1, 4 * hidden, size)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.uniform(-1, 1, (1, 4 * hidden, hidden)).astype(np.float32), "R")
    node = helper.make_node(
        "LSTM", ["x", "W", "R"], ["y", "y_h"], hidden_size=hidden, layout=1, name="lstm_bf"
    )
    graph = helper.make_graph(
        [node],
        "batch_first",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", size])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 1, hidden]),
            helper.make_tensor_value_info("y_h", TensorProto.FLOAT, ["batch", 1, hidden]),
        ],
        [w, r],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def recurrent_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The ``LSTM``, ``GRU`` and ``RNN`` nodes of :func:`running_nodes`, in graph order."""
    return [n for n in running_nodes(model) if n.op_type in ("LSTM", "GRU", "RNN")]


def direction(node: onnx.NodeProto) -> bytes:
    """A recurrent node's ``direction`` attribute (``b"forward"`` where absent)."""
    return next((a.s for a in node.attribute if a.name == "direction"), b"forward")


def op_counts(model: onnx.ModelProto | ir.Model) -> collections.Counter[str]:
    """The ops of :func:`running_nodes`."""
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    return collections.Counter(node.op_type for node in running_nodes(model))


def running_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The main graph's nodes in order, a batch-0 guard (``passes.BatchZeroGuardPass``)
    replaced by the nodes of its ``else`` branch: what runs at every batch but 0."""
    found = []
    for node in model.graph.node:
        branch = guarded_branch(node)
        found += list(branch.node) if branch is not None else [node]
    return found


def apply(
    rules: RewriteRuleSet | Sequence, model: onnx.ModelProto, *, check: bool = True
) -> tuple[onnx.ModelProto, int]:
    """Apply a rule set once, remove dead nodes; return the new proto and the number of rewrites.

    ``check`` runs the full onnx checker on the result (off for deliberately invalid inputs).
    """
    ir_model = ir.serde.deserialize_model(model)
    rule_set = rules if isinstance(rules, RewriteRuleSet) else RewriteRuleSet(list(rules))
    count = rule_set.apply_to_model(ir_model)
    ir.passes.common.RemoveUnusedNodesPass()(ir_model)
    result = ir.serde.serialize_model(ir_model)
    if check:
        onnx.checker.check_model(result, full_check=True)
    return result, count


def assert_equivalent(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    cfg: RnnConfig,
    sizes: Iterable[tuple[int, int]] = SIZES,
    *,
    atol: float = 1e-5,
    optimize: bool = True,
) -> None:
    """Same outputs (and shapes) in ORT at every (batch, seq) size."""
    for seed, (batch, seq) in enumerate(sizes):
        feeds = random_inputs(cfg, batch, seq, rng=seed)
        expected = runtime.run(before, feeds, optimize=optimize)
        actual = runtime.run(after, feeds, optimize=optimize)
        diff = runtime.max_abs_diff(expected, actual)
        assert diff <= atol, f"batch={batch} seq={seq}: max abs diff {diff}"


def command(*args, script: bool = False) -> list[str]:
    """The command line: the installed console script or ``python -m``."""
    if script:
        assert SCRIPT.exists(), f"console script missing: {SCRIPT} (pip install -e .)"
        return [str(SCRIPT), *map(str, args)]
    return [sys.executable, "-m", "rnn_rewrite_rules", *map(str, args)]


def child_env(env: dict | None = None) -> dict[str, str]:
    """A child process's environment: :data:`BASE_ENV`, the package the tests import first
    on ``PYTHONPATH``, the mutant under test if any (mutmut names it in
    ``MUTANT_UNDER_TEST`` per mutant, after the import; its other phases, such as
    ``stats``, stay in the parent), then ``env``."""
    # the package the tests import first (in a mutation run, mutmut's copy with the mutants)
    path = child_pythonpath(BASE_ENV.get("PYTHONPATH"))
    environment = {k: v for k, v in BASE_ENV.items() if k != "MUTANT_UNDER_TEST"}
    environment["PYTHONPATH"] = path
    mutant = mutant_under_test()
    if mutant is not None:
        environment["MUTANT_UNDER_TEST"] = mutant
    return environment | (env or {})


def run(
    *args, cwd: Path, script: bool = False, env: dict | None = None, timeout: float = 120, **kwargs
):
    """The command in a subprocess (the installed console script or ``python -m``), run
    from the package the tests import (:func:`child_env`)."""
    return subprocess.run(
        command(*args, script=script),
        cwd=cwd,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def assert_one_line_error(proc, code: int, *fragments: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("rnn-rewrite: error: "), lines[0]
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def leftovers(directory: Path) -> list[str]:
    """Staging directories a failed or finished write left behind."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") and p.is_dir())


def in_tract(
    models: Sequence[onnx.ModelProto],
    feeds: Sequence[dict[str, np.ndarray]],
    *,
    timeout: float = 600,
) -> list:
    """Each model's outputs in tract on each feed, one ``benchmarks.measure.TractProbe`` per
    model (one child process for all of them: a tract panic aborts its process)."""
    from benchmarks import measure

    with tempfile.TemporaryDirectory(prefix="tract-test-") as tmp:
        paths, prefixes = [], []
        for index, model in enumerate(models):
            paths.append(os.path.join(tmp, f"model{index}.onnx"))
            prefixes.append(os.path.join(tmp, f"model{index}-"))
            onnx.save(model, paths[-1])
        feed_files = []
        for index, feed in enumerate(feeds):
            feed_files.append(os.path.join(tmp, f"feeds{index}.npz"))
            np.savez(feed_files[-1], **feed)
        return measure.tract_probe(paths, list(feeds[0]), feed_files, prefixes, timeout=timeout)


def as_function(model: onnx.ModelProto, opset: int, *, ranked: bool = False) -> onnx.ModelProto:
    """``model``'s graph as the body of a local function ``local.layer`` importing ``opset``
    of the default domain (its initializers become Constant nodes); the main graph calls it.

    ``ranked``: the body reads its first input through ``Reshape(x, [0, 0, I])`` (``I``
    its declared last size), so that the rank 3 a proof needs is known: a function's
    inputs declare no shape.
    """
    graph = model.graph
    body = [onnx.helper.make_node("Constant", [], [t.name], value=t) for t in graph.initializer]
    inputs = [i.name for i in graph.input]
    params = list(inputs)
    if ranked:
        size = graph.input[0].type.tensor_type.shape.dim[2].dim_value
        target = onnx.numpy_helper.from_array(np.array([0, 0, size], np.int64))
        params[0] = f"{inputs[0]}_declared"
        body.append(onnx.helper.make_node("Constant", [], ["rank_target"], value=target))
        body.append(onnx.helper.make_node("Reshape", [params[0], "rank_target"], [inputs[0]]))
    body += list(graph.node)
    outputs = [o.name for o in graph.output]
    imports = [onnx.helper.make_opsetid("", opset)]
    function = onnx.helper.make_function("local", "layer", params, outputs, body, imports)
    call = onnx.helper.make_node("layer", inputs, outputs, domain="local", name="call")
    main = onnx.helper.make_graph([call], "main", list(graph.input), list(graph.output))
    opsets = [
        onnx.helper.make_opsetid("", model.opset_import[0].version),
        onnx.helper.make_opsetid("local", 1),
    ]
    result = onnx.helper.make_model(main, opset_imports=opsets, functions=[function])
    result.ir_version = model.ir_version
    return result


def join_halves(model: onnx.ModelProto, *indices: int) -> None:
    """Each of the ``DynamicQuantizeLSTM``'s inputs ``indices``, an initializer, becomes
    ``Concat`` of its two halves along the last axis, inserted first in the graph."""
    node = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM")
    inits = {t.name: t for t in model.graph.initializer}
    joins = []
    for index in indices:
        name = node.input[index]
        array = onnx.numpy_helper.to_array(inits[name])
        model.graph.initializer.remove(inits[name])
        cut = array.shape[-1] // 2
        for part, suffix in ((array[..., :cut], "lo"), (array[..., cut:], "hi")):
            tensor = onnx.numpy_helper.from_array(np.ascontiguousarray(part), f"{name}_{suffix}")
            model.graph.initializer.append(tensor)
        halves = [f"{name}_lo", f"{name}_hi"]
        joins.append(
            onnx.helper.make_node("Concat", halves, [f"{name}_joined"], axis=array.ndim - 1)
        )
        node.input[index] = f"{name}_joined"
    nodes = [*joins, *model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def without_output(name: str, model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without its graph output ``name`` and the nodes only that output needed
    (for an unrolled chain without ``y``: each step's ``h`` is then read by the next step
    alone)."""
    ir_model = ir.serde.deserialize_model(model)
    ir_model.graph.outputs[:] = [v for v in ir_model.graph.outputs if v.name != name]
    ir.passes.common.RemoveUnusedNodesPass()(ir_model)
    return ir.serde.serialize_model(ir_model)


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every float32 tensor float64: inputs, outputs, initializers,
    ``Constant`` and ``ConstantOfShape`` values and ``Cast`` targets, in every subgraph
    (what a ``.double()`` module exports)."""
    from onnx import TensorProto, numpy_helper

    result = onnx.ModelProto()
    result.CopyFrom(model)

    def tensor(t: onnx.TensorProto) -> None:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    def graph(g: onnx.GraphProto) -> None:
        for info in (*g.input, *g.output, *g.value_info):
            if info.type.tensor_type.elem_type == TensorProto.FLOAT:
                info.type.tensor_type.elem_type = TensorProto.DOUBLE
        for t in g.initializer:
            tensor(t)
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    tensor(attr.t)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    graph(attr.g)
                elif node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                    attr.i = TensorProto.DOUBLE

    graph(result.graph)
    return result


#: How :func:`save_model_as` lays a model's tensors out on disk.
LAYOUTS = ("beside", "subfolder", "dotted", "past_2gb")
#: Where ``past_2gb`` puts the first tensor: offsets a 32-bit reader gets wrong.
PAST_2GB = 2**31 + 4096


def save_model_as(model: onnx.ModelProto, folder: Path, layout: str) -> Path:
    """``model`` saved as ``folder/model.onnx``, its tensors of 1 KiB or more as external
    data: ``beside`` (``model.onnx.data`` next to it, as torch's exporter writes it),
    ``subfolder`` (``weights/model.data``), ``dotted`` (the location ``./model.data``),
    ``past_2gb`` (``model.data``, each tensor at an offset past 2 GiB of a sparse file: a
    data file over 2 GiB that takes no disk)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if layout == "past_2gb":
        _externalize(copy, folder / "model.data", PAST_2GB)
        onnx.save(copy, path)
        return path
    location = {
        "beside": "model.onnx.data",
        "subfolder": "weights/model.data",
        "dotted": "./model.data",
    }[layout]
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(copy, path, save_as_external_data=True, location=location, size_threshold=1024)
    return path


def _externalize(model: onnx.ModelProto, data: Path, offset: int) -> None:
    """Move the initializers of 1 KiB or more to ``data``, the first at ``offset``."""
    with open(data, "wb") as file:
        for tensor in model.graph.initializer:
            raw = onnx.numpy_helper.to_array(tensor).tobytes()
            if len(raw) < 1024:
                continue
            file.seek(offset)
            file.write(raw)
            moved = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type)
            moved.dims.extend(tensor.dims)
            moved.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data.name), ("offset", offset), ("length", len(raw))):
                moved.external_data.add(key=key, value=str(value))
            tensor.CopyFrom(moved)
            offset += -(-len(raw) // 4096) * 4096


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` (the folder itself included) -> (size, mtime in ns): a
    file written, replaced, created or deleted there changes it."""
    paths = [folder, *sorted(folder.rglob("*"))]
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in paths}


#: Runs ``rnn-rewrite`` (argv[2:]) with the folder argv[1] read-only for every write this
#: Python process makes through the standard library (an audit hook): what a user without
#: write permission meets, for a test running as root, whom chmod does not stop.
_READ_ONLY_RUN = """
import os, runpy, sys
folder = os.path.realpath(sys.argv[1]) + os.sep
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
PATH_EVENTS = {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.truncate",
               "os.link", "os.symlink", "os.chmod", "os.utime", "shutil.rmtree", "shutil.move"}

def inside(path):
    return isinstance(path, (str, bytes, os.PathLike)) and os.path.realpath(
        os.path.join(os.getcwd(), os.fsdecode(path))).startswith(folder)

def hook(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and set(mode) & set("wax+")) or (flags or 0) & WRITE
        if writing and inside(path):
            raise PermissionError(13, "Permission denied (read-only folder)", path)
    elif event in PATH_EVENTS and any(inside(a) for a in args[:2]):
        raise PermissionError(13, "Permission denied (read-only folder)", args[0])

sys.addaudithook(hook)
sys.argv = ["rnn-rewrite", *sys.argv[2:]]
runpy.run_module("rnn_rewrite_rules", run_name="__main__", alter_sys=True)
"""


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Callable[..., subprocess.CompletedProcess]]:
    """``folder`` and everything in it made read-only (chmod); yields a function that runs
    the command like :func:`run`. Where chmod does not stop writes (root), the command
    runs under an audit hook that refuses every write into ``folder`` from Python; either
    way, :func:`folder_state` tells whether anything there changed."""
    paths = [folder, *folder.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    for path in sorted(paths, key=lambda p: -len(p.parts)):
        path.chmod(modes[path] & ~0o222)
    enforced = not os.access(folder, os.W_OK)

    def run_read_only(*args, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
        if enforced:
            return run(*args, cwd=cwd, timeout=timeout)
        return subprocess.run(
            [sys.executable, "-c", _READ_ONLY_RUN, str(folder), *map(str, args)],
            cwd=cwd,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    try:
        yield run_read_only
    finally:
        for path in sorted(paths, key=lambda p: len(p.parts)):
            path.chmod(modes[path])


def onnxruntime_in_child(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> list[np.ndarray] | str:
    """``model``'s outputs in ONNX Runtime in a child process, or why there are none (an
    error text, or ``runtimes.Aborted`` where the process died: ONNX Runtime aborts the
    process on an LSTM or GRU node at batch 0)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "m.onnx")
        onnx.save(model, path)
        return runtimes.onnxruntime_child(path, feeds)


def assert_agree(original: list[np.ndarray] | str, rewritten: list[np.ndarray] | str) -> None:
    """Two :func:`onnxruntime_in_child` results: both ran, with equal shapes and values."""
    assert not isinstance(original, str), original
    assert not isinstance(rewritten, str), f"the original runs, the rewrite: {rewritten}"
    assert [a.shape for a in rewritten] == [a.shape for a in original]
    for want, got in zip(original, rewritten, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
