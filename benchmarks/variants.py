"""The tools a user would run on an exported model instead of (or with) our rules.

Each variant takes the original ``ModelProto`` (never modified) and returns the tool's
output and the seconds the tool took. Every tool runs with its defaults.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Sequence

import onnx

__all__ = [
    "DEFAULT_VARIANTS",
    "OURS",
    "VARIANTS",
    "VariantResult",
    "apply_variant",
    "parse_variants",
]


@dataclasses.dataclass
class VariantResult:
    name: str
    model: onnx.ModelProto | None
    seconds: float
    error: str = ""
    #: The tool is not installed (an optional package of the ``bench`` extra).
    missing: bool = False
    #: Ours: the proven rewrites a rule left undone for the target (cost, a runtime's
    #: limits), each ``reason`` as ``rnn-rewrite --check`` says it.
    declined: list[str] = dataclasses.field(default_factory=list)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _original(model: onnx.ModelProto) -> onnx.ModelProto:
    return model


def _ours(model: onnx.ModelProto, context=None) -> onnx.ModelProto:
    import rnn_rewrite_rules

    return rnn_rewrite_rules.rewrite(model, context=context)


def _ours_onnxruntime(model: onnx.ModelProto, context=None) -> onnx.ModelProto:
    import rnn_rewrite_rules

    return rnn_rewrite_rules.rewrite(model, target="onnxruntime", context=context)


def _ours_optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """What ``torch.onnx.export(optimize=True)`` gives after ``install()``: optimize + ours."""
    import onnxscript.optimizer

    import rnn_rewrite_rules

    with rnn_rewrite_rules.installed():
        return onnxscript.optimizer.optimize(model)


def _onnxscript(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxscript.optimizer

    import rnn_rewrite_rules

    if rnn_rewrite_rules.is_installed():
        raise RuntimeError("our rules are installed: this would not be onnxscript's default")
    return onnxscript.optimizer.optimize(model)


def _onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxsim

    simplified, _check = onnxsim.simplify(model)
    return simplified


def _onnxslim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxslim

    return onnxslim.slim(model)


def _ort_offline(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX Runtime's offline optimizer: ``optimized_model_filepath`` at extended level, CPU."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "model.onnx")
        target = os.path.join(tmp, "optimized.onnx")
        onnx.save(model, source)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = target
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        return onnx.load(target)


#: name -> (tool, description for the docs).
VARIANTS: dict[str, tuple[Callable[[onnx.ModelProto], onnx.ModelProto], str]] = {
    "original": (_original, "the model as exported"),
    "ours": (_ours, "`rnn_rewrite_rules.rewrite(model)` (default target `portable`)"),
    "ours+optimize": (
        _ours_optimize,
        "`onnxscript.optimizer.optimize(model)` inside `rnn_rewrite_rules.installed()`",
    ),
    "ours-onnxruntime": (
        _ours_onnxruntime,
        '`rnn_rewrite_rules.rewrite(model, target="onnxruntime")` (zero states dropped)',
    ),
    "onnxscript": (_onnxscript, "`onnxscript.optimizer.optimize(model)`, defaults"),
    "onnxsim": (_onnxsim, "`onnxsim.simplify(model)`, defaults"),
    "onnxslim": (_onnxslim, "`onnxslim.slim(model)`, defaults"),
    "ort-offline": (
        _ort_offline,
        "ONNX Runtime's `SessionOptions.optimized_model_filepath`, ORT_ENABLE_EXTENDED, CPU",
    ),
}
DEFAULT_VARIANTS: tuple[str, ...] = tuple(VARIANTS)
#: Variants that are our rules (the rest are the tools we compare against).
OURS = ("ours", "ours+optimize", "ours-onnxruntime")
#: Variants that take the rewrite's context (and so record the rewrites their rules declined).
_TRACED = ("ours", "ours-onnxruntime")


def apply_variant(name: str, model: onnx.ModelProto) -> VariantResult:
    """Run one tool on a copy of ``model``; a tool's failure is recorded, not raised."""
    tool, _ = VARIANTS[name]
    from rnn_rewrite_rules import costs

    copy = _copy(model)
    start = time.perf_counter()
    try:
        context = costs.Context()
        result = tool(copy, context) if name in _TRACED else tool(copy)
    except ModuleNotFoundError as error:
        seconds = time.perf_counter() - start
        return VariantResult(name, None, seconds, f"not installed ({error.name})", missing=True)
    except Exception as error:
        message = str(error).strip().splitlines()
        detail = message[0][:160] if message else ""
        return VariantResult(
            name, None, time.perf_counter() - start, f"{type(error).__name__}: {detail}"
        )
    seconds = time.perf_counter() - start
    return VariantResult(name, result, seconds, declined=[d.reason for d in context.declined])


def parse_variants(names: Sequence[str] | None) -> list[str]:
    if not names:
        return list(DEFAULT_VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    return ["original", *[n for n in names if n != "original"]]
