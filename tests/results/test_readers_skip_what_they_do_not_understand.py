"""Readers skip what they do not understand: a summary of another schema_version (an older one
included: no reader keeps a compatibility path), or whose benchmark is not its file name's, is
left out of the leaderboard with a note (an error when it is all there is), never replaced by a
run and never reused by a rerun. (compare's note: tests/results/test_compare.py.)"""

import json

from tests.helpers import copy_tiny_base, error_line, evalkit_here, ruler_summary, write_summary
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


def test_the_leaderboard_leaves_out_summaries_of_another_format_with_a_note(tmp_path, capsys):
    out = tmp_path / "results"
    write_summary(out, ruler_summary("current", 61.0))
    older = ruler_summary("older", 62.0, schema_version=2)  # version 2: RULER rows stored their number as `score`
    older["rows"] = [{("score" if key == "value" else key): value for key, value in older["rows"][0].items()}]
    older = write_summary(out, older)
    future = write_summary(out, ruler_summary("future", 99.0, schema_version=999))
    other = write_summary(out, ruler_summary("other", 98.0, benchmark="xyz"))
    board = tmp_path / "board.md"
    result = evalkit_here(capsys, "leaderboard", out, "--out", board)
    assert result.returncode == 0, result.stderr
    tables, unread = board.read_text().split("## Not read")
    assert "| current |" in tables and "61.00" in tables
    assert "older" not in tables and "62.00" not in tables
    assert f"{older}: not read: its schema_version is 2 and this evalkit reads version 3 only" in unread
    assert "future" not in tables and "99.00" not in tables and "other" not in tables and "98.00" not in tables
    assert f"{future}: not read: its schema_version is 999" in unread
    assert f"{other}: not read: its benchmark is 'xyz', but its file name says 'ruler'" in unread

    alone = tmp_path / "alone"
    write_summary(alone, ruler_summary("future", 99.0, schema_version="2.0"))
    line = error_line(evalkit_here(capsys, "leaderboard", alone, "--out", tmp_path / "alone.md"))
    assert "1 left out" in line and "schema_version is '2.0'" in line, line


def test_a_run_does_not_replace_a_summary_of_another_format(tmp_path, capsys):
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    out = tmp_path / "out"
    future = write_summary(out, ruler_summary("run", 99.0, schema_version=999))
    before = future.read_text()
    args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args))
    assert str(future) in line and "schema_version is 999" in line and "not replaced" in line, line
    assert future.read_text() == before


def test_a_rerun_does_not_reuse_a_summary_of_another_format(tmp_path):
    from evalkit.store.result_format import SCHEMA_VERSION, read_summary

    path = write_summary(tmp_path, ruler_summary("r", 1.0, schema_version=SCHEMA_VERSION + 1))
    assert read_summary(path) is None
    path.write_text(json.dumps(ruler_summary("r", 1.0, schema_version=SCHEMA_VERSION)))
    assert read_summary(path) is not None
