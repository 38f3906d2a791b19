"""--shard I/N and evalkit merge: the shards of a sweep, merged, are the unsharded run."""

from __future__ import annotations

import json
import shutil

import pytest

from evalkit.errors import UserError
from evalkit.ruler.runner import RulerBenchmark
from evalkit.sweep.merge import merge_shards
from evalkit.sweep.pipeline import run_benchmark
from evalkit.sweep.plan import Shard, assign_shards, parse_shard, plan_work
from tests.sweep.helpers import outputs_of, run_cli, tiny_refs, tiny_settings


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
    whole = run_benchmark(RulerBenchmark(settings), refs, tmp_path / "whole")
    assert whole.skipped and whole.rows  # qa_1 is skipped (no --qa-dir): skips are merged too
    for i in range(2):
        run_benchmark(RulerBenchmark(settings), refs, tmp_path / f"shard{i}", shard=Shard(i, 2))
    parts = [outputs_of(tmp_path / f"shard{i}")[1] for i in range(2)]
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])  # both worked, on different units
    merge_shards([tmp_path / "shard1", tmp_path / "shard0"], tmp_path / "merged")  # any order
    assert outputs_of(tmp_path / "merged") == outputs_of(tmp_path / "whole")

    # The merged output reads as one run's: a rerun into it computes nothing and changes no record.
    rerun = run_benchmark(RulerBenchmark(settings), refs, tmp_path / "merged", avg=True)
    assert rerun.rows == whole.rows
    assert outputs_of(tmp_path / "merged") == outputs_of(tmp_path / "whole")
    assert (tmp_path / "merged" / "ruler-avg.json").is_file()

    # Refused with one line, nothing written: the same shard twice, a missing shard, another sweep.
    shutil.copytree(tmp_path / "shard0", tmp_path / "shard0-again")
    with pytest.raises(UserError, match="overlapping shards: .* both shard 0/2"):
        merge_shards([tmp_path / "shard0", tmp_path / "shard0-again", tmp_path / "shard1"], tmp_path / "m1")
    with pytest.raises(UserError, match="incomplete ruler sweep: 3 of its 6 units"):
        merge_shards([tmp_path / "shard0"], tmp_path / "m2")
    run_benchmark(RulerBenchmark(tiny_settings(samples=2)), refs, tmp_path / "other1", shard=Shard(1, 2))
    with pytest.raises(UserError, match="conflicting shards: .* different sweeps"):
        merge_shards([tmp_path / "shard0", tmp_path / "other1"], tmp_path / "m3")
    assert not any((tmp_path / name).exists() for name in ("m1", "m2", "m3"))


def test_merge_refuses_an_output_without_shards(tmp_path, capsys):
    run_benchmark(RulerBenchmark(tiny_settings(samples=1, tasks=["qa_1"])), tiny_refs(), tmp_path / "plain")
    assert run_cli(["merge", str(tmp_path / "plain"), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a shard's summary (written without --shard)" in err[0]


def test_shard_with_avg_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["ruler", "--ckpts", str(tiny_refs()[0].path), "--lengths", "1k", "--shard", "0/2", "--avg"]
    assert run_cli([*args, "--out", str(out)]) == 2
    assert "after evalkit merge" in capsys.readouterr().err and not out.exists()


def test_shard_summary_records_its_shard(tmp_path):
    run_benchmark(
        RulerBenchmark(tiny_settings(samples=1, tasks=["qa_1"])), tiny_refs(), tmp_path / "s", shard=Shard(0, 3)
    )
    summaries = sorted((tmp_path / "s").rglob("ruler-summary.json"))
    shard = json.loads(summaries[0].read_text())["provenance"]["shard"]
    assert (shard["index"], shard["count"], shard["plan_units"]) == (0, 3, 2)


# --- job arrays as schedulers run them (issue #36) ---


def test_a_three_task_array_with_an_empty_shard_and_a_rerun_merges_to_the_unsharded_run(tmp_path, capsys):
    """Two units over three array tasks: tasks 0 and 1 get one each (equal costs, ties to the lowest
    index), task 2 none. Task 2 succeeds with a record; task 1 is rerun at --batch-size 1 (after an
    OOM, say) with the essays copied elsewhere; merge takes all three and equals the unsharded run."""
    from evalkit.corpus import prose_text

    for place in ("here", "moved"):
        (tmp_path / place).mkdir()
        (tmp_path / place / "essays.txt").write_text(prose_text())
    ckpt = str(tiny_refs()[0].path)
    common = ["ruler", "--ckpts", ckpt, "--lengths", "1k", "--samples", "2", "--tasks", "niah_single_1,niah_single_2"]
    here = ["--essays", str(tmp_path / "here" / "essays.txt")]
    assert run_cli([*common, *here, "--out", str(tmp_path / "whole")]) == 0
    environ = {"SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "3"}
    moved = ["--batch-size", "1", "--essays", str(tmp_path / "moved" / "essays.txt")]
    for task_id, extra in (("1", here), ("3", moved), ("5", here)):
        # --array=1-5:2: ids 1, 3, 5 are shards 0, 1, 2
        with pytest.MonkeyPatch.context() as patch:
            for name, value in {**environ, "SLURM_ARRAY_TASK_ID": task_id}.items():
                patch.setenv(name, value)
            assert run_cli([*common, *extra, "--shard", "slurm", "--out", str(tmp_path / f"s{task_id}")]) == 0
    err = capsys.readouterr().err
    assert "shard 2/3 has no units (the sweep has 2 for 3 shards)" in " ".join(err.split())
    assert not list((tmp_path / "s5").rglob("*-summary.json"))
    assert run_cli(["merge", *(str(tmp_path / f"s{i}") for i in (1, 3, 5)), "--out", str(tmp_path / "m")]) == 0
    assert "merged 3 shards (1 of them empty: no units)" in capsys.readouterr().out
    merged, whole = outputs_of(tmp_path / "m"), outputs_of(tmp_path / "whole")
    assert merged[1] == whole[1] and merged[1]  # the per-sample logs, byte for byte
    assert merged[0] == whole[0]  # rows, skips and the recorded settings (shard 0's: the default batch size)
    assert not (tmp_path / "m" / "ruler-empty-shard.json").exists()


def test_the_plan_ignores_batch_size_and_data_locations_but_not_results():
    from evalkit.ruler.runner import RulerSettings

    def plan(**given):
        settings = RulerSettings(tasks=["niah_single_1"], lengths=[1024], num_samples=2, **given)
        return plan_work(RulerBenchmark(settings), tiny_refs(), Shard(0, 2)).shard["plan"]

    assert plan() == plan(batch_size=1) == plan(qa_dir="/elsewhere", essays="/else/essays.json")
    assert len({plan(), plan(seed=7), plan(encoding="anchor"), plan(sizing="nvidia")}) == 4


def test_a_shard_without_units_is_merged_and_counted(tmp_path):
    refs, settings = tiny_refs()[:1], tiny_settings(samples=1, tasks=["niah_single_1"])  # one unit
    for i in range(2):
        run = run_benchmark(RulerBenchmark(settings), refs, tmp_path / f"s{i}", shard=Shard(i, 2))
    assert run.empty_shard is not None and (tmp_path / "s1" / "ruler-empty-shard.json").is_file()
    counts = merge_shards([tmp_path / "s0", tmp_path / "s1"], tmp_path / "m")
    assert (counts["shards"], counts["empty"], counts["summaries"]) == (2, 1, 1)
    with pytest.raises(UserError, match=r"incomplete ruler sweep: 0 of its 1 units are here \(shards 1 of 2\)"):
        merge_shards([tmp_path / "s1"], tmp_path / "m2")
    run_benchmark(
        RulerBenchmark(tiny_settings(samples=2, tasks=["niah_single_1"])), refs, tmp_path / "other", shard=Shard(0, 2)
    )
    with pytest.raises(UserError, match="conflicting shards"):
        merge_shards([tmp_path / "other", tmp_path / "s1"], tmp_path / "m3")


@pytest.mark.parametrize(
    "environ, expected",
    [
        # --array=1-16: ids 1..16, count 16
        ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_STEP": "1",
          "SLURM_ARRAY_TASK_COUNT": "16"}, Shard(0, 16)),
        ({"SLURM_ARRAY_TASK_ID": "16", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_STEP": "1",
          "SLURM_ARRAY_TASK_COUNT": "16"}, Shard(15, 16)),
        # --array=0-15:2: ids 0, 2, ..., 14, count 8; id 14 is the 8th
        ({"SLURM_ARRAY_TASK_ID": "14", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_STEP": "2",
          "SLURM_ARRAY_TASK_COUNT": "8"}, Shard(7, 8)),
    ],
)  # fmt: skip
def test_shard_slurm_reads_the_array_variables(environ, expected):
    assert parse_shard("slurm", environ) == expected


def test_shard_sge_reads_first_last_and_step():
    # qsub -t 3-11:4: ids 3, 7, 11 -> (11 - 3) / 4 + 1 = 3 tasks; id 7 is the 2nd
    environ = {"SGE_TASK_ID": "7", "SGE_TASK_FIRST": "3", "SGE_TASK_LAST": "11", "SGE_TASK_STEPSIZE": "4"}
    assert parse_shard("sge", environ) == Shard(1, 3)


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_STEP": "1", "SLURM_ARRAY_TASK_COUNT": "2"},
         r"--shard slurm: \$SLURM_ARRAY_TASK_ID is not set"),
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_STEP": "2",
          "SLURM_ARRAY_TASK_COUNT": "4"}, "task 3 is not in an array of 4 tasks from 0 in steps of 2"),
    ],
)  # fmt: skip
def test_shard_slurm_outside_an_array_is_one_line(environ, message):
    with pytest.raises(UserError, match=message) as caught:
        parse_shard("slurm", environ)
    assert "\n" not in str(caught.value)


def test_general_units_cost_their_tasks():
    """Fixture groups of 5 and 3 tasks and a single task: over two shards the 5-task group is alone
    (5 against 3 + 1), not one unit each as a count would split them."""
    from evalkit.general.runner import GeneralBenchmark, GeneralSettings
    from evalkit.package_data import TASKS_DIR

    tasks = ["evalkit_fixture_mmlu_style", "evalkit_fixture_longbench", "evalkit_fixture_hellaswag_style"]
    benchmark = GeneralBenchmark(GeneralSettings(tasks=tasks, include_paths=[str(TASKS_DIR)]))
    assert [benchmark.unit_cost(unit) for unit in benchmark.units()] == [3.0, 5.0, 1.0]
    owned = [
        [unit.task for _, work in plan_work(benchmark, tiny_refs()[:1], Shard(i, 2)).checkpoints for unit in work.units]
        for i in range(2)
    ]
    assert owned == [["evalkit_fixture_longbench"], ["evalkit_fixture_mmlu_style", "evalkit_fixture_hellaswag_style"]]


def test_shard_slurm_outside_slurm_is_one_line_from_the_command(tmp_path, capsys, monkeypatch):
    for name in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP", "SLURM_ARRAY_TASK_COUNT"):
        monkeypatch.delenv(name, raising=False)
    args = ["ruler", "--ckpts", str(tiny_refs()[0].path), "--lengths", "1k", "--shard", "slurm"]
    assert run_cli([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --shard slurm: $SLURM_ARRAY_TASK_ID is not set; run inside a slurm job array, or give "
                   "--shard I/N"]  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_an_empty_general_shard_exits_0_with_its_record(tmp_path, capsys):
    """One lm-eval task of one checkpoint over two shards: shard 1 has nothing, and says so."""
    args = ["general", "--ckpts", str(tiny_refs()[0].path), "--tasks", "evalkit_fixture_hellaswag_style"]
    assert run_cli([*args, "--shard", "1/2", "--out", str(tmp_path / "s1")]) == 0
    assert "shard 1/2 has no units" in " ".join(capsys.readouterr().err.split())
    record = json.loads((tmp_path / "s1" / "general-empty-shard.json").read_text())
    assert (record["benchmark"], record["shard"]["index"], record["shard"]["plan_units"]) == ("general", 1, 1)
