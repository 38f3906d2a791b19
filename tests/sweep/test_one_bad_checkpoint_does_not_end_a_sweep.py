"""One bad checkpoint does not end a sweep: it is recorded (<run>/step-<N>/<benchmark>-failed.json,
listed by the leaderboard), the others are evaluated, the command exits 2 at the end, and a mended
rerun removes the record; a leaderboard of failure records only says so."""

import json
import shutil

from tests.helpers import copy_tiny_base, error_line, evalkit_here, truncate_weights
from tests.sweep.helpers import SHIPPED_FULL
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


def test_a_sweep_records_a_broken_checkpoint_and_goes_on(tmp_path, capsys):
    good1, bad, good2 = (copy_tiny_base(tmp_path / "sweep" / f"step-{n}") for n in (1, 2, 3))
    truncate_weights(bad)
    out = tmp_path / "out"
    args = ["ruler", "--ckpts", good1, bad, good2, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1"]
    line = error_line(evalkit_here(capsys, *args, "--out", out))
    assert "1 of 3 checkpoints failed" in line and "model.safetensors is truncated or corrupt" in line, line
    stored = sorted(p.parent.name for p in out.rglob("ruler-summary.json"))
    assert stored == ["step-1", "step-3"]  # the one after the bad one was evaluated too
    record = json.loads((out / "sweep" / "step-2" / "ruler-failed.json").read_text())
    assert record["step"] == 2 and "truncated or corrupt" in record["reason"]

    board = tmp_path / "board.md"
    assert evalkit_here(capsys, "leaderboard", out, "--out", board).returncode == 0
    failed = board.read_text().split("## Failed checkpoints")[1].split("##")[0]
    assert "sweep step 2 (ruler)" in failed and "truncated or corrupt" in failed

    shutil.copy(good1 / "model.safetensors", bad / "model.safetensors")  # mended: the rerun scores it
    assert evalkit_here(capsys, *args, "--out", out).returncode == 0
    assert not (out / "sweep" / "step-2" / "ruler-failed.json").exists()
    assert (out / "sweep" / "step-2" / "ruler-summary.json").is_file()


def test_a_leaderboard_of_failed_checkpoints_only_names_the_failure_records(tmp_path, capsys):
    run = shutil.copytree(SHIPPED_FULL, tmp_path / "runs" / "broken")
    for step in ("step-550", "step-600"):
        truncate_weights(run / step)
    out = tmp_path / "results"
    args = ["ruler", "--ckpts", run, "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out]
    assert "2 of 2 checkpoints failed" in error_line(evalkit_here(capsys, *args))
    records = [out / "broken" / step / "ruler-failed.json" for step in ("step-550", "step-600")]
    assert all(record.is_file() for record in records)
    for form in ("csv", "json", "md"):
        board = tmp_path / f"board.{form}"
        line = error_line(evalkit_here(capsys, "leaderboard", out, "--format", form, "--out", board))
        assert "but 2 failure records" in line and all(str(record) in line for record in records), line
        assert "run evalkit ruler/general first" not in line
        assert not board.exists()
