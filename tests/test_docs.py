"""Every ```python block in README.md and docs/*.md runs, so the docs cannot rot.

Blocks in one file run in order in one namespace, from a temporary directory.
"""

from __future__ import annotations

import pathlib
import re

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
    ci = (ROOT / ".ci" / "run").read_text()
    assert install_and_test in ci.splitlines()
