"""tools/mutation/: the report's counts, equivalents matching and Markdown, the test map,
the verdict store and the selection of changed functions."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
from tools.mutation import changed
from tools.mutation import report as mutation_report
from tools.mutation import verdicts as mutation_verdicts

_DIFF = """--- src/pkg/mod.py
+++ src/pkg/mod.py
@@ -1,3 +1,3 @@
 def f(x):
-    return x < 1
+    return x <= 1
"""


def _meta(tmp_path: pathlib.Path, codes: dict[str, int | None]) -> pathlib.Path:
    mutants = tmp_path / "mutants"
    meta = mutants / "src" / "pkg" / "mod.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(
        json.dumps(
            {
                "exit_code_by_key": codes,
                "durations_by_key": {k: 1.5 for k, v in codes.items() if v is not None},
            }
        )
    )
    return mutants


def test_counts_and_equivalents(tmp_path: pathlib.Path) -> None:
    codes = {f"pkg.mod.x_f__mutmut_{i}": code for i, code in enumerate([1, 0, 0, 36, None], 1)}
    mutants = mutation_report.load_mutants(_meta(tmp_path, codes))
    assert [m.status for m in mutants] == ["killed", "survived", "survived", "timeout", "not run"]
    assert mutants[0].path == "src/pkg/mod.py"
    assert mutants[0].function == "mod.f"
    for m in mutants:
        m.diff = _DIFF
    assert mutants[1].key == ("f", "return x <= 1")
    assert mutants[1].original_lines == ["return x < 1"]
    equivalents = tmp_path / "eq.toml"
    equivalents.write_text(
        '[[equivalent]]\nfunction = "f"\nmutated = "return x <= 1"\n'
        'reason = "x is never 1"\n'
        '[[equivalent]]\nfunction = "g"\nmutated = "gone"\nreason = "stale"\n'
    )
    table = mutation_report.load_equivalents(equivalents)
    assert table == {("f", "return x <= 1"): "x is never 1", ("g", "gone"): "stale"}
    mutants[1].reason = table[mutants[1].key]
    text = mutation_report.render(mutants, [("g", "gone")])
    assert "| `src/pkg/mod.py` | 5 | 1 | 1 | 1 | 1 | 0 | 1 | 1.5 / 1.5 |" in text
    assert "| **total** | 5 | 1 | 1 | 1 | 1 | 0 | 1 |" in text
    assert "* `mod.f`: `return x < 1` -> `return x <= 1`" in text  # the one without a reason
    assert "x is never 1" not in text
    assert "* `g`: `gone`" in text
    details = mutation_report.render_details(mutants)
    assert "| 2 | `mod.f` | `return x < 1` | `return x <= 1` | x is never 1 |" in details
    assert "| 3 | `mod.f` | `return x < 1` | `return x <= 1` | **not equivalent" in details
    assert "* `mod.f` timeout: `return x <= 1`" in details
    # stale: entries of a function that was run; one of a function not run is kept
    with_g = [
        *mutants,
        mutation_report.Mutant("pkg.mod.x_g__mutmut_1", "src/pkg/mod.py", "killed", 1.0),
    ]
    assert mutation_report.stale_equivalents(with_g, table) == [("g", "gone")]
    assert mutation_report.stale_equivalents(mutants, table) == []


def test_an_equivalent_follows_its_function_to_another_module() -> None:
    moved = mutation_report.Mutant("pkg.rules.reroll.cells.x_f__mutmut_9", "m.py", "survived", 1)
    moved.diff = _DIFF
    assert moved.key == ("f", "return x <= 1")


def test_methods_read_as_class_dot_name(tmp_path: pathlib.Path) -> None:
    mutants = _meta(tmp_path, {"pkg.mod.xǁRuleǁcheck__mutmut_7": 1})
    (mutant,) = mutation_report.load_mutants(mutants)
    assert mutant.function == "mod.Rule.check" and mutant.qualname == "Rule.check"


def test_an_entry_without_a_reason_is_refused(tmp_path: pathlib.Path) -> None:
    equivalents = tmp_path / "eq.toml"
    equivalents.write_text('[[equivalent]]\nfunction = "f"\nmutated = "x"\n')
    with pytest.raises(SystemExit, match="lacks"):
        mutation_report.load_equivalents(equivalents)


def test_no_results_is_a_clear_error(tmp_path: pathlib.Path, capsys) -> None:
    with pytest.raises(SystemExit):
        mutation_report.main(["--mutants", str(tmp_path / "missing")])
    assert "run `tox -e mutation` first" in capsys.readouterr().err


def test_the_checked_in_equivalents_parse() -> None:
    path = mutation_report.HERE / "equivalent.toml"
    table = mutation_report.load_equivalents(path)
    assert table and all(reason for reason in table.values())
    entries = mutation_report.tomllib.loads(path.read_text())["equivalent"]
    assert len(entries) == len(table), "an entry listed twice"


def test_every_equivalent_names_a_function_of_the_package() -> None:
    """An entry keyed by a function that was renamed or removed matches no mutant again:
    it would sit in the file unread (mutmut's names: module-level functions and methods)."""
    root = pathlib.Path(__file__).resolve().parent.parent / "src"
    functions = set()
    for path in root.rglob("*.py"):
        for mangled, _, _ in changed.function_spans(path.read_text()):
            functions.add(".".join(mangled.split("ǁ")[1:]) or mangled.removeprefix("x_"))
    text = (mutation_report.HERE / "equivalent.toml").read_text()
    entries = mutation_report.tomllib.loads(text)["equivalent"]
    assert sorted({e["function"] for e in entries} - functions) == []


def test_rule_methods_run_at_import_are_mapped_to_the_tests_of_their_class() -> None:
    from tools.mutation.order import NAME_TESTS, remap_built_at_import

    m = "rnn_rewrite_rules.rules.layer_output"
    tests = {
        f"{m}.xǁRuleǁpattern": {"first_test"},
        f"{m}.xǁRuleǁ__init__": {"first_test"},
        f"{m}.xǁRuleǁcheck": {"a", "b"},
        f"{m}.xǁRuleǁrewrite": {"b", "c"},
        f"{m}.xǁOtherǁcheck": {"d"},
        f"{m}.x_helper": {"e"},
        f"{m}.x_state_rules": {"first_test"},
    }
    remap_built_at_import(tests)
    assert tests[f"{m}.xǁRuleǁpattern"] == {"first_test", "a", "b", "c"}
    assert tests[f"{m}.xǁRuleǁ__init__"] == {"first_test", "a", "b", "c", *NAME_TESTS}
    assert tests[f"{m}.xǁOtherǁcheck"] == {"d"} and tests[f"{m}.x_helper"] == {"e"}
    # a module-level rule builder: the tests of every method of the module's classes
    assert tests[f"{m}.x_state_rules"] == {"first_test", "a", "b", "c", "d"}


def test_the_rule_name_tests_exist() -> None:
    """``NAME_TESTS`` names tests by node id: a renamed test would leave every rule's
    ``__init__`` without the test that reads its name."""
    import ast

    from tools.mutation.order import NAME_TESTS

    root = pathlib.Path(__file__).resolve().parent.parent
    assert NAME_TESTS
    for node_id in NAME_TESTS:
        path, _, name = node_id.partition("::")
        tree = ast.parse((root / path).read_text())
        assert name in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}, node_id


def test_command_tests_are_mapped_to_every_function_of_the_commands_modules() -> None:
    """Also functions no in-process test reached (absent from the map)."""
    from tools.mutation.order import map_command_tests

    verify, rule = "rnn_rewrite_rules._verify.x_plan", "rnn_rewrite_rules.rules.x_select_rules"
    tests = {verify: {"unit"}, rule: {"unit"}}
    functions = [verify, rule, "rnn_rewrite_rules.runtime.x_run"]
    map_command_tests(tests, functions, {"cli_a", "cli_b"})
    assert tests == {
        verify: {"unit", "cli_a", "cli_b"},
        rule: {"unit"},
        "rnn_rewrite_rules.runtime.x_run": {"cli_a", "cli_b"},
    }


def test_a_mutant_that_only_deletes_is_keyed_by_what_it_deletes() -> None:
    mutant = mutation_report.Mutant("m.x_f__mutmut_3", "m.py", "survived", None)
    mutant.diff = "--- a\n+++ b\n     y = f(\n-        x,\n     )\n"
    assert mutant.key == ("f", "deleted: x,")


def test_verdicts_survive_a_new_machine(tmp_path: pathlib.Path) -> None:
    """save -> a fresh mutants/ -> restore: mutmut finds the verdicts and hashes it wrote."""
    codes = {
        "pkg.mod.x_f__mutmut_1": 1,
        "pkg.mod.x_f__mutmut_2": None,
        "pkg.mod.x_f__mutmut_3": 0,
        "pkg.mod.xǁRuleǁcheck__mutmut_1": 36,
    }
    mutants = _meta(tmp_path, codes)
    meta = mutants / "src" / "pkg" / "mod.py.meta"
    data = json.loads(meta.read_text())
    data["hash_by_function_name"] = {"x_f": "aa", "xǁRuleǁcheck": "bb", "x_unmutated": "cc"}
    meta.write_text(json.dumps(data))
    store = tmp_path / "mutation.json"
    assert mutation_verdicts.save(mutants, store) == 3
    fresh = tmp_path / "fresh"
    assert mutation_verdicts.restore(store, fresh) == ["src/pkg/mod.py"]
    restored = json.loads((fresh / "src" / "pkg" / "mod.py.meta").read_text())
    assert restored["exit_code_by_key"] == codes
    assert restored["hash_by_function_name"] == data["hash_by_function_name"]
    assert restored["durations_by_key"] == {k: 1.5 for k, v in codes.items() if v is not None}
    # a meta mutmut already has is its own: restore leaves it
    assert mutation_verdicts.restore(store, mutants) == []
    assert json.loads(meta.read_text()) == data


def test_the_store_lives_outside_git_unless_named(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(mutation_verdicts.STORE_VARIABLE, raising=False)
    assert mutation_verdicts.store_path() == mutation_verdicts.ROOT / "build/mutation/verdicts.json"
    monkeypatch.setenv(mutation_verdicts.STORE_VARIABLE, str(tmp_path / "v.json"))
    assert mutation_verdicts.store_path() == tmp_path / "v.json"


_SOURCE = """\
def f(x):
    return x


class Rule:
    @staticmethod
    def check(x):
        return x

    def rewrite(self, x):
        return x
"""


def test_function_spans_name_functions_as_mutmut_does() -> None:
    assert changed.function_spans(_SOURCE) == [
        ("x_f", 1, 2),
        ("xǁRuleǁcheck", 6, 8),
        ("xǁRuleǁrewrite", 10, 11),
    ]


def test_changed_lines_of_a_diff() -> None:
    diff = (
        "diff --git a/src/p/m.py b/src/p/m.py\n--- a/src/p/m.py\n+++ b/src/p/m.py\n"
        "@@ -2 +2 @@ def f(x):\n-    return x\n+    return -x\n"
        "@@ -9,2 +8,0 @@\n-        a\n-        b\n"
        "diff --git a/src/p/gone.py b/src/p/gone.py\n--- a/src/p/gone.py\n+++ /dev/null\n"
        "@@ -1 +0,0 @@\n-x = 1\n"
    )
    assert changed.changed_lines(diff) == {"src/p/m.py": {2, 8}}


def test_changed_mutants_since_a_revision(tmp_path: pathlib.Path) -> None:
    """Only the changed functions of the files [tool.mutmut] mutates."""

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["src"]\nonly_mutate = ["src/p/*.py"]\n'
        'do_not_mutate = ["*/__init__.py"]\n'
    )
    package = tmp_path / "src" / "p"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("def init():\n    return 1\n")
    (package / "m.py").write_text(_SOURCE)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (package / "m.py").write_text(_SOURCE.replace("return x\n\n\nclass", "return -x\n\n\nclass"))
    (package / "__init__.py").write_text("def init():\n    return 2\n")
    assert changed.changed_mutants("HEAD", tmp_path) == ["p.m.x_f__mutmut_*"]
    with pytest.raises(RuntimeError, match="git diff no-such-rev failed"):
        changed.changed_mutants("no-such-rev", tmp_path)
