"""The markdown table helper against tables written out by hand."""

import pytest

from evalkit.markdown import markdown_row, markdown_table


def test_header_separator_and_rows():
    table = markdown_table(["run", "step", "1K"], [["a", 5, "12.50"], ("b", 10, 3.0)])
    assert table == "| run | step | 1K |\n|---|---|---|\n| a | 5 | 12.50 |\n| b | 10 | 3.0 |"


def test_a_table_without_rows_is_its_header_and_separator():
    assert markdown_table(["quantity", "value"], []) == "| quantity | value |\n|---|---|"


def test_cells_go_through_str_and_empty_cells_stay_one_space_wide():
    table = markdown_table(["path", "n", "ok", "note"], [[None, 1.5, True, ""]])
    assert table.splitlines()[2] == "| None | 1.5 | True | |"


def test_a_pipe_inside_a_cell_is_escaped():
    assert markdown_table(["a|b"], [["x | y"]]) == "| a\\|b |\n|---|\n| x \\| y |"
    assert markdown_row(["|", "c"]) == "| \\| | c |"


@pytest.mark.parametrize("row", [["only one"], ["one", "two", "three"]])
def test_a_row_of_the_wrong_width_is_refused(row):
    with pytest.raises(ValueError, match="cells in a table of 2 columns"):
        markdown_table(["a", "b"], [["fine", "row"], row])


def test_a_table_needs_a_column():
    with pytest.raises(ValueError, match="at least one column"):
        markdown_table([], [])
