"""Every ```python block in README.md and docs/*.md runs, so the docs cannot rot.

Blocks in one file run in order in one namespace, from a temporary directory.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path: pathlib.Path) -> list[str]:
    return _BLOCK.findall(path.read_text())


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_doc_examples_run(path: pathlib.Path, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"doc_{path.stem}"}
    for index, block in enumerate(python_blocks(path)):
        code = compile(block, f"{path.name}[block {index}]", "exec")
        exec(code, namespace)


def test_readme_commands_are_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    bash = re.findall(r"^```bash\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
    assert len(bash) >= 2
    install_and_main, install_and_test = bash[0].strip(), bash[1].strip()
    assert "rnn-rewrite demo" in install_and_main
    # .ci/run reads the command from the README and runs it as written, in a fresh venv
    ci = (ROOT / ".ci" / "run").read_text()
    reader = re.search(r"^readme_test_command\(\) \{\n.*?^\}", ci, re.MULTILINE | re.DOTALL)
    assert reader is not None
    read = subprocess.run(
        ["bash", "-c", f"{reader.group()}\nreadme_test_command"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert read.stdout.strip() == install_and_test
    assert "command=$(readme_test_command)" in ci and 'eval "$command"' in ci
    assert 'python -m venv "$venv"' in ci


def _results() -> dict:
    return json.loads((ROOT / "benchmarks" / "results.json").read_text())


def test_the_front_page_shows_the_benchmark_s_seed_numbers() -> None:
    """docs/index.md's seed table is the one the benchmark wrote from results.json."""
    from benchmarks import report

    page = (ROOT / "docs" / "index.md").read_text()
    assert all(marker in page for marker in report.SEED_NUMBERS)
    assert report.seed_numbers(_results(), page) == page
    assert "| ORT latency, default optimizations |" in page


def test_the_benchmark_report_names_this_package_and_a_commit_of_its_history() -> None:
    import rnn_rewrite_rules

    environment = _results()["environment"]
    assert environment["versions"]["rnn-rewrite-rules"] == rnn_rewrite_rules.__version__
    commit = environment["commit"].split()[0]
    if not (ROOT / ".git").exists():  # an sdist: no history to look in
        return
    known = subprocess.run(
        ["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=ROOT, capture_output=True
    )
    assert known.returncode == 0, f"docs/benchmarks.md names commit {commit}, not in HEAD's history"
