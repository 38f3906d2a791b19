"""`evalkit general` as a user types it: the table, the stored summary, the leaderboard reading it."""

import json
import subprocess
import sys


def evalkit(*args):
    return subprocess.run([sys.executable, "-m", "evalkit.cli", *args], capture_output=True, text=True, timeout=300)


def test_general_command_end_to_end(tiny_run, tmp_path):
    out = tmp_path / "general"
    result = evalkit("general", "--ckpts", str(tiny_run), "--tasks", "evalkit_fixture_hellaswag_style", "--limit", "4",
                     "--avg", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| tiny-run | 1 | evalkit_fixture_hellaswag_style | acc_norm |" in result.stdout
    summary = json.loads((out / "tiny-run" / "step-2" / "general-summary.json").read_text())
    assert {row["metric"] for row in summary["rows"]} == {"acc", "acc_norm"}
    assert all(row["n"] == 4 and row["num_fewshot"] == 0 for row in summary["rows"])
    board = evalkit("leaderboard", str(out), "--out", str(tmp_path / "lb.md"))
    assert board.returncode == 0, board.stderr
    assert "evalkit_fixture_hellaswag_style acc_norm" in (tmp_path / "lb.md").read_text()


def test_unknown_task_is_one_line_error(tiny_run, tmp_path):
    result = evalkit("general", "--ckpts", str(tiny_run), "--tasks", "hellaswagg", "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "hellaswagg" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
