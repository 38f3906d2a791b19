"""The leaderboard's long-context board: RULER, HELMET Recall, LongBench-E's word buckets and BABILong's
lengths side by side, each a mean over checkpoints (and over tasks) computed here by hand from the
summaries written below; LongBench-E's buckets are never put in a token column; one plot of panels."""

from pathlib import Path

import pytest

from evalkit.results.leaderboard import build_markdown, long_context_board, write_leaderboard
from evalkit.store.result_format import SCHEMA_VERSION
from tests.results.test_leaderboard import ruler_summary, write

RECALL = ("niah_multikey_2", "niah_multikey_3", "niah_multivalue", "json_kv")
# RULER tasks vt and cwe beside the recall ones; two checkpoints.
RULER_SCORES = {
    1: {("vt", 1024): 90, ("cwe", 1024): 70, ("niah_multikey_2", 1024): 60, ("niah_multikey_3", 1024): 40,
        ("niah_multivalue", 1024): 80, ("json_kv", 1024): 20},
    2: {("vt", 1024): 80, ("cwe", 1024): 60, ("niah_multikey_2", 1024): 50, ("niah_multikey_3", 1024): 30,
        ("niah_multivalue", 1024): 70, ("json_kv", 1024): 30},
}  # fmt: skip
# (task, metric, length) -> value per step: LongBench-E buckets in words, BABILong in tokens (0k = 0).
GENERAL = {
    1: {("longbench_hotpotqa_e", "score", 0): 0.5, ("longbench_hotpotqa_e", "score", 4000): 0.25,
        ("longbench_trec_e", "score", 0): 0.7, ("longbench_hotpotqa_e", "qa_f1_score", 0): 0.9,
        ("babilong_qa1", "acc", 0): 1.0, ("babilong_qa1", "acc", 1024): 0.5, ("babilong_qa2", "acc", 1024): 0.3},
    2: {("longbench_hotpotqa_e", "score", 0): 0.3, ("longbench_hotpotqa_e", "score", 4000): 0.15,
        ("longbench_trec_e", "score", 0): 0.5, ("longbench_hotpotqa_e", "qa_f1_score", 0): 0.9,
        ("babilong_qa1", "acc", 0): 0.8, ("babilong_qa1", "acc", 1024): 0.7, ("babilong_qa2", "acc", 1024): 0.1},
}  # fmt: skip


def general_summary(run: str, step: int) -> dict:
    rows = [
        {"run": run, "step": step, "requested": task, "task": task, "metric": metric, "filter": "none",
         "value": value, "stderr": 0.1, "n": 3, "num_fewshot": 0, "length": length}
        for (task, metric, length), value in GENERAL[step].items()
    ]  # fmt: skip
    return {"schema_version": SCHEMA_VERSION, "benchmark": "general", "run": run, "step": step,
            "checkpoint": f"/x/{run}/step-{step}", "rows": rows, "skipped": [], "tasks": {}}  # fmt: skip


def results(root: Path) -> Path:
    settings = {"tasks": ["vt", "cwe", *RECALL], "num_samples": 10, "seed": 42}
    for step, scores in RULER_SCORES.items():
        write(root / "ruler", ruler_summary("m", step, scores, settings=settings))
        write(root / "general", general_summary("m", step), "general-summary.json")
    return root


# By hand. RULER (vt, cwe and the three niah; json_kv is not RULER's): step 1 (90+70+60+40+80)/5 = 68,
# step 2 58 -> 63. Recall: (60+40+80+20)/4 = 50 and (50+30+70+30)/4 = 45 -> 47.5. LongBench-E `score`
# (qa_f1_score is not the board's metric): 0-4k words: hotpotqa (0.5+0.3)/2 = 0.4, trec 0.6 -> 0.5;
# 4-8k words: hotpotqa 0.2. BABILong acc: 0k: qa1 0.9; 1K: qa1 0.6, qa2 0.2 -> 0.4.
BY_HAND = {
    ("RULER (string_match, mean of tasks)", "tokens"): {1024: 63.0},
    ("HELMET Recall (recall and SubEM, mean of 4)", "tokens"): {1024: 47.5},
    ("LongBench-E (score, mean of tasks)", "words"): {0: 0.5, 4000: 0.2},
    ("BABILong (acc, mean of tasks)", "tokens"): {0: 0.9, 1024: 0.4},
}


def test_the_board_equals_hand_arithmetic(tmp_path):
    _, ruler, general = build_markdown([results(tmp_path) / "ruler", tmp_path / "general"])
    board = long_context_board(ruler, general)
    assert set(board) == set(BY_HAND)
    for key, cells in BY_HAND.items():
        assert set(board[key]) == {"m"}
        assert board[key]["m"] == pytest.approx(cells)


def test_the_board_table_keeps_word_buckets_apart_and_the_plot_is_written(tmp_path):
    root = results(tmp_path)
    out = tmp_path / "board" / "leaderboard.md"
    write_leaderboard([root / "ruler", root / "general"], out)
    board = out.read_text().split("## Long context by length")[1].split("\n## ")[0]
    header = next(line for line in board.splitlines() if line.startswith("| benchmark"))
    assert header == "| benchmark (metric) | run | 0K | 1K | 0-4k words | 4-8k words |"
    lines = {line.split(" | ")[0].lstrip("| "): line for line in board.splitlines() if " | m |" in line}
    assert lines["RULER (string_match, mean of tasks)"].endswith("| m | | 63.00 | | |")
    assert lines["LongBench-E (score, mean of tasks)"].endswith("| m | | | 0.50 | 0.20 |")
    assert lines["BABILong (acc, mean of tasks)"].endswith("| m | 0.90 | 0.40 | | |")
    assert (out.parent / "plots" / "long-context.png").stat().st_size > 0


def test_ruler_alone_has_no_board(tmp_path):
    write(tmp_path, ruler_summary("m", 1, {("vt", 1024): 50.0}))
    markdown, _, _ = build_markdown([tmp_path])
    assert "Long context by length" not in markdown
