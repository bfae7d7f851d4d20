"""``apps.core.csvfiles``: the one CSV writer, and the rule that keeps a report's text cells from
running as spreadsheet formulas (OWASP CSV Injection) without changing machine formats."""

import csv
import io

import pytest

from apps.core.csvfiles import spreadsheet_cell, write_csv


@pytest.mark.parametrize("value", ["=1+1", "+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1", "\0=1"])
def test_text_starting_like_a_formula_gets_a_leading_quote(value):
    assert spreadsheet_cell(value) == "'" + value


@pytest.mark.parametrize("value", ["alice", "a=b", "", " =1", -1.5, 0, None])
def test_other_cells_are_left_as_they_are(value):
    assert spreadsheet_cell(value) == value


def test_a_machine_format_is_written_as_is_and_quoting_keeps_rows_whole():
    rows = [["-1", 'a,"b"\nc'], ["=x", 2]]
    text = write_csv(["k", "v"], rows, for_spreadsheets=False)
    assert list(csv.reader(io.StringIO(text))) == [["k", "v"], ["-1", 'a,"b"\nc'], ["=x", "2"]]
    quoted = write_csv(["k", "v"], rows, for_spreadsheets=True)
    assert list(csv.reader(io.StringIO(quoted)))[1:] == [["'-1", 'a,"b"\nc'], ["'=x", "2"]]
