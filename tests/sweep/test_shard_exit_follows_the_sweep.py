"""A shard's exit status follows the whole sweep's rules: a shard whose units were all skipped
exits 0 with summaries merge reads; "no task produced a score" is the merge's (or the unsharded
run's) to say, when the whole sweep scored nothing."""

from __future__ import annotations

from tests.sweep.helpers import outputs_of, run_cli, tiny_refs


def _ruler(tasks: str, out, *more: str) -> int:
    ckpt = str(tiny_refs()[0].path)  # qa_1 without --qa-dir is skipped (a user error, said per unit)
    return run_cli(
        ["ruler", "--ckpts", ckpt, "--lengths", "1k", "--samples", "1", "--tasks", tasks, *more, "--out", str(out)]
    )


def test_a_shard_of_skips_exits_0_and_merges_to_the_unsharded_run(tmp_path, capsys):
    # Two units of equal cost over two shards: niah_single_1 (scored) to shard 0, qa_1 (skipped) to 1.
    tasks = "niah_single_1,qa_1"
    assert _ruler(tasks, tmp_path / "whole") == 0  # the unsharded run: one score, one skip
    for i in (0, 1):
        assert _ruler(tasks, tmp_path / f"s{i}", "--shard", f"{i}/2") == 0
    assert "shard 1/2: every unit skipped" in capsys.readouterr().err
    assert run_cli(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")]) == 0
    merged, whole = outputs_of(tmp_path / "m"), outputs_of(tmp_path / "whole")
    assert merged == whole and [len(s["skipped"]) for s in whole[0].values()] == [1]


def test_a_sweep_of_skips_fails_at_the_merge_as_unsharded(tmp_path, capsys):
    assert _ruler("qa_1", tmp_path / "whole") == 2  # the unsharded run: nothing scored
    assert "no task produced a score" in capsys.readouterr().err
    for i in (0, 1):  # shard 0: qa_1, skipped; shard 1: no unit
        assert _ruler("qa_1", tmp_path / f"s{i}", "--shard", f"{i}/2") == 0
    capsys.readouterr()
    assert run_cli(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no task of the ruler sweep produced a score (all skipped)")
    assert outputs_of(tmp_path / "m") == outputs_of(tmp_path / "whole")  # the skips are kept, as unsharded
