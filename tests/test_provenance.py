"""What a result records of the code and the command behind it: the commit, the changed files, the command."""

import subprocess
import sys

from evalkit.store import provenance


def git(repo, *args):
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    subprocess.run(command, cwd=repo, check=True, capture_output=True)


def test_a_dirty_checkout_names_its_changed_tracked_files(tmp_path):
    git(tmp_path, "init", "-q")
    for name in ("a.py", "b c.py", "old.py"):
        (tmp_path / name).write_text("x = 1\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "one")
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=tmp_path, capture_output=True, text=True)
    assert provenance.checkout_state(tmp_path) == (commit.stdout.strip(), ())  # clean: no +dirty, no files

    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "b c.py").write_text("x = 3\n")
    git(tmp_path, "mv", "old.py", "new.py")
    (tmp_path / "untracked.py").write_text("y = 1\n")  # not part of the code that ran: not listed
    state, files = provenance.checkout_state(tmp_path)
    assert state == commit.stdout.strip() + "+dirty"
    assert files == ("a.py", "b c.py", "new.py", "old.py")


def test_outside_a_checkout_the_state_is_unknown(tmp_path):
    assert provenance.checkout_state(tmp_path) == ("unknown", ())


def test_the_stamp_carries_the_command_and_the_changed_files_only_when_there_are_some(monkeypatch):
    monkeypatch.setattr(provenance, "git_state", lambda: ("abc+dirty", ("evalkit/x.py",)))
    monkeypatch.setattr(sys, "argv", ["/venv/bin/evalkit", "ruler", "--lengths", "1k,2k", "--out", "my results"])
    stamp = provenance.stamp()
    assert stamp["command"] == "evalkit ruler --lengths 1k,2k --out 'my results'"
    assert (stamp["git_hash"], stamp["dirty_files"]) == ("abc+dirty", ["evalkit/x.py"])
    monkeypatch.setattr(provenance, "git_state", lambda: ("abc", ()))
    assert "dirty_files" not in provenance.stamp()


def test_a_script_records_itself_as_the_command(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["scripts/gpu_study.py", "--minutes", "7"])
    assert provenance.command_line() == "python scripts/gpu_study.py --minutes 7"
    monkeypatch.setattr(sys, "argv", ["/repo/evalkit/cli/__main__.py", "general", "--tasks", "mmlu"])
    assert provenance.command_line() == "evalkit general --tasks mmlu"  # python -m evalkit.cli


def test_an_earlier_stamp_is_kept_whole_and_older_stamps_without_a_command_still_count():
    old = {"evalkit_version": "0.1", "git_hash": "h", "created": "t", "machine": {}, "settings": {}, "engine": {}}
    assert provenance.stamp_of(old) == {"evalkit_version": "0.1", "git_hash": "h", "created": "t", "machine": {}}
    new = {**old, "command": "evalkit ruler", "dirty_files": ["a.py"]}
    assert provenance.stamp_of(new)["command"] == "evalkit ruler" and provenance.stamp_of(new)["dirty_files"] == [
        "a.py"
    ]
    assert provenance.stamp_of({"git_hash": "h"}) is None and provenance.stamp_of(None) is None
