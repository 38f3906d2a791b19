"""`--tasks helmet_recall` runs HELMET's Recall (niah_multikey_2, niah_multikey_3, niah_multivalue,
json_kv) and its category average per length is the plain mean of the four (only where all four
are scored), per checkpoint then over checkpoints; RULER's average never counts json_kv."""

import json
import statistics

import pytest

from evalkit.errors import UserError
from evalkit.results.compare import Bootstrap, series_length_averages
from evalkit.results.leaderboard import build_markdown
from evalkit.results.samples import read_directory
from evalkit.ruler.runner import RulerBenchmark, RulerSettings, parse_ruler_tasks
from evalkit.store.averages import HELMET_RECALL, RULER, average_table, checkpoint_table, length_averages
from evalkit.store.result_format import ResultRow
from evalkit.sweep.pipeline import run_benchmark
from tests.results.test_leaderboard import ruler_summary, write
from tests.ruler.test_json_kv_matches_helmet import helmet_subem
from tests.sweep.helpers import tiny_refs

RECALL = ["niah_multikey_2", "niah_multikey_3", "niah_multivalue", "json_kv"]


def test_the_group_expands_and_all_stays_rulers_thirteen():
    assert parse_ruler_tasks("helmet_recall") == RECALL
    assert parse_ruler_tasks("niah_multivalue, helmet_recall,vt") == [
        "niah_multivalue", "niah_multikey_2", "niah_multikey_3", "json_kv", "vt"
    ]  # fmt: skip
    everything = parse_ruler_tasks("all")
    assert len(everything) == 13 and "json_kv" not in everything
    with pytest.raises(UserError, match="helmet_recall"):
        parse_ruler_tasks("helmet_recal")


def rows(scores: dict[tuple[int, int, str], float]) -> list[ResultRow]:
    """{(step, length, task): value} as one run's rows."""
    metric = {"json_kv": "substring_exact_match"}
    return [
        ResultRow("ruler", "r", step, task, metric.get(task, "string_match_all"), value, 1.0, n=4, length=length)
        for (step, length, task), value in scores.items()
    ]


# Step 1 scores all four and niah_single_1 at 1K and 2K; step 2 misses json_kv at 2K.
SCORES = {
    **{(1, 1024, t): v for t, v in zip([*RECALL, "niah_single_1"], [80, 60, 40, 10, 90])},
    **{(2, 1024, t): v for t, v in zip([*RECALL, "niah_single_1"], [70, 50, 30, 30, 100])},
    **{(1, 2048, t): v for t, v in zip([*RECALL, "niah_single_1"], [20, 30, 40, 50, 60])},
    **{(2, 2048, t): v for t, v in zip(RECALL[:3], [0, 10, 20])},
}


def test_category_averages_equal_hand_arithmetic():
    recall = {
        (a.length, a.mean, a.std, tuple(a.checkpoints)) for a in length_averages(rows(SCORES), category=HELMET_RECALL)
    }
    # 1K: step 1 (80+60+40+10)/4 = 47.5, step 2 (70+50+30+30)/4 = 45 -> 46.25 ± 1.25; 2K: step 1 only, 35
    assert recall == {(1024, 46.25, 1.25, (1, 2)), (2048, 35.0, 0.0, (1,))}
    ruler = {(a.length, a.mean) for a in length_averages(rows(SCORES), same_tasks=False, category=RULER)}
    # RULER: the niah tasks only. 1K: (80+60+40+90)/4 = 67.5, (70+50+30+100)/4 = 62.5 -> 65; 2K: 37.5, 10 -> 23.75
    assert ruler == {(1024, 65.0), (2048, 23.75)}
    table = checkpoint_table(rows(SCORES))
    assert "HELMET Recall (niah_multikey_2, niah_multikey_3, niah_multivalue, json_kv)" in table
    assert "| r | 1 | 67.50 | 37.50 |" in table and "| r | 1 | 47.50 | 35.00 |" in table
    complete = {key: value for key, value in SCORES.items() if key[:2] != (2, 2048)}
    averaged = average_table(rows(complete))
    assert "46.25 ± 1.25" in averaged and "65.00 ± 2.50" in averaged


def test_the_leaderboard_shows_recall_beside_ruler_without_json_kv_in_rulers_average(tmp_path):
    settings = {"tasks": [*RECALL, "niah_single_1"], "num_samples": 4, "seed": 42}
    for step in (1, 2):
        scores = {(t, n): v for (s, n, t), v in SCORES.items() if s == step}
        write(tmp_path, ruler_summary("r", step, scores, settings=settings))
    markdown, _, _ = build_markdown([tmp_path])
    ruler, recall = markdown.split("## HELMET Recall")
    assert "65.00 ± 2.50" in ruler.split("## RULER effective")[0] and "46.25 ± 1.25" not in ruler
    recall = recall.split("\n## ")[0]
    assert "46.25 ± 1.25" in recall and "35.00 ± 0.00" in recall


def test_helmet_recall_end_to_end_on_the_shipped_model(tmp_path):
    """Two checkpoints at 1K: rows named by their metric, json_kv's score HELMET's SubEM of its
    logged predictions, --avg's Recall record the mean of the four, compare's RULER average
    without json_kv."""
    settings = RulerSettings(tasks=parse_ruler_tasks("helmet_recall"), lengths=[1024], num_samples=1)
    result = run_benchmark(RulerBenchmark(settings), tiny_refs(), tmp_path, avg=True)
    by_step: dict[int, dict[str, float]] = {}
    for summary in result.summaries:
        cells = {row["task"]: row for row in summary["rows"]}
        assert sorted(cells) == sorted(RECALL) and cells["json_kv"]["metric"] == "substring_exact_match"
        log = tmp_path / summary["run"] / f"step-{summary['step']}" / "ruler" / "json_kv" / "1024.jsonl"
        records = [json.loads(line) for line in log.read_text().splitlines()]
        subem = [helmet_subem(r["prediction"], r["references"][0]) for r in records]
        assert cells["json_kv"]["value"] == pytest.approx(100 * statistics.fmean(subem))
        by_step[summary["step"]] = {task: row["value"] for task, row in cells.items()}
    averages = json.loads((tmp_path / "ruler-avg.json").read_text())["averages"]
    (recall,) = [a for a in averages if a["category"] == "HELMET Recall"]
    (ruler,) = [a for a in averages if a["category"] == "RULER"]
    assert recall["mean"] == pytest.approx(statistics.fmean(statistics.fmean(s.values()) for s in by_step.values()))
    niah = [statistics.fmean(v for t, v in s.items() if t != "json_kv") for s in by_step.values()]
    assert ruler["mean"] == pytest.approx(statistics.fmean(niah))
    (series,) = read_directory(tmp_path).values()
    point, _ = series_length_averages(Bootstrap({series.name: series}, 100, seed=0), series.name)[1024]
    assert point == pytest.approx(statistics.fmean(niah))
