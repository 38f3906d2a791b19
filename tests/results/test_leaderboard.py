"""The leaderboard from hand-made result files: every number checked against hand arithmetic."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.errors import UserError
from evalkit.models.refs import resolve_checkpoints
from evalkit.store.result_format import SCHEMA_VERSION

SETTINGS = {"tasks": ["niah_single_1", "vt", "cwe"], "num_samples": 10, "seed": 42}


def ruler_summary(run, step, scores, skipped=(), paradigm="anchor", settings=SETTINGS):
    """scores: {(task, length): score}."""
    cells = {"run": run, "step": step, "metric": "string_match_all", "n": 10}
    return {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "ruler",
        "run": run,
        "step": step,
        "checkpoint": f"/x/{run}/step-{step}",
        "rows": [{**cells, "task": t, "length": n, "value": s} for (t, n), s in scores.items()],
        "skipped": [{"task": t, "length": n, "reason": why} for t, n, why in skipped],
        "provenance": {
            "settings": settings,
            "evalkit_version": "0.1.0",
            "git_hash": "abc",
            "engine": {"engine": "hf", "dtype": "fp32", "batch_size": 8, "tokenizer_fingerprint": "tok"},
            "checkpoint_meta": {
                "paradigm": paradigm,
                "config": {
                    "model": {"arch": "llama", "num_layers": 4, "hidden_size": 256},
                    "data": {"source": "builtin"},
                },
            },
        },
    }


def write(root: Path, summary: dict, name="ruler-summary.json"):
    path = root / summary["run"] / f"step-{summary['step']}" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "ruler"
    cwe_skip = [("cwe", 512, "does not fit: needs a length of at least 1156 tokens")]
    # anchor: step 10 -> 512: (80+60)/2=70, 1024: (40+20)/2=30; step 20 -> 512: (90+70)/2=80, 1024: (50+30)/2=40
    write(
        root,
        ruler_summary(
            "tiny-anchor",
            10,
            {("niah_single_1", 512): 80, ("vt", 512): 60, ("niah_single_1", 1024): 40, ("vt", 1024): 20},
            cwe_skip,
        ),
    )
    write(
        root,
        ruler_summary(
            "tiny-anchor",
            20,
            {("niah_single_1", 512): 90, ("vt", 512): 70, ("niah_single_1", 1024): 50, ("vt", 1024): 30},
            cwe_skip,
        ),
    )
    # full: step 10 -> 512: 60, 1024: 45; step 20 -> 512: 70, 1024: 55 (both tasks equal)
    write(
        root,
        ruler_summary(
            "tiny-full",
            10,
            {("niah_single_1", 512): 60, ("vt", 512): 60, ("niah_single_1", 1024): 45, ("vt", 1024): 45},
            cwe_skip,
            "full",
        ),
    )
    write(
        root,
        ruler_summary(
            "tiny-full",
            20,
            {("niah_single_1", 512): 70, ("vt", 512): 70, ("niah_single_1", 1024): 55, ("vt", 1024): 55},
            cwe_skip,
            "full",
        ),
    )
    general = tmp_path / "general"
    for run, values in (("tiny-anchor", (0.30, 0.40)), ("tiny-full", (0.25, 0.35))):
        for step, value in zip((10, 20), values):
            write(
                general,
                {
                    "schema_version": SCHEMA_VERSION,
                    "benchmark": "general",
                    "run": run,
                    "step": step,
                    "rows": [
                        {
                            "run": run,
                            "step": step,
                            "task": "fixture_mc",
                            "metric": "acc",
                            "value": value,
                            "stderr": 0.02,
                            "n": 40,
                            "num_fewshot": 5,
                        }
                    ],
                    "provenance": {
                        "engine": {"engine": "hf", "dtype": "fp32"},
                        **({"checkpoint_meta": {"paradigm": "anchor"}} if run == "tiny-anchor" else {}),
                    },
                },
                "general-summary.json",
            )
    return tmp_path


def leaderboard(*args):
    return subprocess.run(
        [sys.executable, "-m", "evalkit.cli", "leaderboard", *args], capture_output=True, text=True, timeout=120
    )


def test_tables_match_hand_arithmetic(results):
    out = results / "board" / "leaderboard.md"
    result = leaderboard(str(results / "ruler"), str(results / "general"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    # anchor: 512 mean of (70, 80) = 75, pstdev 5; 1024 mean of (30, 40) = 35, pstdev 5; avg (75+35)/2 = 55
    # full:   512 mean of (60, 70) = 65, pstdev 5; 1024 mean of (45, 55) = 50, pstdev 5; avg 57.5
    # No per-sample logs here: compare could not test a leader, so none is bold.
    assert (
        "| tiny-anchor | anchor | llama 4x256 | builtin | 10, 20 | 75.00 ± 5.00 | 35.00 ± 5.00 | 55.00 | "
        "2 ckpt × 2 tasks × 10 samples |"
    ) in text
    assert (
        "| tiny-full | full | llama 4x256 | builtin | 10, 20 | 65.00 ± 5.00 | 50.00 ± 5.00 | 57.50 | "
        "2 ckpt × 2 tasks × 10 samples |"
    ) in text
    assert "- tiny-anchor: cwe at 512 skipped: does not fit: needs a length of at least 1156 tokens" in text
    assert "| tiny-anchor | niah_single_1 | 85.00 | 45.00 |" in text  # per task: (80+90)/2, (40+50)/2
    # general: paradigm from the checkpoint's meta; a summary without it (written before 0.1) shows "?"
    assert "## General tasks (mean over checkpoints ± stderr)\n" in text  # its rows record a stderr
    assert (
        "| tiny-anchor | anchor | ? | ? | 5-shot | 0.3500 ± 0.0200 |" in text
        and "| tiny-full | ? | ? | ? | 5-shot | 0.3000 ± 0.0200 |" in text
    )
    assert "†" not in text  # same settings everywhere
    for name in ("ruler-vs-length", "ruler-vs-step", "general"):
        for suffix in (".png", ".svg"):
            path = results / "board" / "plots" / f"{name}{suffix}"
            assert path.stat().st_size > 1000
        assert f"(plots/{name}.png)" in text


def test_counts_that_differ_by_length_name_their_lengths(tmp_path):
    root = tmp_path / "ruler"
    for step in (10, 20):  # vt scored at 1024 only (as cwe, which does not fit the shorter length)
        write(
            root,
            ruler_summary(
                "tiny-anchor", step, {("niah_single_1", 512): 50, ("niah_single_1", 1024): 40, ("vt", 1024): 20}
            ),
        )
    out = tmp_path / "board.md"
    result = leaderboard(str(root), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "| 2 ckpt × 1 tasks at 512; 2 ckpt × 2 tasks at 1K; 10 samples each |" in out.read_text()


def test_runs_with_different_settings_are_marked(results):
    other = dict(SETTINGS, num_samples=50)
    write(results / "ruler", ruler_summary("tiny-intra", 20, {("niah_single_1", 512): 10}, settings=other))
    write(results / "ruler", ruler_summary("tiny-reset", 20, {("niah_single_1", 512): 10}))
    out = results / "b2" / "leaderboard.md"
    assert leaderboard(str(results / "ruler"), "--out", str(out)).returncode == 0
    text = out.read_text()
    assert "| tiny-intra † |" in text
    assert "- tiny-intra: tasks cwe, niah_single_1, vt; 50 samples; seed 42" in text


def test_checkpoints_of_one_run_with_different_settings_are_refused(results):
    write(
        results / "ruler",
        ruler_summary("tiny-anchor", 30, {("niah_single_1", 512): 1}, settings=dict(SETTINGS, seed=1)),
    )
    result = leaderboard(str(results / "ruler"), "--out", str(results / "x.md"))
    assert result.returncode == 2 and "evaluated with different settings" in result.stderr


def test_empty_directory_is_a_clear_error(tmp_path):
    result = leaderboard(str(tmp_path), "--out", str(tmp_path / "x.md"))
    assert result.returncode == 2 and "no ruler-summary.json" in result.stderr


def test_resolve_checkpoints(tmp_path):
    for run in ("a", "b"):
        for step in (5, 10, 15):
            ckpt = tmp_path / "runs" / run / f"step-{step}"
            ckpt.mkdir(parents=True)
            (ckpt / "config.json").write_text("{}")
    refs = resolve_checkpoints([str(tmp_path / "runs" / "*")], last=2)
    assert [(r.run, r.step) for r in refs] == [("a", 10), ("a", 15), ("b", 10), ("b", 15)]
    single = resolve_checkpoints([str(tmp_path / "runs" / "a" / "step-5")])
    assert [(r.run, r.step) for r in single] == [("a", 5)]
    with pytest.raises(UserError, match="no checkpoint at"):
        resolve_checkpoints([str(tmp_path)])


def test_per_task_cells_show_the_standard_error_of_a_single_checkpoint():
    from evalkit.results.leaderboard import per_task_table
    from evalkit.store.result_format import read_row

    cell = {"task": "vt", "metric": "string_match_all", "length": 1024, "n": 20}
    rows = [
        {**cell, "run": "one", "step": 5, "value": 15.0, "stderr": 8.19},
        {**cell, "run": "two", "step": 5, "value": 10.0, "stderr": 3.0},
        {**cell, "run": "two", "step": 9, "value": 20.0, "stderr": 4.0},
        {**cell, "run": "old", "step": 1, "value": 7.5},  # no stderr
    ]
    rows = [read_row("ruler", row) for row in rows]
    lines = per_task_table(rows).splitlines()
    assert lines[2:] == ["| old | vt | 7.50 |", "| one | vt | 15.00 ± 8.19 |", "| two | vt | 15.00 |"]


def test_best_marks_only_a_strict_best():
    from evalkit.results.leaderboard import _best

    assert _best({"a": 0.0, "b": 0.0, "c": 0.0}) == set()  # a tie of zeros is no best
    assert _best({"a": 50.0, "b": 50.001}) == set()  # equal as shown (2 decimals): a tie
    assert _best({"a": 50.0, "b": 49.0, "c": 50.0}) == set()
    assert _best({"a": 10.0, "b": 0.0}) == {"a"}
    assert _best({"a": 10.0}) == set()  # one run: nothing to be best against


def test_untrained_runs_at_zero_are_not_bold(tmp_path):
    for run in ("zero-a", "zero-b"):
        write(tmp_path / "r", ruler_summary(run, 1, {("niah_single_1", 512): 0, ("niah_single_1", 1024): 0}))
    from evalkit.results.leaderboard import build_markdown

    markdown, _, _ = build_markdown([tmp_path / "r"])
    main = markdown.split("## RULER (")[1].split("\n\n")[1]
    assert "**" not in main and "0.00 ± 0.00" in main


@pytest.mark.parametrize(
    "option, expected",
    [
        # anchor: 512 -> 75, 1K -> 35; full: 512 -> 65, 1K -> 50 (the fixture's hand arithmetic)
        (("--threshold", "40"), {"tiny-anchor": "512", "tiny-full": "1K"}),
        (("--threshold", "70"), {"tiny-anchor": "512", "tiny-full": "< 512"}),
        (("--threshold-from", "tiny-anchor"), {"tiny-anchor": "512", "tiny-full": "< 512"}),  # 75, its 512 score
        ((), {"tiny-anchor": "< 512", "tiny-full": "< 512"}),  # RULER's 85.6
    ],
)
def test_effective_length_by_hand(results, option, expected):
    from evalkit.results.leaderboard import build_markdown

    given = dict(zip(option[::2], option[1::2]))
    threshold = float(given["--threshold"]) if "--threshold" in given else None
    markdown, _, _ = build_markdown([results / "ruler"], threshold, given.get("--threshold-from"))
    section = markdown.split("## RULER effective length")[1].split("\n\n")
    threshold = {"40": "40.00", "70": "70.00", "tiny-anchor": "75.00"}.get(option[-1] if option else "", "85.60")
    assert f"≥ {threshold} there" in section[0]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in section[1].splitlines()[2:]}
    assert rows == expected
    assert "– (no per-sample logs)" in section[1]  # summaries only: no interval


@pytest.mark.parametrize("form", ["csv", "json"])
def test_exports_parse_back_to_the_stored_numbers(results, form):
    import csv

    out = results / "board" / f"rows.{form}"
    done = leaderboard(str(results / "ruler"), str(results / "general"), "--out", str(out), "--format", form)
    assert done.returncode == 0, done.stderr
    if form == "csv":
        rows = list(csv.DictReader(out.open()))
    else:
        rows = json.loads(out.read_text())["rows"]
    stored = {}
    for path in sorted(results.rglob("*-summary.json")):
        summary = json.loads(path.read_text())
        for row in summary["rows"]:
            stored[(row["run"], int(row["step"]), row["task"], row.get("length") or None)] = float(row["value"])
    exported = {
        (
            row["run"],
            int(row["step"]),
            row["task"],
            int(row["length"]) if row["length"] not in ("", None) else None,
        ): float(row["value"])
        for row in rows
    }
    assert exported == stored and len(rows) == len(stored) == 16 + 4  # 4 RULER summaries of 4 cells, 4 general
    by_task = {(row["run"], row["task"]): row for row in rows}
    assert by_task[("tiny-anchor", "vt")]["metric"] == "string_match_all"
    assert by_task[("tiny-anchor", "fixture_mc")]["metric"] == "acc"
    assert by_task[("tiny-anchor", "vt")]["paradigm"] == "anchor"


def test_export_refuses_an_unknown_format(results):
    done = leaderboard(str(results / "ruler"), "--format", "xlsx")
    assert done.returncode == 2 and "--format must be md, csv or json" in done.stderr


@pytest.mark.parametrize(
    "config, precision, serving, shown",
    [
        ({}, None, "trained", "llama 4x256"),  # fp32 training: the model text as before, either serving
        ({"dtype": "bf16"}, None, "stock", "llama 4x256 (bf16, RoPE fp32; served stock)"),  # before the setting
        (
            {"dtype": "bf16", "rope_precision": "bf16"},
            {"dtype": "bf16", "rope": "bf16"},
            "stock",
            "llama 4x256 (bf16, RoPE bf16; served stock)",
        ),
        (  # the released regime: bf16 weights, buffers and residual
            {"dtype": "bf16_full", "rope_precision": "bf16"},
            {"dtype": "bf16_full", "rope": "bf16", "weights": "bf16", "residual": "bf16"},
            "trained",
            "llama 4x256 (bf16 full, RoPE bf16; served as trained)",
        ),
    ],
)
def test_the_model_column_shows_the_training_precision_and_the_serving(config, precision, serving, shown):
    from evalkit.store.result_format import describe_checkpoint

    summary = ruler_summary("run", 10, {("vt", 512): 50})
    summary["provenance"]["engine"] = {"serving": serving}
    meta = summary["provenance"]["checkpoint_meta"]
    meta["config"].update(config)
    if precision:
        meta["precision"] = precision
    assert describe_checkpoint(summary) == ("anchor", shown, "builtin")


def test_leaderboard_cells_and_avg_are_one_computation_and_only_avg_demands_the_same_tasks():
    """Checkpoint 1 scored two tasks at 512, checkpoint 2 three. --avg refuses to average unlike
    things; the leaderboard shows the stored mean over checkpoints of each one's task average."""
    from evalkit.results.leaderboard import ruler_cells
    from evalkit.store.averages import length_averages
    from evalkit.store.result_format import ResultRow

    def row(step: int, task: str, value: float) -> ResultRow:
        return ResultRow("ruler", "r", step, task, "string_match_all", value, 0.0, 10, length=512)

    rows = [row(1, "vt", 40.0), row(1, "cwe", 60.0), row(2, "vt", 60.0), row(2, "cwe", 70.0), row(2, "fwe", 80.0)]
    with pytest.raises(ValueError, match="different task sets"):
        length_averages(rows)
    cell = ruler_cells(rows)[("r", 512)]
    # checkpoint 1: (40 + 60) / 2 = 50; checkpoint 2: (60 + 70 + 80) / 3 = 70; mean 60, population std 10
    assert (cell.mean, cell.std, len(cell.checkpoints), len(cell.tasks)) == (
        pytest.approx(60.0),
        pytest.approx(10.0),
        2,
        3,
    )
    alike = [r for r in rows if r.task != "fwe"]  # both checkpoints: vt and cwe; 50 and 65
    (average,) = length_averages(alike)
    assert (average.mean, average.std, average.checkpoints) == (pytest.approx(57.5), pytest.approx(7.5), [1, 2])
    assert (ruler_cells(alike)[("r", 512)].mean, ruler_cells(alike)[("r", 512)].std) == (average.mean, average.std)


def test_provenance_is_one_line_per_engine_and_evalkit_of_a_run():
    from evalkit.results.leaderboard import provenance_notes

    def summary(run, dtype, tokenizer, benchmark="ruler"):
        engine = {"engine": "hf", "dtype": dtype, "batch_size": 8, "tokenizer_fingerprint": tokenizer}
        provenance = {"evalkit_version": "0.1.0", "git_hash": "abc", "engine": engine}
        return {"benchmark": benchmark, "run": run, "provenance": provenance}

    found = provenance_notes(
        [
            summary("a", "fp32", "t1"),
            summary("a", "fp32", "t2"),
            summary("a", "bf16", "t3"),
            summary("b", "fp32", "t4", "ppl"),
        ]
    )
    assert found.splitlines() == [
        "- ruler a: engine hf, dtype fp32, batch size 8, evalkit 0.1.0 (abc), tokenizer t1",  # t2: the same engine
        "- ruler a: engine hf, dtype bf16, batch size 8, evalkit 0.1.0 (abc), tokenizer t3",
        "- ppl b: engine hf, dtype fp32, batch size 8, evalkit 0.1.0 (abc), tokenizer t4",
    ]
    assert (
        provenance_notes([{"benchmark": "ruler", "run": "c"}])
        == "- ruler c: engine None, dtype None, batch size None, evalkit None (None), tokenizer ?"
    )


def test_general_bars_place_each_runs_means_and_whiskers_by_column(monkeypatch, tmp_path):
    from evalkit.results import plots

    drawn = []
    monkeypatch.setattr(plots, "write_figure", lambda figure, stem: drawn.append(figure) or [])
    values = {("a", "x acc"): (0.5, 0.1), ("a", "y acc"): (0.25, None), ("b", "y acc"): (0.75, 0.05)}
    plots.general_bars(values, tmp_path / "general")
    (axes,) = drawn[0].axes
    bars = [(round(bar.get_x() + bar.get_width() / 2, 6), bar.get_height()) for bar in axes.patches]
    # width 0.8 / 2 runs = 0.4: run a's bars centred at columns 0 and 1, run b's at column 1 + 0.4 (no x for b)
    assert bars == [(0.0, 0.5), (1.0, 0.25), (1.4, 0.75)]
    whiskers = [line.get_segments() for line in axes.collections]
    assert [[(s[0][1], s[1][1]) for s in segments] for segments in whiskers] == [
        [(0.4, 0.6), (0.25, 0.25)],
        [(0.7, 0.8)],
    ]
