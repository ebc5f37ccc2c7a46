"""Which runtimes each target must run on, and the op/element-type pairs they lack.

A rule that emits an op the original model did not run in that element type (``reroll``
turning float64 MatMul/Add/Tanh steps into one ``RNN``), or at all (rten has no ``RNN``),
asks :func:`missing_kernel` first: the result must run wherever the original runs. Only
checked facts are listed; a pair not listed is taken to run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._refusal import Refusal

__all__ = [
    "DEFAULT_ACTIVATIONS_ONLY",
    "MISSING_KERNELS",
    "MISSING_OPS",
    "TARGET_RUNTIMES",
    "WRONG_DIRECTIONS",
    "missing_kernel",
    "other_activations",
    "wrong_direction",
]

#: Target (``rules.TARGETS``) -> the runtimes its output must run on.
TARGET_RUNTIMES: dict[str, tuple[str, ...]] = {
    "portable": ("onnxruntime", "tract", "openvino", "onnx.reference", "rten"),
    "onnxruntime": ("onnxruntime",),
}

#: Runtime -> the ops it has no kernel for in any element type. rten (the Rust runtime,
#: checked with rten-convert 0.22.0: 'Unsupported operator "RNN"') has LSTM and GRU but no
#: RNN; it converts torch's unrolled nn.RNN.
MISSING_OPS: dict[str, frozenset[tuple[str, str]]] = {"rten": frozenset({("", "RNN")})}

_RECURRENT = (("", "LSTM"), ("", "GRU"), ("", "RNN"))

#: Runtime -> (domain, op_type) -> the element types it has no kernel for.
#: ONNX Runtime 1.32 (CPU): LSTM and GRU fail with "does not support double yet", RNN has
#: no double kernel (float16 runs: ORT casts it to float around the float kernel).
#: tract 0.23.9: a double LSTM/GRU/RNN fails in its Scan lowering. OpenVINO 2026.4 and
#: onnx.reference run them.
MISSING_KERNELS: dict[str, dict[tuple[str, str], frozenset[ir.DataType]]] = {
    "onnxruntime": dict.fromkeys(_RECURRENT, frozenset({ir.DataType.DOUBLE})),
    "tract": dict.fromkeys(_RECURRENT, frozenset({ir.DataType.DOUBLE})),
}


def missing_kernel(
    domain: str, op_type: str, dtype: ir.DataType | np.dtype, targets: tuple[str, ...] | None = None
) -> Refusal | None:
    """Why a ``domain::op_type`` node of element type ``dtype`` must not be emitted: the
    first runtime of ``targets`` (every target when None: a family's rules serve all of
    them unless it has rules per target) without a kernel for it; None when all have one."""
    if not isinstance(dtype, ir.DataType):
        dtype = ir.DataType.from_numpy(np.dtype(dtype))
    chosen = TARGET_RUNTIMES if targets is None else {t: TARGET_RUNTIMES[t] for t in targets}
    for target, runtimes in chosen.items():
        for runtime in runtimes:
            if (domain, op_type) in MISSING_OPS.get(runtime, ()):
                return Refusal(f"{runtime} has no {op_type} op (target {target!r})")
            if dtype in MISSING_KERNELS.get(runtime, {}).get((domain, op_type), ()):
                name = np.dtype(dtype.numpy()).name
                return Refusal(f"{runtime} has no {name} {op_type} kernel (target {target!r})")
    return None


#: Runtime -> the ``direction`` values of LSTM/GRU/RNN it computes wrongly. tract 0.23.9
#: runs ``direction="reverse"`` as ``"forward"`` (``Y`` and ``Y_h`` equal ONNX Runtime's on
#: the same node made forward; checked on LSTM, GRU and RNN at seq 3); ``bidirectional``
#: it runs right.
WRONG_DIRECTIONS: dict[str, frozenset[str]] = {"tract": frozenset({"reverse"})}


def wrong_direction(direction: str, targets: tuple[str, ...]) -> Refusal | None:
    """Why a recurrent node of ``direction`` must not be emitted for ``targets``: the first
    of their runtimes that computes it wrongly; None when all compute it."""
    for target in targets:
        for runtime in TARGET_RUNTIMES[target]:
            if direction in WRONG_DIRECTIONS.get(runtime, ()):
                return Refusal(
                    f"{runtime} runs direction={direction!r} as 'forward' (target {target!r})"
                )
    return None


#: Runtime -> the recurrent ops it computes with their default activations whatever the
#: ``activations`` attribute says. tract 0.23.9: an LSTM ``[Sigmoid, Relu, Relu]``, a GRU
#: ``[Sigmoid, Relu]`` and an RNN ``[Relu]`` give the defaults' outputs (checked against
#: ONNX Runtime on both attributes). rten-convert 0.22.0 drops a GRU's ``activations`` and
#: refuses an LSTM's ("Unsupported value"), so rten runs the defaults or nothing.
DEFAULT_ACTIVATIONS_ONLY: dict[str, frozenset[str]] = {
    "tract": frozenset({"LSTM", "GRU", "RNN"}),
    "rten": frozenset({"LSTM", "GRU"}),
}


def other_activations(
    op_type: str, activations: Sequence[str] | None, targets: tuple[str, ...]
) -> Refusal | None:
    """Why an ``op_type`` node with ``activations`` (None: the op's defaults) must not be
    emitted for ``targets``: the first of their runtimes that computes the defaults instead
    (:data:`DEFAULT_ACTIVATIONS_ONLY`); None where all compute what it says."""
    if activations is None:
        return None
    for target in targets:
        for runtime in TARGET_RUNTIMES[target]:
            if op_type in DEFAULT_ACTIVATIONS_ONLY.get(runtime, ()):
                return Refusal(
                    f"{runtime} computes {op_type}'s default activations whatever its"
                    f" activations attribute says ({list(activations)}; target {target!r})"
                )
    return None
