"""Rewriting a big model: wall time and peak resident memory, ours against onnxslim and onnxsim.

The model is torchlib's export of an 8-layer ``LSTM(1024)`` (``build_torchlib_model``,
269 MB of weights), written under a temporary directory once embedded in the ``.onnx``
file and once with external data. Each tool runs in a child process that loads the file,
rewrites or simplifies it and saves the result; the child's peak RSS comes from
``resource.getrusage(RUSAGE_CHILDREN)`` in a fresh intermediate process (so it is that
tool's alone), the wall time from the same process. Rounds are interleaved (every tool
once per round) and the best and the spread over rounds are reported.

Run ``python -m benchmarks.bigmodel`` (``--layers``, ``--hidden``, ``--rounds``,
``--tools``); ``--markdown docs/bigmodel.md`` writes the generated page the docs link
to. The ``rnn-rewrite --verify`` tool also runs the original and the result in ONNX
Runtime, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

__all__ = ["TOOLS", "build", "main", "measure"]

#: tool -> Python code run in the child; ``src``, ``dst`` and ``external`` are defined.
TOOLS = {
    "rnn-rewrite": textwrap.dedent(
        """
        from rnn_rewrite_rules import cli
        args = [src, "-o", dst, "--quiet"]
        code = cli.main(args)
        assert code == 0, code
        """
    ),
    "rnn-rewrite --verify": textwrap.dedent(
        """
        from rnn_rewrite_rules import cli
        args = [src, "-o", dst, "--quiet", "--verify"]
        code = cli.main(args)
        assert code == 0, code
        """
    ),
    "onnxslim": textwrap.dedent(
        """
        import onnx, onnxslim
        model = onnxslim.slim(src)
        data = os.path.basename(dst) + ".data"
        onnx.save(model, dst, save_as_external_data=external, location=data)
        """
    ),
    "onnxsim": textwrap.dedent(
        """
        import onnx, onnxsim
        model, ok = onnxsim.simplify(src)
        assert ok
        data = os.path.basename(dst) + ".data"
        onnx.save(model, dst, save_as_external_data=external, location=data)
        """
    ),
}

#: Runs ``code`` as a child and prints its peak RSS (KiB) and wall seconds as JSON.
_MEASURER = textwrap.dedent(
    """
    import json, resource, subprocess, sys, time
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"rc": done.returncode, "peak_kib": peak, "wall": wall}))
    """
)

_PRELUDE = "import os, sys\nsrc, dst, external = sys.argv[1], sys.argv[2], sys.argv[3] == '1'\n"


def build(directory: Path, layers: int = 8, hidden: int = 1024) -> dict[str, Path]:
    """Write the model twice under ``directory``: embedded and with external data."""
    import onnx

    from rnn_rewrite_rules.testing import RnnConfig, build_torchlib_model

    cfg = RnnConfig(input_size=hidden, hidden_size=hidden, num_layers=layers)
    model = build_torchlib_model(cfg)
    paths = {"embedded": directory / "big.onnx", "external": directory / "big_ext.onnx"}
    onnx.save(model, paths["embedded"])
    onnx.save(
        model,
        paths["external"],
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="big_ext.onnx.data",
    )
    return paths


def model_bytes(path: Path) -> int:
    """The file and its external data files (all ``<name>*`` files next to it)."""
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def measure(tool: str, src: Path, dst: Path, external: bool) -> dict:
    """One run of ``tool`` in a child process: peak RSS (bytes), wall seconds."""
    env = dict(os.environ)
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(root / "src"), env.get("PYTHONPATH", "")) if p
    )
    code = _PRELUDE + TOOLS[tool]
    out = subprocess.run(
        [sys.executable, "-c", _MEASURER, code, str(src), str(dst), "1" if external else "0"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    lines = out.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"rc": -1, "peak_kib": 0, "wall": 0.0}
    if result["rc"] != 0:
        result["error"] = out.stderr.strip().splitlines()[-1:] or ["?"]
    for path in dst.parent.glob(dst.name + "*"):
        path.unlink()
    return {"peak": result["peak_kib"] * 1024, "wall": result["wall"], **result}


def _interpreter_bytes() -> int:
    """Peak RSS of a child that imports our package and exits (the fixed cost)."""
    code = "import rnn_rewrite_rules.cli, onnx_ir, onnxscript, numpy"
    out = subprocess.run(
        [sys.executable, "-c", _MEASURER, code], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_kib"] * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bigmodel")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--forms", default="embedded,external")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--markdown", type=Path, help="also write the table as a page here")
    args = parser.parse_args(argv)
    tools = args.tools.split(",")
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="bigmodel-") as scratch:
        paths = build(Path(scratch), args.layers, args.hidden)
        size = model_bytes(paths["embedded"])
        base = _interpreter_bytes()
        print(f"model: {args.layers}-layer LSTM({args.hidden}), {size / 1e6:.0f} MB; ", end="")
        print(f"interpreter with our imports: {base / 1e6:.0f} MB")
        for _ in range(args.rounds):
            for form in args.forms.split(","):
                for tool in tools:
                    dst = Path(scratch) / f"out_{tool}.onnx"
                    run = measure(tool, paths[form], dst, form == "external")
                    results.setdefault(form, {}).setdefault(tool, []).append(run)
    rows = _rows(results, size)
    print(f"{'form':<9} {'tool':<20} {'peak RSS MB':>12} {'x model':>8} {'wall s':>8}  spread")
    for form, tool, row in rows:
        if row is None:
            print(f"{form:<9} {tool:<20} failed: {results[form][tool][0].get('error')}")
            continue
        peak, ratio, wall, rss_spread, wall_spread = row
        print(
            f"{form:<9} {tool:<20} {peak / 1e6:>12.0f} {ratio:>8.2f} {wall:>8.1f}  "
            f"RSS {rss_spread / 1e6:.0f} MB, wall {wall_spread:.1f} s"
        )
    if args.markdown:
        args.markdown.write_text(_markdown(args, rows, results, size, base))
    if args.json:
        args.json.write_text(json.dumps({"model_bytes": size, "results": results}, indent=1))
    return 0


def _rows(results: dict, size: int) -> list[tuple[str, str, tuple | None]]:
    """(form, tool, (best peak, peak / model, best wall, RSS spread, wall spread) or None)."""
    rows = []
    for form, by_tool in results.items():
        for tool, runs in by_tool.items():
            if any("error" in r for r in runs):
                rows.append((form, tool, None))
                continue
            peaks = [r["peak"] for r in runs]
            walls = [r["wall"] for r in runs]
            spread = (max(peaks) - min(peaks), max(walls) - min(walls))
            rows.append((form, tool, (min(peaks), min(peaks) / size, min(walls), *spread)))
    return rows


def _markdown(args, rows, results, size: int, base: int) -> str:
    """The generated page: how it was measured, then one row per form and tool."""
    from benchmarks.report import environment

    env = environment()
    lines = [
        "# Big model: peak memory and wall time",
        "",
        "Generated by `python -m benchmarks.bigmodel --markdown docs/bigmodel.md`; do not "
        "edit by hand.",
        "",
        f"- model: torchlib's {args.layers}-layer `LSTM({args.hidden})`, "
        f"{size / 1e6:.0f} MB; inputs: {args.forms.replace(',', ', ')} "
        "(weights in the `.onnx`, or as external data)",
        f"- date: {env['date']}; {env['cores']} cores, load average at the end "
        f"{env['load_average']:.1f}; Python {env['python']}; commit {env['commit']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"- the interpreter with our imports alone peaks at {base / 1e6:.0f} MB",
        f"- each tool runs in a child process (load, rewrite or simplify, save); "
        f"{args.rounds} interleaved rounds: the best peak RSS and wall time, and their "
        "spread (max - min) over rounds",
        "",
        "| input | tool | peak RSS | x model | wall (best) | spread over rounds |",
        "|---|---|---:|---:|---:|---|",
    ]
    for form, tool, row in rows:
        if row is None:
            error = " ".join(str(results[form][tool][0].get("error")).split())[:120]
            lines.append(f"| {form} | {tool} | failed: {error} | | | |")
            continue
        peak, ratio, wall, rss_spread, wall_spread = row
        lines.append(
            f"| {form} | {tool} | {peak / 1e6:,.0f} MB | {ratio:.2f} | {wall:.1f} s | "
            f"RSS {rss_spread / 1e6:,.0f} MB, wall {wall_spread:.1f} s |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
