"""The leaderboard puts side by side only numbers measured alike, says what each run was evaluated
on, names every summary it leaves out and why, and says why a cell has no number. Summaries are
written by hand; every expected line below is written out from the rule, not from the code."""

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from evalkit.results.leaderboard import build_markdown, write_export
from evalkit.store.result_format import SCHEMA_VERSION

NO_KEY_TOKENS = (
    "0 key tokens: no token's log-probability gained enough from the long context "
    "(LongPPL's key tokens lie past its short context of 4096 tokens: none at L <= 4096)."
)


def write(root: Path, summary: dict, name: str) -> Path:
    path = root / summary["run"] / f"step-{summary['step']}" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return path


def ppl_summary(run: str, step: int, values: dict, eval_data: dict | None = None, skipped=()) -> dict:
    """values: {(metric, length): value}."""
    rows = [
        {"run": run, "step": step, "task": "ppl", "metric": m, "value": v, "n": 3, "length": n, "encoding": "standard"}
        for (m, n), v in values.items()
    ]
    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "ppl",
        "title": "Perplexity",
        "run": run,
        "step": step,
        "rows": rows,
    }
    provenance = {"settings": {"data": "builtin"}} | ({"eval_data": eval_data} if eval_data else {})
    return summary | {"skipped": list(skipped), "provenance": provenance}


def general_summary(run: str, rows: list[tuple[str, str, float | None, int]], limit=None) -> dict:
    """rows: (task, filter, value, shots)."""
    stored = [
        {"run": run, "step": 1, "requested": t, "task": t, "metric": "exact_match", "filter": f, "value": v}
        | {"stderr": None, "n": 10, "num_fewshot": shots}
        for t, f, v, shots in rows
    ]
    return {"schema_version": SCHEMA_VERSION, "benchmark": "general", "run": run, "step": 1, "rows": stored} | {
        "provenance": {"settings": {"limit": limit}}
    }


def ruler_summary(run: str, score: float, prompt_format: str | None = None) -> dict:
    settings = {"tasks": ["vt"], "num_samples": 10, "seed": 42}
    settings |= {"prompt_format": prompt_format} if prompt_format else {}
    row = {"run": run, "step": 1, "task": "vt", "metric": "string_match_all", "length": 512, "value": score, "n": 10}
    return {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "ruler",
        "run": run,
        "step": 1,
        "rows": [row],
        "skipped": [],
    } | {"provenance": {"settings": settings}}


def section(board: str, heading: str) -> list[str]:
    """The lines of the board's section whose heading starts so, up to the next heading."""
    return [line for line in (heading + board.split(f"## {heading}")[1]).split("\n## ")[0].splitlines() if line]


BUILTIN = {"name": "builtin", "sha256": "aaaaaaaa11111111"}
MINE = {"name": "mine.jsonl", "sha256": "bbbbbbbb22222222"}


def test_perplexities_on_different_data_never_share_a_column(tmp_path):
    """4.16 on the built-in prose and 54.50 on a user's file: each run names its evaluation data,
    and each data set has its column (two runs on the same documents share one)."""
    write(tmp_path, ppl_summary("a", 1, {("perplexity", 4096): 4.16}, BUILTIN), "ppl-summary.json")
    write(tmp_path, ppl_summary("b", 1, {("perplexity", 4096): 54.5}, MINE), "ppl-summary.json")
    write(tmp_path, ppl_summary("c", 1, {("perplexity", 4096): 5.0}, BUILTIN), "ppl-summary.json")
    lines = section(build_markdown([tmp_path])[0], "Perplexity")
    assert lines[1:] == [
        "| run | paradigm | model | training data | evaluated on | ppl perplexity @ 4K [builtin (sha256 aaaaaaaa)] "
        "| ppl perplexity @ 4K [mine.jsonl (sha256 bbbbbbbb)] |",
        "|---|---|---|---|---|---|---|",
        "| a | ? | ? | ? | builtin (sha256 aaaaaaaa) | 4.1600 | – |",
        "| b | ? | ? | ? | mine.jsonl (sha256 bbbbbbbb) | – | 54.5000 |",
        "| c | ? | ? | ? | builtin (sha256 aaaaaaaa) | 5.0000 | – |",
    ]


def test_one_data_set_is_one_column_named_in_the_row_and_an_old_summary_names_its_data(tmp_path):
    write(tmp_path, ppl_summary("a", 1, {("perplexity", 1024): 4.0}), "ppl-summary.json")  # no eval_data recorded
    lines = section(build_markdown([tmp_path])[0], "Perplexity")
    assert lines[1:] == [
        "| run | paradigm | model | training data | evaluated on | ppl perplexity @ 1K |",
        "|---|---|---|---|---|---|",
        "| a | ? | ? | ? | builtin (documents not recorded) | 4.0000 |",
    ]


def test_lm_eval_filters_and_shots_are_columns_of_their_own(tmp_path):
    """gsm8k's two filters were averaged into one cell ((0.4 + 0.6) / 2 = 0.5); 0 and 5 shots shared
    a column. Now: a column per filter, and the shots split where runs differ."""
    strict, flexible = ("gsm8k", "strict-match", 0.4, 5), ("gsm8k", "flexible-extract", 0.6, 5)
    write(tmp_path, general_summary("x", [strict, flexible, ("arc", "none", 0.7, 0)]), "general-summary.json")
    write(tmp_path, general_summary("y", [("arc", "none", 0.3, 5)], limit=100), "general-summary.json")
    lines = section(build_markdown([tmp_path])[0], "General tasks")
    assert lines[1:] == [
        "| run | paradigm | model | training data | evaluated on | arc exact_match [0-shot] "
        "| arc exact_match [5-shot, limit 100] | gsm8k exact_match (flexible-extract) "
        "| gsm8k exact_match (strict-match) |",
        "|---|---|---|---|---|---|---|---|---|",
        "| x | ? | ? | ? | 0-shot; 5-shot | 0.7000 | – | 0.6000 | 0.4000 |",
        "| y | ? | ? | ? | 5-shot, limit 100 | – | 0.3000 | – | – |",
    ]


def test_ruler_runs_of_another_prompt_format_are_marked(tmp_path):
    for run, fmt in (("base-1", None), ("base-2", "base"), ("chat", "chat")):
        write(tmp_path, ruler_summary(run, 50.0, fmt), "ruler-summary.json")
    board = build_markdown([tmp_path])[0]
    assert "| chat † |" in board and "| base-1 |" in board and "| base-2 |" in board
    assert "- chat: tasks vt; 10 samples; seed 42; sizing exact; prompt format chat" in board


def test_every_summary_left_out_is_noted_with_its_file_and_why(tmp_path):
    """Beside a valid RULER summary: an unknown benchmark's summary with no row, and a ppl summary whose
    every length was skipped. Neither is in a table; each is named with why, in the markdown and in
    the csv/json export's notes."""
    write(tmp_path, ruler_summary("valid", 60.0), "ruler-summary.json")
    empty = write(
        tmp_path,
        {"schema_version": SCHEMA_VERSION, "benchmark": "xyz", "run": "u", "step": 1, "rows": []},
        "xyz-summary.json",
    )
    reason = "no document of the 3 reaches 8192 tokens (longest: 5000)"
    skip = {"task": "ppl", "length": 8192, "reason": reason}
    skipped = write(tmp_path, ppl_summary("p", 1, {}, BUILTIN, [skip]), "ppl-summary.json")
    expected = [
        f"- {empty}: not in any table: it holds no row",
        f"- {skipped}: not in any table: it holds no row: every cell was skipped ({reason})",
    ]
    board = build_markdown([tmp_path])[0]
    assert section(board, "Not read") == ["Not read (not in any table; each line says why):", *sorted(expected)]
    assert "## xyz" not in board and "## Perplexity" not in board and "| valid |" in board
    unread: list[str] = []
    write_export([tmp_path], tmp_path / "board.csv", "csv", unread)
    assert sorted(unread) == sorted(expected)


def test_no_key_token_is_said_with_why_and_the_column_stays(tmp_path):
    """LongPPL with no key token (value None): the cell says 0 key tokens, a note says why; a run whose
    other checkpoint had key tokens shows that one's value and the checkpoint left out of it."""
    write(
        tmp_path, ppl_summary("a", 1, {("perplexity", 1024): 4.0, ("longppl", 1024): None}, BUILTIN), "ppl-summary.json"
    )
    write(
        tmp_path, ppl_summary("b", 1, {("perplexity", 1024): 5.0, ("longppl", 1024): 6.0}, BUILTIN), "ppl-summary.json"
    )
    write(
        tmp_path, ppl_summary("b", 2, {("perplexity", 1024): 7.0, ("longppl", 1024): None}, BUILTIN), "ppl-summary.json"
    )
    lines = section(build_markdown([tmp_path])[0], "Perplexity")
    assert lines[1:] == [
        "| run | paradigm | model | training data | evaluated on | ppl longppl @ 1K | ppl perplexity @ 1K |",
        "|---|---|---|---|---|---|---|",
        "| a | ? | ? | ? | builtin (sha256 aaaaaaaa) | – (0 key tokens) | 4.0000 |",
        "| b | ? | ? | ? | builtin (sha256 aaaaaaaa) | 6.0000 (not in the mean: 1 ckpt, 0 key tokens) | 6.0000 |",
        NO_KEY_TOKENS,
    ]


def test_ppl_command_table_says_0_key_tokens():
    from evalkit.ppl import checkpoint_table
    from evalkit.store.result_format import ResultRow

    rows = [ResultRow("ppl", "a", 1, "ppl", "longppl", None, n=3, length=1024, encoding="standard")]
    assert checkpoint_table(rows).splitlines()[2:] == ["| a | 1 | longppl | 0 key tokens (3) |", "", NO_KEY_TOKENS]


def test_the_ppl_summary_records_its_evaluation_data_and_keeps_no_cell_of_other_data(tmp_path):
    """eval_data: the file's name and the sha256 of the documents read (the first --docs); a summary
    already in --out from other documents keeps none of its cells in the new one."""
    from evalkit.ppl import PplBenchmark, PplSettings

    data = tmp_path / "mine.jsonl"
    texts = ["first document", "second", "third, not read"]
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    settings = PplSettings(lengths=[4096], data=str(data), docs=2)
    provenance = {"settings": asdict(settings), "engine": {}}
    now = {"run": "a", "step": 1, "rows": [], "skipped": [], "provenance": provenance}
    old_row = {"run": "a", "step": 1, "task": "ppl", "metric": "perplexity", "value": 4.16, "length": 8192}
    earlier = {**now, "rows": [old_row], "provenance": provenance | {"eval_data": BUILTIN}}
    summary = PplBenchmark(settings).finish_summary(now, [], earlier)
    digest = hashlib.sha256(json.dumps(texts[:2]).encode()).hexdigest()[:16]
    assert summary["provenance"]["eval_data"] == {"name": "mine.jsonl", "sha256": digest}
    assert summary["rows"] == []  # 4.16 was the built-in prose's: not this file's
    same = PplBenchmark(settings).finish_summary(now, [], {**earlier, "provenance": summary["provenance"]})
    assert [row["value"] for row in same["rows"]] == [4.16]  # the same documents: kept, as before
