"""--shard I/N and evalkit merge: the shards of a sweep, merged, are the unsharded run."""

from __future__ import annotations

import json
import shutil

import pytest

from evalkit.errors import UserError
from evalkit.ruler.runner import RulerBenchmark, run_ruler
from evalkit.scale.merge import merge_shards
from evalkit.scale.plan import Shard, assign_shards, parse_shard, plan_work
from tests.scale.helpers import outputs_of, run_cli, tiny_refs, tiny_settings


def test_shards_balance_estimated_tokens_not_counts():
    # One unit as costly as eight others: balanced by tokens it is alone in its shard (8 vs 8);
    # balanced by count it would share one with four others (12 vs 4).
    assert assign_shards([8, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1, 1, 1, 1, 1]
    # Longest-first onto the least-loaded shard, ties to the lowest index (hand-worked: loads 7, 7, 6).
    assert assign_shards([5, 4, 3, 3, 2, 2, 1], 3) == [0, 1, 2, 2, 1, 0, 1]


def test_ruler_shards_weigh_length_times_samples():
    from evalkit.ruler.runner import RulerSettings

    refs = tiny_refs()
    settings = RulerSettings(tasks=["niah_single_1", "vt"], lengths=[1024, 3072], num_samples=2)
    benchmark = RulerBenchmark(settings)
    owned = [
        {
            (ref.step, unit.task, unit.length)
            for ref, work in plan_work(benchmark, refs, Shard(i, 2)).checkpoints
            for unit in work.units
        }
        for i in range(2)
    ]
    assert not owned[0] & owned[1] and len(owned[0] | owned[1]) == 8  # each pair once
    tokens = [sum(length for *_, length in shard) for shard in owned]
    assert tokens == [8192, 8192]  # the four 3K pairs split evenly, and the four 1K ones
    assert (
        plan_work(benchmark, refs, Shard(1, 2)).checkpoints[0][1].units
        == plan_work(benchmark, refs, Shard(1, 2)).checkpoints[0][1].units
    )  # deterministic


@pytest.mark.parametrize("text", ["2/2", "1", "-1/2", "a/b", "0/0"])
def test_bad_shard_is_one_line(text):
    with pytest.raises(UserError, match="--shard must be I/N"):
        parse_shard(text)


def test_two_shards_merged_equal_the_unsharded_run_record_for_record(tmp_path):
    refs, settings = tiny_refs(), tiny_settings()
    whole = run_ruler(refs, settings, tmp_path / "whole")
    assert whole.skipped and whole.rows  # qa_1 is skipped (no --qa-dir): skips are merged too
    for i in range(2):
        run_ruler(refs, settings, tmp_path / f"shard{i}", shard=Shard(i, 2))
    parts = [outputs_of(tmp_path / f"shard{i}")[1] for i in range(2)]
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])  # both worked, on different units
    merge_shards([tmp_path / "shard1", tmp_path / "shard0"], tmp_path / "merged")  # any order
    assert outputs_of(tmp_path / "merged") == outputs_of(tmp_path / "whole")

    # The merged output reads as one run's: a rerun into it computes nothing and changes no record.
    rerun = run_ruler(refs, settings, tmp_path / "merged", avg=True)
    assert rerun.rows == whole.rows
    assert outputs_of(tmp_path / "merged") == outputs_of(tmp_path / "whole")
    assert (tmp_path / "merged" / "ruler-avg.json").is_file()

    # Refused with one line, nothing written: the same shard twice, a missing shard, another sweep.
    shutil.copytree(tmp_path / "shard0", tmp_path / "shard0-again")
    with pytest.raises(UserError, match="overlapping shards: .* both shard 0/2"):
        merge_shards([tmp_path / "shard0", tmp_path / "shard0-again", tmp_path / "shard1"], tmp_path / "m1")
    with pytest.raises(UserError, match="incomplete ruler sweep: 3 of its 6 units"):
        merge_shards([tmp_path / "shard0"], tmp_path / "m2")
    run_ruler(refs, tiny_settings(samples=2), tmp_path / "other1", shard=Shard(1, 2))
    with pytest.raises(UserError, match="conflicting shards: .* different sweeps"):
        merge_shards([tmp_path / "shard0", tmp_path / "other1"], tmp_path / "m3")
    assert not any((tmp_path / name).exists() for name in ("m1", "m2", "m3"))


def test_merge_refuses_an_output_without_shards(tmp_path, capsys):
    run_ruler(tiny_refs(), tiny_settings(samples=1, tasks=["qa_1"]), tmp_path / "plain")
    assert run_cli(["merge", str(tmp_path / "plain"), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a shard's summary (written without --shard)" in err[0]


def test_shard_with_avg_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["ruler", "--ckpts", str(tiny_refs()[0].path), "--lengths", "1k", "--shard", "0/2", "--avg"]
    assert run_cli([*args, "--out", str(out)]) == 2
    assert "after evalkit merge" in capsys.readouterr().err and not out.exists()


def test_shard_summary_records_its_shard(tmp_path):
    run_ruler(tiny_refs(), tiny_settings(samples=1, tasks=["qa_1"]), tmp_path / "s", shard=Shard(0, 3))
    summaries = sorted((tmp_path / "s").rglob("ruler-summary.json"))
    shard = json.loads(summaries[0].read_text())["provenance"]["shard"]
    assert (shard["index"], shard["count"], shard["plan_units"]) == (0, 3, 2)
