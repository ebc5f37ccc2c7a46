"""Benchmark our rules against the tools users would pick instead (issues 3, 5 and 8).

    python -m benchmarks.run                 # the full matrix -> docs/benchmarks.md + .png
    python -m benchmarks.run --quick         # two tiny models, seconds, into --out-dir
    python -m benchmarks.run --models seed gru3bi-h64 --variants ours onnxsim
    python -m benchmarks.run --from-json benchmarks/results.json   # re-render only
    python -m benchmarks.run --int8-only     # the int8 section measured again, the rest kept

For every model and variant: node count, runtime Shape chain, folded weights, dynamic axes
(checked by running at other sizes), max abs diff vs PyTorch, ONNX Runtime latency at one
thread with default optimizations and with ORT_DISABLE_ALL (interleaved rounds, best of N,
as ratios to the original), session creation time, the tool's own time, and the same in
OpenVINO (compile time, per-call latency, one thread) and tract (load time, per-call
latency) when they are installed; whether onnx.reference runs it and whether rten-convert
converts it (rten has no RNN op); the int8 path (ORT's quantize_dynamic on the original
and on ours). Then our overhead inside ``onnxscript.optimizer.optimize()`` on a large model
without RNNs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import tempfile
import time

import numpy as np
import onnx

from benchmarks import measure, models, overhead, report, variants
from rnn_rewrite_rules.quantize import INT8_TOLERANCE, quantize_int8
from rnn_rewrite_rules.rules import DEFAULT_TARGET, TARGETS
from rnn_rewrite_rules.testing import rten

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Settings:
    """Repetitions and time budgets (seconds per model) of the timed parts."""

    ort_budget: float = 12.0
    tract_budget: float = 8.0
    ov_budget: float = 8.0
    min_rounds: int = 7
    max_rounds: int = 40
    session_repeats: int = 3
    tract_load_repeats: int = 3
    ov_compile_repeats: int = 3
    overhead_nodes: int = 5000
    overhead_repeats: int = 1
    tract_timeout: float = 300.0

    @classmethod
    def quick(cls) -> Settings:
        return cls(
            ort_budget=0.2,
            tract_budget=0.2,
            ov_budget=0.2,
            min_rounds=2,
            max_rounds=5,
            session_repeats=1,
            tract_load_repeats=1,
            ov_compile_repeats=1,
            overhead_nodes=300,
            overhead_repeats=1,
            tract_timeout=120.0,
        )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _save_feeds(path: str, feeds: dict[str, np.ndarray]) -> str:
    np.savez(path, **feeds)
    return path


def bench_model(
    prepared: models.PreparedModel,
    names: list[str],
    settings: Settings,
    workdir: str,
    use_tract: bool,
    use_openvino: bool,
    use_rten: bool,
    log,
) -> dict:
    """Every measurement of one model, as a JSON-able dict."""
    spec = prepared.spec
    rows: dict[str, dict] = {}
    serialized: dict[str, bytes] = {}
    paths: dict[str, str] = {}
    for name in names:
        result = variants.apply_variant(name, prepared.model)
        row: dict = {"variant": name, "tool_s": result.seconds, "error": result.error}
        if name in variants.OURS:
            row["declined"] = result.declined
        rows[name] = row
        if result.missing:
            row["missing"] = True
            log(f"    {name}: {result.error}")
            continue
        if result.model is None:
            log(f"    {name}: FAILED {result.error}")
            continue
        facts = measure.analyze(result.model, prepared.dynamic_axes)
        row.update(dataclasses.asdict(facts))
        serialized[name] = result.model.SerializeToString()
        paths[name] = os.path.join(workdir, f"{spec.name}-{name}.onnx")
        onnx.save(result.model, paths[name])
        log(f"    {name}: {facts.nodes} nodes, tool {result.seconds:.2f} s")

    # correctness in ORT, with and without graph optimizations, and at other sizes
    for name, blob in serialized.items():
        row = rows[name]
        diffs = []
        row["ort_error"] = ""
        for optimize in (True, False):
            outputs = measure.ort_run(blob, prepared.feeds, optimize)
            if isinstance(outputs, str):
                row["error"] = row["error"] or outputs
                row["ort_error"] = row["ort_error"] or outputs
                diffs.append(math.inf)
            else:
                diffs.append(measure.compare(outputs, prepared.expected))
        row["max_abs_diff"] = _finite(max(diffs))
        row["axes_kept"] = {}
        for axis, (feeds, expected) in prepared.other.items():
            outputs = measure.ort_run(blob, feeds, True)
            runs = not isinstance(outputs, str) and measure.compare(outputs, expected) <= 1e-4
            row["axes_kept"][axis] = bool(runs and row["symbolic_axes"][axis])
        reference = measure.reference_run(onnx.load_from_string(blob), prepared.feeds)
        row["reference_error"] = reference if isinstance(reference, str) else ""
        row["reference_diff"] = _finite(measure.compare(reference, prepared.expected))

    if use_rten:
        for name in serialized:  # rten-convert: does rten (no RNN op) take it?
            verdict = rten.convert(onnx.load_from_string(serialized[name]))
            rows[name]["rten_converts"] = verdict.ok
            rows[name]["rten_error"] = "" if verdict.ok else verdict.summary

    log("    ORT session creation ...")
    sessions = measure.ort_session_times(serialized, settings.session_repeats)
    for (name, optimize), value in sessions.items():
        key = "session_opt_s" if optimize else "session_noopt_s"
        rows[name][key] = value if isinstance(value, float) else None
    log("    ORT latency ...")
    latencies = measure.ort_latencies(
        serialized,
        prepared.feeds,
        budget=settings.ort_budget,
        min_rounds=settings.min_rounds,
        max_rounds=settings.max_rounds,
    )
    for (name, optimize), (best, median, rounds, spread) in latencies.items():
        prefix = "ort_opt" if optimize else "ort_noopt"
        rows[name][f"{prefix}_s"] = best
        rows[name][f"{prefix}_median_s"] = median
        rows[name][f"{prefix}_rounds"] = rounds
        rows[name][f"{prefix}_spread"] = spread

    int8 = _bench_int8(prepared, serialized, settings, log) if "ours" in serialized else None
    if use_openvino:
        _bench_openvino(prepared, rows, serialized, settings, log)
    if use_tract:
        _bench_tract(prepared, rows, paths, settings, workdir, log)
    return {
        "model": spec.name,
        "spec": dataclasses.asdict(spec),
        "source": prepared.source,
        "note": prepared.note,
        "export_s": prepared.export_seconds,
        "variants": list(rows.values()),
        "int8": int8,
    }


def _bench_int8(prepared, serialized, settings, log) -> dict:
    """``--quantize int8`` (ORT's quantize_dynamic, 7-bit weights) on the original and on
    ours: what it quantizes, size, the error against PyTorch and ORT latency against the
    original."""
    result: dict = {"tolerance": INT8_TOLERANCE}
    quantized = {}
    for name in ("original", "ours"):
        try:
            done = quantize_int8(onnx.load_from_string(serialized[name]))
        except Exception as error:
            result[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            continue
        blob = done.model.SerializeToString()
        outputs = measure.ort_run(blob, prepared.feeds, True)
        result[name] = {
            "quantized": done.quantized,
            "left_float": {op: count for op, (count, _) in done.left_float.items()},
            "size_mb": len(blob) / 2**20,
            "max_abs_diff": _finite(measure.compare(outputs, prepared.expected)),
        }
        if not isinstance(outputs, str):
            quantized[f"{name}-int8"] = blob
    if quantized:
        log(f"    int8 latency ({len(quantized)} variants) ...")
        latencies = measure.ort_latencies(
            {"original": serialized["original"], **quantized},
            prepared.feeds,
            budget=settings.ort_budget,
            min_rounds=settings.min_rounds,
            max_rounds=settings.max_rounds,
        )
        for (name, optimize), (best, _median, _rounds, spread) in latencies.items():
            if optimize:
                result.setdefault("ort_opt_s", {})[name] = best
                result.setdefault("ort_opt_spread", {})[name] = spread
    return result


def remeasure_int8(results: dict, source: str, settings: Settings, log) -> None:
    """The int8 section of ``results`` measured again in place (:func:`_bench_int8` on each
    model's original and ``ours`` as this commit rewrites it), the rest kept;
    ``results["int8_measured"]`` says when and at which commit."""
    chosen = {m["model"] for m in results["models"] if m.get("int8")}
    specs = [spec for spec in models.select(None) if spec.name in chosen]
    by_name = {m["model"]: m for m in results["models"]}
    for spec in specs:
        log(f"{spec.name}: int8 ({source})")
        prepared = models.prepare(spec, by_name[spec.name].get("source", source))
        serialized = {}
        for name in ("original", "ours"):
            result = variants.apply_variant(name, prepared.model)
            assert result.model is not None, f"{spec.name} {name}: {result.error}"
            serialized[name] = result.model.SerializeToString()
        by_name[spec.name]["int8"] = _bench_int8(prepared, serialized, settings, log)
    environment = report.environment()
    results["int8_measured"] = {k: environment[k] for k in ("date", "commit", "load_average")}


def _bench_openvino(prepared, rows, serialized, settings, log) -> None:
    """OpenVINO: outputs vs PyTorch (and at other sizes), then compile time and latency of
    the variants whose outputs are right."""
    runnable = {}
    for name, blob in serialized.items():
        row = rows[name]
        outputs = measure.ov_run(blob, prepared.feeds)
        row["ov_error"] = outputs if isinstance(outputs, str) else ""
        row["ov_diff"] = _finite(measure.compare(outputs, prepared.expected))
        row["ov_axes_kept"] = {}
        for axis, (feeds, expected) in prepared.other.items():
            other = measure.ov_run(blob, feeds)
            runs = measure.compare(other, expected) <= 1e-4
            row["ov_axes_kept"][axis] = bool(runs and row["symbolic_axes"][axis])
        if row["ov_diff"] is not None and row["ov_diff"] <= measure.ATOL:
            runnable[name] = blob  # a wrong output is reported as wrong, not timed
    if not runnable:
        return
    log(f"    OpenVINO compile and latency ({len(runnable)} variants) ...")
    for name, seconds in measure.ov_compile_times(runnable, settings.ov_compile_repeats).items():
        rows[name]["ov_compile_s"] = seconds
    latencies = measure.ov_latencies(
        runnable,
        prepared.feeds,
        budget=settings.ov_budget,
        min_rounds=settings.min_rounds,
        max_rounds=settings.max_rounds,
    )
    for name, (best, median, rounds, spread) in latencies.items():
        rows[name]["ov_s"] = best
        rows[name]["ov_median_s"] = median
        rows[name]["ov_rounds"] = rounds
        rows[name]["ov_spread"] = spread


def _record_tract_probe(row: dict, probe, prepared) -> None:
    """Store what tract gave: error, crash, diff vs PyTorch, and which symbolic axes held."""
    row["tract_error"] = probe.error
    row["tract_crashed"] = probe.crashed
    row["tract_diff"] = _finite(measure.compare(probe.outputs[0], prepared.expected))
    row["tract_axes_kept"] = {
        axis: bool(
            row["symbolic_axes"][axis]
            and measure.compare(probe.outputs[i + 1], prepared.other[axis][1]) <= 1e-4
        )
        for i, axis in enumerate(prepared.other)
    }


def _bench_tract(prepared, rows, paths, settings, workdir, log) -> None:
    spec = prepared.spec
    input_names = list(prepared.feeds)
    feed_files = [_save_feeds(os.path.join(workdir, f"{spec.name}-feeds.npz"), prepared.feeds)]
    axes = list(prepared.other)
    for axis in axes:
        feeds, _ = prepared.other[axis]
        feed_files.append(_save_feeds(os.path.join(workdir, f"{spec.name}-{axis}.npz"), feeds))
    log("    tract probes ...")
    runnable = {}
    names = list(paths)
    probes = measure.tract_probe(
        [paths[name] for name in names],
        input_names,
        feed_files,
        [os.path.join(workdir, f"{spec.name}-{name}-tract-") for name in names],
        settings.tract_timeout,
    )
    for name, probe in zip(names, probes, strict=True):
        row = rows[name]
        _record_tract_probe(row, probe, prepared)
        if probe.outputs[0] is not None:
            runnable[name] = paths[name]
    if not runnable:
        return
    log(f"    tract timing ({len(runnable)} variants) ...")
    timing = measure.tract_timing(
        runnable,
        input_names,
        feed_files[0],
        load_repeats=settings.tract_load_repeats,
        budget=settings.tract_budget,
        min_rounds=settings.min_rounds,
        max_rounds=settings.max_rounds,
        workdir=workdir,
        timeout=settings.tract_timeout,
    )
    if isinstance(timing, str):
        for name in runnable:
            rows[name]["tract_error"] = rows[name]["tract_error"] or f"timing: {timing}"
        return
    for name in runnable:
        rows[name]["tract_load_s"] = timing["load"][name]
        best, median, rounds, spread = timing["latency"][name]
        rows[name]["tract_s"] = best
        rows[name]["tract_median_s"] = median
        rows[name]["tract_rounds"] = rounds
        rows[name]["tract_spread"] = spread


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny models, few repetitions")
    parser.add_argument(
        "--models", nargs="+", metavar="NAME", help="models whose name contains NAME (default all)"
    )
    parser.add_argument("--list", action="store_true", help="list the models and variants")
    parser.add_argument("--variants", nargs="+", metavar="NAME", help="variants (default all)")
    parser.add_argument(
        "--source",
        choices=["auto", "torch", "builder"],
        default="auto",
        help="torch exports (auto: the builder where the export freezes an axis)",
    )
    parser.add_argument("--no-tract", action="store_true", help="skip the tract runtime")
    parser.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO runtime")
    parser.add_argument("--no-overhead", action="store_true", help="skip the optimize() overhead")
    parser.add_argument("--out-dir", type=pathlib.Path, help="write benchmarks.md/.png/.json here")
    parser.add_argument("--from-json", type=pathlib.Path, help="only re-render these results")
    parser.add_argument(
        "--int8-only",
        action="store_true",
        help="measure the int8 section of --from-json (default benchmarks/results.json) again, "
        "keep the rest, write both back",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for spec in models.QUICK_MATRIX + models.FULL_MATRIX:
            print(f"{spec.name:24} {spec}")
        print("variants:", ", ".join(variants.VARIANTS))
        return 0
    out_dir = args.out_dir or (ROOT / "docs" if not args.quick else None)
    if out_dir is None:
        raise SystemExit("--quick writes nowhere by default: pass --out-dir")
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    settings = Settings.quick() if args.quick else Settings()
    if args.int8_only:
        path = args.from_json or ROOT / "benchmarks" / "results.json"
        results = json.loads(path.read_text())
        remeasure_int8(results, args.source, settings, log)
        path.write_text(json.dumps(results, indent=1))
        report.write(results, out_dir)
        return 0
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        report.write(results, out_dir)
        return 0
    names = variants.parse_variants(args.variants)
    specs = models.select(args.models, quick=args.quick)
    use_tract = not args.no_tract and measure.tract_available()
    if not args.no_tract and not use_tract:
        log("tract is not installed: its columns stay empty (pip install tract)")
    use_rten = rten.version() is not None
    if not use_rten:
        log("rten-convert is not installed: its column stays empty (pip install rten-convert)")
    use_openvino = not args.no_openvino and measure.openvino_available()
    if not args.no_openvino and not use_openvino:
        log("openvino is not installed: its columns stay empty (pip install openvino)")
    started = time.perf_counter()
    results = {
        "environment": report.environment(),
        "command": " ".join(
            ["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])]
        ),
        "settings": dataclasses.asdict(settings),
        "variants": {name: variants.VARIANTS[name][1] for name in names},
        "targets": dict(TARGETS),
        "default_target": DEFAULT_TARGET,
        "tract": use_tract,
        "openvino": use_openvino,
        "rten": use_rten,
        "models": [],
    }
    with tempfile.TemporaryDirectory(prefix="rnn-bench-") as workdir:
        for spec in specs:
            log(f"{spec.name}: preparing ({args.source}) at {time.perf_counter() - started:.0f} s")
            prepared = models.prepare(spec, args.source)
            log(f"  {prepared.source} {prepared.note} {len(prepared.model.graph.node)} nodes")
            results["models"].append(
                bench_model(
                    prepared, names, settings, workdir, use_tract, use_openvino, use_rten, log
                )
            )
    if not args.no_overhead:
        log(f"optimize() overhead on a {settings.overhead_nodes}-node model ...")
        large = overhead.build_large_model(settings.overhead_nodes)
        results["overhead"] = overhead.measure_optimize_overhead(large, settings.overhead_repeats)
    results["total_s"] = time.perf_counter() - started
    json_path = (
        out_dir / "benchmarks.json" if args.out_dir else ROOT / "benchmarks" / "results.json"
    )
    json_path.write_text(json.dumps(results, indent=1))
    report.write(results, out_dir)
    log(f"done in {results['total_s']:.0f} s -> {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
