"""docs/figures cannot go stale: the committed .dot files are what docs/make_figures.py makes.

Regenerate with ``tox -e docs`` (or ``python docs/make_figures.py``; needs graphviz's
``dot``). These tests need no ``dot``: they compare the .dot text only.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import pytest

from rnn_rewrite_rules.rules import families

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REGENERATE = "regenerate with `tox -e docs` or `python docs/make_figures.py`"


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_figures", DOCS / "make_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


make_figures = _load_generator()


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return make_figures.render_all()


def test_committed_dot_files_are_current(rendered: dict[str, str]) -> None:
    stale = [
        name
        for name, text in rendered.items()
        if not (DOCS / "figures" / name).is_file() or (DOCS / "figures" / name).read_text() != text
    ]
    assert not stale, f"docs/figures out of date: {stale}; {REGENERATE}"


def test_every_dot_has_its_svg(rendered: dict[str, str]) -> None:
    missing = [n for n in rendered if not (DOCS / "figures" / n).with_suffix(".svg").is_file()]
    assert not missing, f"no .svg for {missing}; {REGENERATE}"


def test_no_leftover_figures(rendered: dict[str, str]) -> None:
    known = {f"{figure.name}.dot" for figure in make_figures.FIGURES}
    leftover = [p.name for p in (DOCS / "figures").glob("*.dot") if p.name not in known]
    assert not leftover, f"figures no generator case makes: {leftover}"


def test_generation_is_deterministic(rendered: dict[str, str]) -> None:
    figure = make_figures.available_figures()[0]
    assert make_figures.render(figure) == rendered[f"{figure.name}.dot"]


def test_every_family_has_a_figure_and_a_section() -> None:
    """A family that lands must come with its picture and its docs/rules.md section."""
    pictured = {figure.family for figure in make_figures.FIGURES}
    rules_md = (DOCS / "rules.md").read_text()
    headings = set(re.findall(r"^## `([a-z_]+)`", rules_md, re.MULTILINE))
    for name in families():
        assert name in pictured, f"no figure for family {name!r} in docs/make_figures.py"
        assert name in headings, f"no '## `{name}`' section in docs/rules.md"


def test_rules_md_shows_every_figure() -> None:
    rules_md = (DOCS / "rules.md").read_text()
    for figure in make_figures.available_figures():
        assert f"figures/{figure.name}.svg" in rules_md, figure.name
