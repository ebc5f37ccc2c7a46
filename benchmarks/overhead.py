"""Our rules' overhead inside ``onnxscript.optimizer.optimize()`` on a large model with no RNN.

The model is adversarial for the rules: every block ends in exactly the runtime shape chain
torchlib writes after an RNN layer (``Transpose(0,2,1,3) -> Shape -> Slice x4 -> Mul ->
Reshape(-1) -> Concat -> Reshape``), fed by a ``MatMul`` instead of an ``LSTM``, so the
patterns match up to the producer check on every block and then give up.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["build_large_model", "measure_optimize_overhead"]


def _rules_alone(model: onnx.ModelProto, repeats: int = 3) -> float:
    """Best CPU seconds of one pass of the installed rules alone over ``model``."""
    import onnx_ir as ir
    from onnxscript.rewriter import RewriteRuleSet

    from rnn_rewrite_rules.rules import select_rules

    rule_set = RewriteRuleSet(select_rules(installed_only=True))
    best = float("inf")
    for _ in range(repeats):
        ir_model = ir.serde.deserialize_model(model)
        start = time.process_time()
        rule_set.apply_to_model(ir_model)
        best = min(best, time.process_time() - start)
    return best


def build_large_model(min_nodes: int = 5000, width: int = 64, seed: int = 0) -> onnx.ModelProto:
    """A ``[batch, seq, width]`` MLP-with-reshapes of at least ``min_nodes`` nodes, no RNN."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    ints: dict[tuple[int, ...], str] = {}
    counter = iter(range(10**9))

    def fresh() -> str:
        return f"v{next(counter)}"

    def const_ints(*values: int) -> str:
        if values not in ints:
            name = f"c{len(ints)}"
            inits.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
            ints[values] = name
        return ints[values]

    def node(op: str, inputs: list[str], **attrs) -> str:
        out = fresh()
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    heads = 4
    current = "input"
    block = 0
    while len(nodes) + 1 < min_nodes:
        block += 1
        w = f"w{block}"
        inits.append(
            numpy_helper.from_array(rng.uniform(-0.1, 0.1, (width, width)).astype(np.float32), w)
        )
        b = f"b{block}"
        inits.append(numpy_helper.from_array(np.zeros(width, dtype=np.float32), b))
        h = node("Add", [node("MatMul", [current, w]), b])
        # runtime [batch, seq, heads, width // heads]
        shape = node("Shape", [h])
        batch = node("Slice", [shape, const_ints(0), const_ints(1)])
        seq = node("Slice", [shape, const_ints(1), const_ints(2)])
        split = node("Concat", [batch, seq, const_ints(heads, width // heads)], axis=0)
        y = node("Transpose", [node("Reshape", [h, split])], perm=[0, 2, 1, 3])
        # torchlib's layer-output chain, on a tensor that no RNN produced
        transposed = node("Transpose", [y], perm=[0, 2, 1, 3])
        tshape = node("Shape", [transposed])
        dims = [node("Slice", [tshape, const_ints(i), const_ints(i + 1)]) for i in range(4)]
        product = node("Reshape", [node("Mul", [dims[2], dims[3]]), const_ints(-1)], allowzero=0)
        target = node("Concat", [dims[0], dims[1], product], axis=0)
        current = node("Relu", [node("Reshape", [transposed, target], allowzero=0)])
    nodes.append(helper.make_node("Identity", [current], ["output"]))
    graph = helper.make_graph(
        nodes,
        "large_no_rnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "seq", width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def measure_optimize_overhead(model: onnx.ModelProto, repeats: int = 3) -> dict[str, float]:
    """``optimize()`` time without and with ``install()``, interleaved, best of ``repeats``.

    Both the process CPU time (``*_cpu_s``, what the comparison uses: optimize() is
    single-threaded Python, and CPU time does not count the other processes of a shared
    machine) and the wall-clock time (``*_s``) are returned.
    """
    import onnxscript.optimizer

    import rnn_rewrite_rules

    wall = {"without": float("inf"), "with": float("inf")}
    cpu = dict(wall)
    nodes_after = {}
    was_installed = rnn_rewrite_rules.is_installed()
    rnn_rewrite_rules.uninstall()
    try:
        for _ in range(repeats):
            for key in ("without", "with"):
                copy = onnx.ModelProto()
                copy.CopyFrom(model)
                if key == "with":
                    rnn_rewrite_rules.install()
                try:
                    start, start_cpu = time.perf_counter(), time.process_time()
                    result = onnxscript.optimizer.optimize(copy)
                    cpu[key] = min(cpu[key], time.process_time() - start_cpu)
                    wall[key] = min(wall[key], time.perf_counter() - start)
                finally:
                    rnn_rewrite_rules.uninstall()
                nodes_after[key] = len(result.graph.node)
    finally:
        if was_installed:
            rnn_rewrite_rules.install()
    return {
        "repeats": repeats,
        "rules_alone_cpu_s": _rules_alone(model),
        "nodes": len(model.graph.node),
        "without_s": wall["without"],
        "with_s": wall["with"],
        "without_cpu_s": cpu["without"],
        "with_cpu_s": cpu["with"],
        "overhead": cpu["with"] / cpu["without"] - 1.0,
        "nodes_after_without": nodes_after["without"],
        "nodes_after_with": nodes_after["with"],
    }
