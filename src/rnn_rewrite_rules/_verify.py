"""Check a rewrite numerically: run both models in ONNX Runtime on seeded random inputs.

Every dynamic axis takes at least two different sizes (one per run), different axes take
different sizes within a run, and an axis shared by several inputs (``batch`` of ``input``
and ``h0``) takes the same size in all of them. ``--shape NAME=DIMS`` fixes an input's
shape, ``--shape AXIS=N,M`` the sizes of a named dynamic axis.

When ONNX Runtime rejects the original model (``layout=1`` RNNs, say), the reference
outputs come from ``onnx.reference`` instead, and the result says so.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules import runtime
from rnn_rewrite_rules.runtime import OnnxRuntimeMissing, require_onnxruntime

__all__ = [
    "CannotVerify",
    "InputSpec",
    "OnnxRuntimeMissing",
    "VerifyResult",
    "input_specs",
    "make_feeds",
    "parse_shape_overrides",
    "plan_runs",
    "require_onnxruntime",
    "verify",
]

Source = str | bytes
_DEFAULT_BASES = (2, 5)
#: The largest input fed (elements): more is a mistyped --shape, not a test.
MAX_ELEMENTS = 2**27


class CannotVerify(Exception):
    """The comparison cannot be made (the original model does not run, an input has no rank)."""


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """A graph input to feed: static dims are ints, dynamic ones a name or None."""

    name: str
    dtype: ir.DataType
    dims: tuple[int | str | None, ...] | None


def input_specs(model: ir.Model) -> list[InputSpec]:
    """The inputs a caller must feed (inputs with an initializer default are left out)."""
    specs = []
    for value in model.graph.inputs:
        if value.is_initializer():
            continue
        dims = None
        if value.shape is not None:
            dims = tuple(
                d if isinstance(d, int) else getattr(d, "value", None) for d in value.shape
            )
        dtype = value.dtype if value.dtype is not None else ir.DataType.UNDEFINED
        specs.append(InputSpec(value.name or "", dtype, dims))
    return specs


def parse_shape_overrides(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["input=2,7,256", "seq=1,9"]`` -> ``{"input": (2, 7, 256), "seq": (1, 9)}``.

    Raises:
        ValueError: an item is not ``NAME=N,N,...`` with non-negative integers.
    """
    result: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--shape {item!r}: expected NAME=DIMS, e.g. input=1,7,256")
        parts = [p for p in re.split(r"[,x\s]+", dims.strip()) if p]
        try:
            values = tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError(f"--shape {item!r}: dims must be integers") from None
        if any(v < 0 for v in values):
            raise ValueError(f"--shape {item!r}: dims must not be negative")
        result[name.strip()] = values
    return result


def _axis_key(spec: InputSpec, axis: int, dim: int | str | None) -> str | tuple[str, int] | None:
    """The name of the size an axis takes, or None for a static axis."""
    if isinstance(dim, int) and dim > 0:
        return None
    return dim if isinstance(dim, str) and dim else (spec.name, axis)


def plan_runs(
    specs: Sequence[InputSpec], overrides: Mapping[str, tuple[int, ...]], runs: int = 2
) -> list[dict[str, tuple[int, ...]]]:
    """Input shapes for each run; each dynamic axis takes a different size in each run.

    Raises:
        ValueError: an override names nothing or contradicts a static dim (a usage error).
        CannotVerify: an input has no declared rank and no override.
    """
    by_name = {spec.name: spec for spec in specs}
    fixed: dict[object, int] = {}
    for spec in specs:
        if spec.name not in overrides:
            continue
        shape = overrides[spec.name]
        if spec.dims is not None:
            if len(shape) != len(spec.dims):
                raise ValueError(
                    f"--shape {spec.name}: {len(shape)} dims given, "
                    f"the input has rank {len(spec.dims)}"
                )
            for axis, (dim, size) in enumerate(zip(spec.dims, shape, strict=True)):
                key = _axis_key(spec, axis, dim)
                if key is None and dim != size:
                    raise ValueError(
                        f"--shape {spec.name}: axis {axis} is static {dim}, not {size}"
                    )
                if key is not None:
                    if fixed.get(key, size) != size:
                        raise ValueError(f"--shape {spec.name}: axis {key!r} is given two sizes")
                    fixed[key] = size
    keys: list[object] = []
    for spec in specs:
        for axis, dim in enumerate(spec.dims or ()):
            key = _axis_key(spec, axis, dim)
            if key is not None and key not in keys:
                keys.append(key)
    axis_sizes: dict[object, tuple[int, ...]] = {}
    for name, sizes in overrides.items():
        if name in by_name:
            continue
        if name not in keys:
            raise ValueError(f"--shape {name}: no input or named dynamic axis has that name")
        if not sizes:
            raise ValueError(f"--shape {name}: give at least one size")
        if name in fixed:
            raise ValueError(f"--shape {name}: the axis is also fixed by an input's --shape")
        axis_sizes[name] = sizes
    for spec in specs:
        if spec.dims is None and spec.name not in overrides:
            raise CannotVerify(
                f"input {spec.name!r} has no declared shape: give --shape {spec.name}=DIMS"
            )
    runs = max([runs, *(len(s) for s in axis_sizes.values())])
    plans: list[dict[str, tuple[int, ...]]] = []
    for run in range(runs):
        base = _DEFAULT_BASES[run] if run < len(_DEFAULT_BASES) else 2 + 3 * run
        sizes = {}
        for index, key in enumerate(keys):
            if key in fixed:
                sizes[key] = fixed[key]
            elif key in axis_sizes:
                sizes[key] = axis_sizes[key][run % len(axis_sizes[key])]
            else:
                sizes[key] = base + index
        plan = {}
        for spec in specs:
            if spec.name in overrides:
                plan[spec.name] = overrides[spec.name]
            else:
                plan[spec.name] = tuple(
                    dim if key is None else sizes[key]
                    for axis, dim in enumerate(spec.dims or ())
                    for key in [_axis_key(spec, axis, dim)]
                )
        for name, shape in plan.items():
            if math.prod(shape) > MAX_ELEMENTS:
                raise ValueError(
                    f"--shape: input {name!r} would have shape {_format_shape(shape)}, "
                    f"over {MAX_ELEMENTS:,} elements; give smaller sizes"
                )
        if plan not in plans:
            plans.append(plan)
    return plans


def make_feeds(
    specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Random values: floats N(0, 1), integers in [1, smallest dim of the run], booleans.

    Raises:
        CannotVerify: an input's element type cannot be generated.
    """
    dims = [d for shape in shapes.values() for d in shape if d > 0]
    high = max(1, min(dims)) if dims else 1
    feeds = {}
    for spec in specs:
        try:
            feeds[spec.name] = runtime.make_feed(spec.dtype, shapes[spec.name], rng, high=high)
        except runtime.UnsupportedInput:
            raise CannotVerify(
                f"input {spec.name!r} has element type {spec.dtype.name}, not supported"
            ) from None
    return feeds


def _format_shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def format_plan(plan: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name}={_format_shape(shape)}" for name, shape in plan.items())


@dataclasses.dataclass
class VerifyResult:
    tolerance: float
    seed: int
    runs: list[dict[str, tuple[int, ...]]]
    #: Output name -> max abs diff over all runs.
    max_diff: dict[str, float]
    reference: str = "onnxruntime"
    #: Why the reference is not ONNX Runtime, if it is not.
    note: str | None = None
    #: A failure other than the tolerance (rewritten model does not run, shapes differ).
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and all(d <= self.tolerance for d in self.max_diff.values())

    @property
    def worst(self) -> float:
        return max(self.max_diff.values(), default=0.0)

    def lines(self) -> list[str]:
        """A human-readable summary."""
        out = [f"verify: {len(self.runs)} runs, seed {self.seed}, tolerance {self.tolerance:g}"]
        if self.note:
            out.append(f"  note: {self.note}")
        for index, plan in enumerate(self.runs, 1):
            out.append(f"  run {index}: {format_plan(plan)}")
        if self.max_diff:
            width = max(len(name) for name in self.max_diff)
            out.append(f"  {'output':<{width}}  max abs diff")
            for name, diff in self.max_diff.items():
                flag = "" if diff <= self.tolerance else "  > tolerance"
                out.append(f"  {name:<{width}}  {diff:.3g}{flag}")
        if self.failure:
            out.append(f"verify: FAILED: {self.failure}")
        elif not self.ok:
            out.append(
                f"verify: FAILED: max abs diff {self.worst:.3g} > tolerance {self.tolerance:g}"
            )
        else:
            out.append("verify: OK")
        return out


def verify(
    before: Source,
    after: Source,
    specs: Sequence[InputSpec],
    *,
    overrides: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    tolerance: float = 1e-4,
    on_run: Callable[[], None] | None = None,
) -> VerifyResult:
    """Run ``before`` and ``after`` (paths or serialized models) on the same random inputs.

    Raises:
        OnnxRuntimeMissing: onnxruntime is not installed.
        CannotVerify: ``before`` does not run on the planned inputs.
        ValueError: ``overrides`` are inconsistent with the inputs.
    """
    require_onnxruntime()
    plans = plan_runs(specs, overrides or {})
    result = VerifyResult(tolerance, seed, plans, {})
    try:
        reference = runtime.ort_runner(before)
    except Exception as error:
        result.note = f"ONNX Runtime rejects the original model ({runtime.short_error(error)})"
        try:
            reference = runtime.reference_runner(before)
        except Exception:
            raise CannotVerify(
                f"the original model does not load in ONNX Runtime: {runtime.short_error(error)}"
            ) from None
        result.reference = reference.name
        result.note += "; reference outputs from onnx.reference"
    try:
        candidate = runtime.ort_runner(after)
    except Exception as error:
        result.failure = (
            f"the rewritten model does not load in ONNX Runtime: {runtime.short_error(error)}"
        )
        return result
    if candidate.output_names != reference.output_names:
        result.failure = (
            f"outputs differ: {reference.output_names} before, {candidate.output_names} after"
        )
        return result
    rng = np.random.default_rng(seed)
    for index, plan in enumerate(plans, 1):
        feeds = make_feeds(specs, plan, rng)
        try:
            expected = reference.run(feeds)
        except Exception as error:
            raise CannotVerify(
                f"the original model fails on {format_plan(plan)} in {reference.name}: "
                f"{runtime.short_error(error)} "
                "(a frozen axis? see --check; or fix sizes with --shape)"
            ) from None
        try:
            actual = candidate.run(feeds)
        except Exception as error:
            result.failure = (
                f"the rewritten model fails on {format_plan(plan)}: {runtime.short_error(error)}"
            )
            return result
        for name, e, a in zip(reference.output_names, expected, actual, strict=True):
            e, a = np.asarray(e), np.asarray(a)
            if e.shape != a.shape:
                result.failure = (
                    f"run {index}: output {name!r} has shape {a.shape}, expected {e.shape}"
                )
                return result
            result.max_diff[name] = max(result.max_diff.get(name, 0.0), runtime.diff(e, a))
        if on_run is not None:
            on_run()
    return result
