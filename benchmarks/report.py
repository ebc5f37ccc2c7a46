"""Render benchmark results (the JSON ``run.py`` writes) as docs/benchmarks.md and a PNG chart."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import math
import os
import pathlib
import platform
import re
import subprocess
from collections.abc import Sequence

__all__ = ["environment", "git_commit", "write"]

#: Our variants, and the tools they are compared with.
OURS = ("ours", "ours+optimize", "ours-onnxruntime")
TOOLS = ("onnxscript", "onnxsim", "onnxslim", "ort-offline")
#: A latency ratio is "within noise" of another when at most this much larger.
NOISE = 0.05
ATOL = 1e-4
_PACKAGES = (
    "rnn-rewrite-rules",
    "onnxscript",
    "onnx-ir",
    "onnx",
    "onnxruntime",
    "onnxsim",
    "onnxslim",
    "tract",
    "openvino",
    "rten-convert",
    "torch",
    "numpy",
)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: What the benchmarks write (git pathspecs left out of :func:`git_commit`'s mark).
_GENERATED = (
    ":(exclude)docs/*.md",
    ":(exclude)docs/*.png",
    ":(exclude)benchmarks/results.json",
    ":(exclude)src/rnn_rewrite_rules/costs/*.json",
)


def git_commit() -> str:
    """HEAD's short hash, marked when tracked files have uncommitted changes (but the
    generated pages and tables themselves: a run writes several in turn)."""
    root = pathlib.Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *_GENERATED],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" + uncommitted changes" if dirty else "")


def environment() -> dict:
    """The machine, the versions and the rule families the results were measured with."""
    import rnn_rewrite_rules
    from rnn_rewrite_rules.rules import families

    # the code measured, whatever an earlier install left in the package metadata
    versions = {"rnn-rewrite-rules": rnn_rewrite_rules.__version__}
    for name in _PACKAGES[1:]:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "commit": git_commit(),
        "families": list(families()),
    }


# ---------------------------------------------------------------- formatting


def _time(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or not base:
        return None
    return value / base


def _x(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×"


def _yes(flag: bool | None) -> str:
    return "–" if flag is None else ("yes" if flag else "no")


def _axes(kept: dict | None) -> str:
    if not kept:
        return "–"
    return ", ".join(f"{axis} {'kept' if ok else '**frozen**'}" for axis, ok in kept.items())


def _diff(value: float | None) -> str:
    if value is None:
        return "**failed**"
    text = f"{value:.1e}" if value else "0"
    return text if value <= ATOL else f"**{text}**"


def _row_map(model: dict) -> dict[str, dict]:
    return {row["variant"]: row for row in model["variants"]}


def _correct(row: dict | None) -> bool:
    return bool(row) and row.get("max_abs_diff") is not None and row["max_abs_diff"] <= ATOL


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


# ---------------------------------------------------------------- sections


def _environment_section(results: dict) -> list[str]:
    env = results["environment"]
    lines = [
        "## Machine and versions",
        "",
        f"- date: {env['date']}; total benchmark time {results.get('total_s', 0) / 60:.1f} min",
        f"- command: `{results['command']}`",
        f"- CPU: {env['cpu']}, {env['cores']} cores (shared; 1-minute load average at start "
        f"{env['load_average']:.1f}); {env['platform']}; Python {env['python']}",
        f"- commit: {env['commit']}; rule families present: {', '.join(env['families'])}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        "",
    ]
    settings = results["settings"]
    lines += [
        "Variants:",
        "",
        *[f"- **{name}**: {text}" for name, text in results["variants"].items()],
        "",
        "Method: ONNX Runtime on CPU with `intra_op_num_threads=1`; latency is the best of "
        f"{settings['min_rounds']}-{settings['max_rounds']} interleaved rounds (every variant and "
        "optimization level runs once per round, several calls per sample for calls under 2 ms, "
        f"about {settings['ort_budget']:.0f} s per model), reported with its ratio to the "
        "original measured in the same rounds. Session creation is the best of "
        f"{settings['session_repeats']} interleaved creations. tract (no input facts set, so the "
        "symbolic axes stay symbolic) runs in a child process, because a tract panic aborts its "
        f"process; its load time is the best of {settings['tract_load_repeats']} loads "
        "(`load().into_model().into_runnable()`). OpenVINO on CPU with "
        "`INFERENCE_NUM_THREADS=1, NUM_STREAMS=1, INFERENCE_PRECISION_HINT=f32`: compile "
        "time (`read_model` + `compile_model`) is the best of "
        f"{settings.get('ov_compile_repeats', '–')} interleaved compiles, latency "
        "(`InferRequest.infer`) is timed like ONNX Runtime's, in its own interleaved "
        f"rounds (about {settings.get('ov_budget', 0):.0f} s per model); a variant whose "
        "OpenVINO outputs are wrong is reported as wrong and not timed. Dynamic axes are "
        "checked by running each "
        "variant at a size other than the export's on that axis (and checking the input "
        "still declares it symbolic); a variant that fails there or gives other outputs "
        "than PyTorch freezes the axis. Max abs diff is against PyTorch, at the benchmark "
        f"size, the worse of ORT with and without optimizations. Equal means <= {ATOL:g}.",
        "",
    ]
    return lines


def _seed_table(results: dict) -> list[str]:
    """The seed model's table, original vs ours, or [] when it was not measured."""
    seed = next((m for m in results["models"] if m["model"].startswith("seed")), None)
    if seed is None:
        return []
    rows = _row_map(seed)
    original, ours = rows.get("original"), rows.get("ours")
    if not original or not ours:
        return []
    metrics = [
        ("ORT latency, default optimizations", "ort_opt_s"),
        ("ORT latency, ORT_DISABLE_ALL", "ort_noopt_s"),
        ("ORT session creation, default optimizations", "session_opt_s"),
        ("ORT session creation, ORT_DISABLE_ALL", "session_noopt_s"),
        ("OpenVINO compile", "ov_compile_s"),
        ("OpenVINO latency", "ov_s"),
        ("tract load", "tract_load_s"),
        ("tract latency", "tract_s"),
    ]
    table = [
        [
            label,
            _time(original.get(key)),
            _time(ours.get(key)),
            _x(_ratio(ours.get(key), original.get(key))),
        ]
        for label, key in metrics
    ]
    table.insert(0, ["nodes", str(original.get("nodes", "–")), str(ours.get("nodes", "–")), ""])
    table.insert(
        1,
        [
            "weights folded into initializers",
            _yes(original.get("weights_folded")),
            _yes(ours.get("weights_folded")),
            "",
        ],
    )
    table.insert(
        2,
        [
            "model size",
            f"{original.get('size_mb', 0):.1f} MB",
            f"{ours.get('size_mb', 0):.1f} MB",
            _x(_ratio(ours.get("size_mb"), original.get("size_mb"))),
        ],
    )
    spec = seed["spec"]
    return [
        f"`{seed['model']}`: {spec['num_layers']}-layer {spec['op_type']}({spec['hidden_size']}), "
        f"batch_first, batch {spec['batch']}, seq {spec['seq']}, from {seed['source']}; one run, "
        "interleaved, one thread.",
        "",
        *_table(["", "original", "ours (`rewrite`)", "ours / original"], table),
    ]


def _seed_section(results: dict) -> list[str]:
    table = _seed_table(results)
    if not table:
        return []
    return ["## The seed model: original vs rewritten", "", *table, ""]


#: The lines between which ``docs/index.md`` shows the seed table (:func:`seed_numbers`).
SEED_NUMBERS = (
    "<!-- the seed numbers: generated by `python -m benchmarks.run`; do not edit -->",
    "<!-- end of the seed numbers -->",
)


def seed_numbers(results: dict, page: str) -> str:
    """``page`` with the seed table (and the run's date, commit and versions) put between
    the :data:`SEED_NUMBERS` lines; ``page`` unchanged where it has none."""
    start, end = SEED_NUMBERS
    if start not in page or end not in page:
        return page
    environment = results.get("environment", {})
    versions = environment.get("versions", {})
    measured = (
        f"Measured {environment.get('date', '?')} at commit {environment.get('commit', '?')} "
        f"with onnxruntime {versions.get('onnxruntime', '?')}, openvino "
        f"{versions.get('openvino', '?')} and tract {versions.get('tract', '?')} "
        "([benchmarks.md](benchmarks.md) has the method and the spreads)."
    )
    block = "\n".join([start, "", *_seed_table(results), "", measured, "", end])
    before, rest = page.split(start, 1)
    return before + block + rest.split(end, 1)[1]


def _best_other(rows: dict[str, dict], key: str) -> tuple[float | None, str]:
    base = rows.get("original", {}).get(key)
    best, who = None, ""
    for tool in TOOLS:
        row = rows.get(tool)
        ratio = _ratio(row.get(key), base) if _correct(row) else None
        if ratio is not None and (best is None or ratio < best):
            best, who = ratio, tool
    return best, who


def _noise(rows: dict[str, dict], key: str, names: Sequence[str]) -> float:
    """The comparison's tolerance: the largest trial-to-trial spread of these rows' bests."""
    spreads = [rows.get(n, {}).get(key.replace("_s", "_spread")) for n in names]
    return max([NOISE, *(s for s in spreads if s is not None)])


def _target_section(results: dict) -> list[str]:
    header = [
        "model",
        "variant",
        "nodes (best other)",
        "axes kept",
        "ORT ratio (best other)",
        "ORT_DISABLE_ALL ratio (best other)",
        "outputs equal",
        "target met",
        "why not",
    ]
    table = []
    for model in results["models"]:
        rows = _row_map(model)
        base = rows.get("original", {})
        others = [rows[t] for t in TOOLS if t in rows and rows[t].get("nodes") is not None]
        best_nodes = min((r["nodes"] for r in others), default=None)
        best_nodes_tool = next((r["variant"] for r in others if r["nodes"] == best_nodes), "")
        for name in OURS:
            row = rows.get(name)
            if not row:
                continue
            if row.get("nodes") is None:
                why = f"the rewrite failed: {row.get('error', '?')}"
                table.append([model["model"], name, "failed", "", "", "", "", "**no**", why])
                continue
            checks, why = [], []
            nodes_ok = best_nodes is None or row["nodes"] <= best_nodes
            checks.append(nodes_ok)
            if not nodes_ok:
                why.append(_fewer_nodes(rows, name, best_nodes_tool))
            axes_ok = all(row.get("axes_kept", {}).values())
            checks.append(axes_ok)
            cells = []
            for key in ("ort_opt_s", "ort_noopt_s"):
                ratio = _ratio(row.get(key), base.get(key))
                best, who = _best_other(rows, key)
                noise = _noise(rows, key, (name, who, "original"))
                ok = ratio is not None and (best is None or ratio <= best * (1 + noise))
                checks.append(ok)
                if not ok and ratio is not None:
                    label = "ORT" if key == "ort_opt_s" else "ORT_DISABLE_ALL"
                    versus = "no slower than" if ratio <= 1 + noise else "**slower** than"
                    why.append(f"{label}: {versus} the original ({_x(ratio)}), {who} faster")
                mark = "" if ok else " ✗"
                cells.append(f"{_x(ratio)} ({_x(best)} {who}; ±{noise:.0%}){mark}")
            equal = _correct(row)
            checks.append(equal)
            if not all(checks):
                why += _declined(row)
            table.append(
                [
                    model["model"],
                    name,
                    f"{row['nodes']} ({best_nodes} {best_nodes_tool})" + ("" if nodes_ok else " ✗"),
                    "all" if axes_ok else "**no**",
                    *cells,
                    "yes" if equal else "**no**",
                    "yes" if all(checks) else "**no**",
                    "; ".join(why),
                ]
            )
    return [
        "## Target check (issue 5)",
        "",
        "Our target on every model: nodes <= the best other tool, every dynamic axis kept, "
        "latency ratio <= the best other tool's within noise, outputs equal. The noise (±) "
        "is the largest spread, over ours, that tool and the original, of the best "
        "latency in three interleaved thirds of the rounds (every third round), and at "
        f"least {NOISE:.0%}. "
        '"Best other" is the best of '
        + ", ".join(TOOLS)
        + " among those whose outputs are equal to PyTorch's (a tool that froze an axis "
        "still counts: it may be faster for it). ✗ marks a criterion that is not met. "
        '"Why not" is generated from the run: the ops the variant has beyond the tool with '
        "the fewest nodes (and the other target's count when that one meets it), whether a "
        "slower latency is still no slower than the original, and the rewrites our rules "
        "proved but left undone for the target (cost, a runtime's missing op), as "
        "`rnn-rewrite --check` says them.",
        "",
        *_table(header, table),
        "",
    ]


def _fewer_nodes(rows: dict[str, dict], name: str, tool: str) -> str:
    """What ``name``'s row has beyond ``tool``'s (op: count), and the other target's
    node count when it has no more nodes than ``tool``."""
    ours, theirs = rows[name].get("ops") or {}, rows[tool].get("ops") or {}
    extra = {op: n - theirs.get(op, 0) for op, n in ours.items() if n > theirs.get(op, 0)}
    text = f"vs {tool}: " + ", ".join(
        f"+{n} {op}" for op, n in sorted(extra.items(), key=lambda item: (-item[1], item[0]))
    )
    fewer = {op: n - ours.get(op, 0) for op, n in theirs.items() if n > ours.get(op, 0)}
    if fewer:
        text += " (" + ", ".join(f"{n} {op} fewer" for op, n in sorted(fewer.items())) + ")"
    other = "ours-onnxruntime" if name != "ours-onnxruntime" else "ours"
    other_nodes = rows.get(other, {}).get("nodes")
    if other_nodes is not None and other_nodes <= rows[tool]["nodes"]:
        text += f"; {other} has {other_nodes}"
    return text


def _declined(row: dict) -> list[str]:
    """The rewrites the run proved but left undone for the target, counted by reason."""
    counts: dict[str, int] = {}
    for reason in row.get("declined") or []:
        counts[reason] = counts.get(reason, 0) + 1
    return [f"{n} x {reason}" if n > 1 else reason for reason, n in counts.items()]


def _normalized_error(error: str) -> str:
    """A tract error without node names, so equal failures group together."""
    error = re.sub(r'#\d+ "[^"]*"', '#… "…"', error)
    return error.replace("|", "/")[:260]


def _where(variant: str, models: list[str], matrix: list[list[str]]) -> str:
    if len(models) == len(matrix):
        return f"{variant}: all {len(models)} models"
    return f"{variant}: {', '.join(models)}"


def _tract_section(results: dict) -> list[str]:
    if not results.get("tract"):
        return ["## tract (issue 8)", "", "tract was not installed for this run.", ""]
    lines = [
        "## tract portability (issue 8)",
        "",
        "tract 'runs' a variant when it loads it with its symbolic axes and gives PyTorch's "
        f"outputs (<= {ATOL:g}) at the benchmark size. A variant tract cannot run where it "
        "can run the original is a portability bug of that tool's output.",
        "",
    ]
    names = [v for v in results["variants"]]
    matrix = []
    regressions = []
    errors: dict[str, dict[str, list[str]]] = {}
    for model in results["models"]:
        rows = _row_map(model)
        original = rows.get("original", {})
        original_runs = original.get("tract_diff") is not None and original["tract_diff"] <= ATOL
        cells = [model["model"]]
        for name, row in rows.items():
            runs = row.get("tract_diff") is not None and row["tract_diff"] <= ATOL
            if runs:
                continue
            error = row.get("tract_error") or (
                "wrong outputs" if row.get("tract_diff") is not None else "did not run"
            )
            key = ("crash: " if row.get("tract_crashed") else "") + _normalized_error(error)
            errors.setdefault(key, {}).setdefault(name, []).append(model["model"])
            if name != "original" and original_runs:
                regressions.append((model["model"], name, error))
        for name in names:
            row = rows.get(name, {})
            if "tract_diff" not in row:
                cells.append("–")
            elif row["tract_diff"] is not None and row["tract_diff"] <= ATOL:
                cells.append("runs")
            else:
                cells.append("**crash**" if row.get("tract_crashed") else "**fails**")
        matrix.append(cells)
    lines += [*_table(["model", *names], matrix), ""]
    if regressions:
        ours = [r for r in regressions if r[1] in OURS]
        where = sorted({name for _, name, _ in regressions})
        lines += [
            f"**{len(regressions)} model/variant pairs that tract cannot run although it runs "
            f"the original**, {len(ours)} of them ours (variants: {', '.join(where)}).",
            "",
        ]
    else:
        lines += ["Every variant of every model runs in tract wherever the original does.", ""]
    if errors:
        lines += [
            "tract's errors (node names elided):",
            "",
            *_table(
                ["error", "variant: models"],
                [
                    [error, "; ".join(_where(name, found, matrix) for name, found in where.items())]
                    for error, where in errors.items()
                ],
            ),
            "",
        ]
    if any("UndeterminedSymbol" in error for _, _, error in regressions):
        lines += [
            'Cause of the `UndeterminedSymbol("batch")` panics: those outputs have '
            "`LSTM`/`GRU` nodes without `initial_h` (`initial_c`), which ONNX defines as "
            "zeros; ours-onnxruntime drops torchlib's runtime zero states (`initial_state` "
            "rules, target `onnxruntime`), onnxsim folds them away too; our default target "
            "(`portable`) keeps one shared explicit zero state instead. tract 0.23.9 builds "
            "the missing zeros from the "
            "symbolic batch when it prepares the model and panics, aborting the process. "
            "The other error, `Clashing resolution for expression` in a `Scan`, is tract's "
            "handling of torchlib's runtime zero state (an `Expand` of a runtime shape, "
            "sliced per layer) in these LSTMs: it fails on the original too, and tract runs "
            "the same models with states given as graph inputs (`tests/test_tract.py`).",
            "",
        ]
    return lines


# ---------------------------------------------------------------- portability

#: Runtime -> (label, the row's diff key, error key, crash key or None).
RUNTIMES = {
    "onnxruntime": ("max_abs_diff", "ort_error", None),
    "tract": ("tract_diff", "tract_error", "tract_crashed"),
    "openvino": ("ov_diff", "ov_error", None),
    "onnx.reference": ("reference_diff", "reference_error", None),
    # a conversion check: rten-convert converts it (rten's runtime is a Rust crate)
    "rten": ("rten_converts", "rten_error", None),
}


def outcome(row: dict, runtime: str) -> str | None:
    """``runs``, ``crash``, ``fails``, ``wrong``, or None where the runtime was not measured."""
    diff_key, error_key, crash_key = RUNTIMES[runtime]
    if row.get("nodes") is None or diff_key not in row:
        return None
    if crash_key and row.get(crash_key):
        return "crash"
    if runtime == "rten":
        return "runs" if row[diff_key] else "fails"
    diff = row.get(diff_key)
    if diff is not None and diff <= ATOL:
        return "runs"
    return "fails" if row.get(error_key) else "wrong"


def _count_cell(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    if not total:
        return "–"
    parts = [f"{counts['runs']}/{total} run"]
    for kind, label in (("crash", "crash"), ("fails", "fail"), ("wrong", "wrong")):
        if counts[kind]:
            parts.append(f"**{counts[kind]} {label}**")
    return ", ".join(parts)


def _targets_note(results: dict) -> list[str]:
    targets = results.get("targets")
    if not targets:
        return []
    default = results.get("default_target", "portable")
    which = {
        name: next((v for v in results["variants"] if v == f"ours-{name}"), "ours")
        if name != default
        else "ours"
        for name in targets
    }
    return [
        "What each target of `rnn_rewrite_rules.rewrite(model, target=...)` produces "
        "(`rules.TARGETS`): "
        + "; ".join(
            f"**{name}**{' (the default)' if name == default else ''}, variant "
            f"{which[name]}: {text}"
            for name, text in targets.items()
        )
        + ".",
        "",
    ]


def _portability_section(results: dict) -> list[str]:
    runtimes = [r for r in RUNTIMES if _measured(results, r)]
    names = list(results["variants"])
    table = []
    for name in names:
        variant_rows = [_row_map(model).get(name, {}) for model in results["models"]]
        if variant_rows and all(row.get("missing") for row in variant_rows):
            table.append([name, *(["not installed"] * len(runtimes)), "–"])
            continue
        cells = [name]
        for runtime in runtimes:
            counts = dict.fromkeys(("runs", "crash", "fails", "wrong"), 0)
            for model in results["models"]:
                found = outcome(_row_map(model).get(name, {}), runtime)
                if found:
                    counts[found] += 1
            cells.append(_count_cell(counts))
        failed = sum(row.get("nodes") is None and not row.get("missing") for row in variant_rows)
        cells.append(str(failed) if failed else "–")
        table.append(cells)
    wrong = [
        f"{model['model']} ({name} in {runtime})"
        for model in results["models"]
        for name, row in _row_map(model).items()
        for runtime in runtimes
        if outcome(row, runtime) == "wrong"
    ]
    lines = [
        "## Portability",
        "",
        f"Over the {len(results['models'])} benchmark models, at the benchmark size: a "
        "variant *runs* in a runtime when it loads there with its symbolic axes and gives "
        f"PyTorch's outputs (<= {ATOL:g}; ONNX Runtime: with and without optimizations); "
        "*crash*: the runtime killed its process (a tract panic); *fail*: it raised an "
        "error; *wrong*: it ran and gave other outputs. A model the runtime cannot run "
        "in its original form counts against every variant too (compare with the "
        "original's row). rten: *runs* means `rten-convert` converts it (rten's runtime "
        "is a Rust crate; it has `LSTM` and `GRU` but no `RNN` op). Tool failed: the tool "
        "itself raised on that many models.",
        "",
        *_table(["variant", *runtimes, "tool failed"], table),
        "",
        *_targets_note(results),
    ]
    if wrong:
        lines += ["Wrong outputs: " + "; ".join(wrong) + ".", ""]
    return lines


def _int8_section(results: dict) -> list[str]:
    """``--quantize int8``: ORT's quantize_dynamic on the original and on ours."""
    rows = []
    tolerance = None
    for model in results["models"]:
        int8 = model.get("int8")
        if not int8:
            continue
        tolerance = int8["tolerance"]
        latency = int8.get("ort_opt_s", {})
        base = latency.get("original")
        for name in ("original", "ours"):
            row = int8.get(name, {})
            if "error" in row:
                rows.append([model["model"], name, f"**failed**: {row['error']}", "", "", "", ""])
                continue
            quantized = ", ".join(f"{n} {op}" for op, n in row["quantized"].items()) or "none"
            left = ", ".join(f"{n} {op}" for op, n in row["left_float"].items()) or "–"
            diff = row["max_abs_diff"]
            within = diff is not None and diff <= tolerance
            rows.append(
                [
                    model["model"],
                    f"{name} + int8",
                    quantized,
                    left,
                    f"{row['size_mb']:.2f}",
                    _x(_ratio(latency.get(f"{name}-int8"), base)),
                    ("–" if diff is None else f"{diff:.2g}") + ("" if within else " **>**"),
                ]
            )
    if not rows:
        return []
    header = [
        "model",
        "variant",
        "quantized",
        "left float",
        "MB",
        "ORT ratio to the original",
        "max abs diff vs PyTorch",
    ]
    return [
        "## int8 (`rnn-rewrite --quantize int8`)",
        "",
        "ONNX Runtime's own `quantize_dynamic` (7-bit weights, as `--quantize int8` runs it: "
        "docs/int8.md) on the original and on our "
        "default rewrite. It turns an `LSTM` into `DynamicQuantizeLSTM` only when `W` and "
        "`R` are initializers, which torchlib's export does not give and our weight "
        "folding does. `GRU` and `RNN` stay float (ONNX Runtime has no quantized GRU or "
        f"RNN). Tolerance for the int8 error: {tolerance:g} (**>** marks a row above it); "
        "latency: ORT default optimizations, one thread, best of the interleaved rounds."
        + _int8_when(results),
        "",
        *_table(header, rows),
        "",
    ]


def _int8_when(results: dict) -> str:
    """When the int8 rows were measured, where not with the rest (``run --int8-only``)."""
    when = results.get("int8_measured")
    if not when:
        return ""
    load = when.get("load_average")
    load_text = "" if load is None else f", 1-minute load average at start {load:.1f}"
    return (
        f" Measured {when['date']} at commit {when['commit']}{load_text} "
        "(`python -m benchmarks.run --int8-only`), after the rest of this page."
    )


def _measured(results: dict, runtime: str) -> bool:
    key = RUNTIMES[runtime][0]
    return any(key in row for model in results["models"] for row in model["variants"])


def _spread(row: dict, key: str) -> float | None:
    return row.get(key.removesuffix("_s") + "_spread")


def _target_compare_section(results: dict) -> list[str]:
    """ours (target portable) / ours-onnxruntime, per model and runtime."""
    if "ours-onnxruntime" not in results["variants"] or "ours" not in results["variants"]:
        return []
    metrics = [
        ("ORT", "ort_opt_s"),
        ("ORT_DISABLE_ALL", "ort_noopt_s"),
        ("OpenVINO", "ov_s"),
        ("tract", "tract_s"),
        ("ORT session", "session_opt_s"),
        ("OpenVINO compile", "ov_compile_s"),
    ]
    table = []
    for model in results["models"]:
        rows = _row_map(model)
        ours, minimal = rows.get("ours", {}), rows.get("ours-onnxruntime", {})
        cells = [model["model"], f"{ours.get('nodes', '–')} / {minimal.get('nodes', '–')}"]
        for _, key in metrics:
            ratio = _ratio(ours.get(key), minimal.get(key))
            spreads = [x for x in (_spread(ours, key), _spread(minimal, key)) if x is not None]
            noise = f" ±{max(spreads):.0%}" if spreads else ""
            cells.append(_x(ratio) + (noise if ratio is not None else ""))
        table.append(cells)
    return [
        "## Targets: portable (ours) vs onnxruntime (ours-onnxruntime)",
        "",
        "Ratios ours / ours-onnxruntime (below 1: the default portable form is faster), "
        "measured in the same interleaved rounds; ± is the larger of the two rows' "
        "spreads of the best over three interleaved thirds of the rounds. – where either "
        "does not run.",
        "",
        *_table(["model", "nodes", *(label for label, _ in metrics)], table),
        "",
    ]


def _overhead_section(results: dict) -> list[str]:
    data = results.get("overhead")
    if not data:
        return []
    rules = data.get("rules_alone_cpu_s", data.get("rules_alone_s", math.nan))
    data = {
        "repeats": results["settings"]["overhead_repeats"],
        "without_cpu_s": data["without_s"],
        "with_cpu_s": data["with_s"],
        **data,
    }
    return [
        "## Our rules' overhead inside optimize()",
        "",
        f"`onnxscript.optimizer.optimize()` on a {data['nodes']}-node model without any RNN "
        "(`benchmarks/overhead.py`: MatMul/Add/Relu blocks, each ending in exactly the runtime "
        "shape chain torchlib writes after an RNN layer, so our patterns match up to their "
        "producer check on every block), without and with `install()`, interleaved, best of "
        f"{data['repeats']}. Compared on process CPU time (optimize() is single-threaded; "
        "CPU time does not count the other processes of this shared machine), wall-clock "
        "alongside. One optimize() call of this model takes minutes (onnxscript's own "
        "default rules are superlinear in the node count), so the last row also times one "
        "pass of our installed rules alone over the same model (best of 3): optimize() runs "
        "the rewriter at most twice, so our share is at most twice that.",
        "",
        *_table(
            ["", "CPU time", "wall-clock", "nodes after"],
            [
                [
                    "optimize() without install()",
                    _time(data["without_cpu_s"]),
                    _time(data["without_s"]),
                    str(data["nodes_after_without"]),
                ],
                [
                    "optimize() with install()",
                    _time(data["with_cpu_s"]),
                    _time(data["with_s"]),
                    str(data["nodes_after_with"]),
                ],
                ["difference", f"{data['overhead']:+.1%}", "", ""],
                [
                    "our rules alone, one pass",
                    f"{_time(rules)} ({rules / data['without_cpu_s']:.1%} of optimize())",
                    "",
                    "",
                ],
            ],
        ),
        "",
    ]


def _model_sections(results: dict) -> list[str]:
    lines = ["## Every model", ""]
    header = [
        "variant",
        "nodes",
        "Shape chain",
        "weights folded",
        "dynamic axes",
        "max abs diff",
        "ORT latency (ratio)",
        "ORT_DISABLE_ALL (ratio)",
        "session opt / no-opt",
        "tool time",
        "OpenVINO compile (ratio)",
        "OpenVINO latency (ratio)",
        "tract load (ratio)",
        "tract latency (ratio)",
    ]
    for model in results["models"]:
        spec = model["spec"]
        rows = _row_map(model)
        base = rows.get("original", {})
        title = (
            f"### {model['model']}: {spec['num_layers']}-layer "
            f"{'bidirectional ' if spec['bidirectional'] else ''}{spec['op_type']}"
            f"({spec['hidden_size']}), batch {spec['batch']}, seq {spec['seq']}, dynamic "
            f"{' and '.join(spec['dynamic'])}"
        )
        source = f"{'torch export' if model['source'] == 'torch' else 'builder'} ({model['note']})"
        table = []
        for name, row in rows.items():
            if row.get("nodes") is None:
                status = row["error"] if row.get("missing") else f"failed: {row['error']}"
                table.append([name, status] + [""] * (len(header) - 2))
                continue
            tract_load = row.get("tract_load_s")
            tract_cell = _time(row.get("tract_s"))
            if row.get("tract_s") is not None:
                tract_cell += f" ({_x(_ratio(row['tract_s'], base.get('tract_s')))})"
            elif row.get("tract_error") is not None:
                tract_cell = "crash" if row.get("tract_crashed") else "fails"
            kept = row.get("tract_axes_kept")
            if kept and row.get("tract_s") is not None and not all(kept.values()):
                tract_cell += "; " + _axes(kept)
            ov_compile = row.get("ov_compile_s")
            ov_cell = _time(row.get("ov_s"))
            if row.get("ov_s") is not None:
                ov_cell += f" ({_x(_ratio(row['ov_s'], base.get('ov_s')))})"
            elif outcome(row, "openvino") == "fails":
                ov_cell = "fails"
            elif outcome(row, "openvino") == "wrong":
                ov_cell = f"**wrong** ({_diff(row.get('ov_diff'))})"
            ov_kept = row.get("ov_axes_kept")
            if ov_kept and outcome(row, "openvino") == "runs" and not all(ov_kept.values()):
                ov_cell += "; " + _axes(ov_kept)
            table.append(
                [
                    name,
                    str(row["nodes"]),
                    _yes(row["shape_chain"]),
                    _yes(row["weights_folded"]),
                    _axes(row.get("axes_kept")),
                    _diff(row.get("max_abs_diff")),
                    f"{_time(row.get('ort_opt_s'))} "
                    f"({_x(_ratio(row.get('ort_opt_s'), base.get('ort_opt_s')))})",
                    f"{_time(row.get('ort_noopt_s'))} "
                    f"({_x(_ratio(row.get('ort_noopt_s'), base.get('ort_noopt_s')))})",
                    f"{_time(row.get('session_opt_s'))} / {_time(row.get('session_noopt_s'))}",
                    _time(row["tool_s"]) if name != "original" else "–",
                    f"{_time(ov_compile)} ({_x(_ratio(ov_compile, base.get('ov_compile_s')))})"
                    if ov_compile is not None
                    else "–",
                    ov_cell,
                    f"{_time(tract_load)} ({_x(_ratio(tract_load, base.get('tract_load_s')))})"
                    if tract_load is not None
                    else "–",
                    tract_cell,
                ]
            )
        lines += [title, "", f"Source: {source}, exported in {model['export_s']:.1f} s.", ""]
        lines += [*_table(header, table), ""]
    return lines


def chart(results: dict, path: pathlib.Path) -> None:
    """Latency ratios to the original: ORT default, ORT_DISABLE_ALL, OpenVINO, tract."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("ort_opt_s", "ONNX Runtime, default optimizations"),
        ("ort_noopt_s", "ONNX Runtime, ORT_DISABLE_ALL"),
        ("ov_s", "OpenVINO"),
        ("tract_s", "tract"),
    ]
    names = [m["model"] for m in results["models"]]
    shown = [v for v in results["variants"] if v != "original"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 1.1 * len(names) + 3), 14))
    width = 0.8 / max(len(shown), 1)
    for ax, (key, title) in zip(axes, panels, strict=True):
        for index, variant in enumerate(shown):
            values, failed = [], []
            offsets = [i + (index - (len(shown) - 1) / 2) * width for i in range(len(names))]
            for offset, model in zip(offsets, results["models"], strict=True):
                rows = _row_map(model)
                base = rows.get("original", {}).get(key)
                ratio = _ratio(rows.get(variant, {}).get(key), base)
                values.append(ratio if ratio is not None else float("nan"))
                if ratio is None and base is not None and variant in rows:
                    failed.append(offset)
            bars = ax.bar(offsets, values, width, label=variant)
            ax.plot(failed, [0.03] * len(failed), "x", color=bars.patches[0].get_facecolor())
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(
            f"{title}: latency / original (lower is better)\n"
            "x: the variant does not run; no bars: the original does not",
            fontsize=10,
        )
        ax.set_xlim(-0.5, len(names) - 0.5)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ratio")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(ncol=len(shown), fontsize=8, loc="upper left", bbox_to_anchor=(0, 1.35))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(results: dict, out_dir: pathlib.Path) -> None:
    """Write ``benchmarks.md`` and ``benchmarks.png`` (when matplotlib is installed)."""
    with contextlib.suppress(ImportError):  # matplotlib is a bench extra, the table is not
        chart(results, out_dir / "benchmarks.png")
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks.run` (`tox -e bench`) from "
        "`benchmarks/results.json`; do not edit by hand. "
        "Re-render without measuring: `python -m benchmarks.run --from-json "
        "benchmarks/results.json`.",
        "",
        "![latency ratios](benchmarks.png)",
        "",
        *_environment_section(results),
        *_seed_section(results),
        *_target_section(results),
        *_portability_section(results),
        *_target_compare_section(results),
        *_tract_section(results),
        *_int8_section(results),
        *_overhead_section(results),
        *_model_sections(results),
    ]
    (out_dir / "benchmarks.md").write_text("\n".join(lines).rstrip() + "\n")
    index = out_dir / "index.md"  # docs/index.md shows the seed table too
    if index.exists():
        index.write_text(seed_numbers(results, index.read_text()))
