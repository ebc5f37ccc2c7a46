"""docs/exporters.md's generated table (``tools/exporters/table.py``, written by ``python -m
tools.exporters.survey --markdown docs/exporters.md``) says what the rules do today: per
committed exporter file, the node counts before and after and the recurrent ops left are
what ``rewrite_file`` gives now (``exporter_support.rewrite_file_once``, shared with
tests/test_exporter_files.py), and the table lists every file once. The time column is a
measurement and is not checked; the reasons are the report's words, checked elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tools.exporters import table
from tools.exporters.survey import Row, error_row, report_row

from tests.exporter_files import ExporterFile, exporter_files
from tests.exporter_support import rewrite_file_once

DOC = Path(__file__).resolve().parent.parent / "docs" / "exporters.md"
FILES = exporter_files()
COMMITTED = table.parse_node_columns(DOC.read_text())


def test_the_table_lists_every_committed_file_once() -> None:
    text = DOC.read_text()
    assert text.count(table.BEGIN) == 1 and text.count(table.END) == 1
    assert set(COMMITTED) == {(f.exporter, f.path.name) for f in FILES}
    assert len(COMMITTED) == len(FILES)


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.id)
def test_the_node_and_op_columns_are_todays(file: ExporterFile) -> None:
    """The row ``survey_file(file, hazards=False)`` gives, from the rewrite
    tests/test_exporter_files.py checks (one per file and worker)."""
    done = rewrite_file_once(file.path)
    row = error_row(file, done.error) if done.report is None else report_row(file, done.report)
    committed = COMMITTED.get((file.exporter, file.path.name))
    assert committed == table.node_columns(row), (
        f"{file.id}: docs/exporters.md is stale; run `{table.COMMAND}`"
    )


def test_the_parser_reads_what_the_generator_writes() -> None:
    """A round trip through :func:`table.format_section` and :func:`table.parse_node_columns`
    (so a change to one without the other fails here, not as a stale table)."""
    file = next(f for f in FILES if f.expect != "invalid")
    row = Row(file.path.name, file.expect, (30, 4), ({"Loop": 1}, {"LSTM": 1}))
    broken = Row(file.path.name.replace(".onnx", "_x.onnx"), "invalid", error="Bad: a | b")
    files = {file.exporter: {file.path.name: file, broken.file: file}}
    timings = {file.exporter: {row.file: table.Timing(0.26, 0.01)}}
    section = table.format_section(
        {file.exporter: [row, broken]}, {file.exporter: {}}, files, timings, "provenance"
    )
    text = table.replace_section(f"# doc\n\n{table.BEGIN}\nold\n{table.END}\n", section)
    assert "old" not in text and "0.26x |" in text and "a \\| b" in text
    assert table.parse_node_columns(text) == {
        (file.exporter, row.file): (30, 4, "LSTM 1"),
        (file.exporter, broken.file): (None, None, "-"),
    }
    assert table.Timing(1.02, 0.01).cell() == "1.02x (noise)"
    assert table.Timing(0.9, 0.15).cell() == "0.90x (noise)"
