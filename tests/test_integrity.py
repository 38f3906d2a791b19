"""Integrity of cached and stored data: an edited RULER cache entry is regenerated, never served;
an edited per-sample record is refused with its file and line; the leaderboard never merges one
checkpoint from two summaries, and its two RULER tables are computed from the same rows."""

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.errors import UserError
from evalkit.ruler import cache as cache_module
from evalkit.ruler import cache_path, dumps_jsonl, generate, load_or_generate, loads_jsonl
from evalkit.store.result_format import SCHEMA_VERSION
from evalkit.store.sample_log import SampleLog
from tests.helpers import run_cli
from tests.sweep.helpers import SHIPPED_ANCHOR

TASK, LENGTH, N = "niah_single_1", 1024, 3
SHIPPED = SHIPPED_ANCHOR / "step-600"


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test sees its own once-per-process warnings."""
    monkeypatch.setattr(cache_module, "_warned", set())


def no_generation(*args, **kwargs):
    raise AssertionError("generated although the cache entry was intact")


def sample_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()[1:]  # after the checksum header


def with_changed_answer(line: str) -> str:
    """The hostile edit: still a valid sample line, one reference answer changed."""
    sample = json.loads(line)
    sample["outputs"] = ["1234567"]
    return json.dumps(sample, ensure_ascii=False, sort_keys=True)


# ---------------------------------------------------------------------- the RULER cache


def test_an_edited_cache_entry_is_regenerated_and_warned_about_once(
    tokenizer, tmp_path, capsys, fresh_warnings, monkeypatch
):
    expected = generate(TASK, tokenizer, LENGTH, N)  # straight from the generator, no cache
    load_or_generate(TASK, tokenizer, LENGTH, N, cache_dir=tmp_path)
    path = cache_path(TASK, tokenizer, LENGTH, cache_dir=tmp_path)
    header, *lines = path.read_text().splitlines()
    lines[1] = with_changed_answer(lines[1])
    path.write_text("\n".join([header, *lines]) + "\n")
    capsys.readouterr()

    served = load_or_generate(TASK, tokenizer, LENGTH, N, cache_dir=tmp_path)
    assert served == expected and served[1].outputs != ["1234567"]
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and str(path) in warning[0] and "checksum" in warning[0]

    monkeypatch.setattr("evalkit.ruler.generation.generate", no_generation)
    assert load_or_generate(TASK, tokenizer, LENGTH, N, cache_dir=tmp_path) == expected  # rewritten whole
    assert capsys.readouterr().err == ""


def test_a_cache_entry_whose_checksum_line_was_edited_is_regenerated(tokenizer, tmp_path, fresh_warnings):
    expected = load_or_generate(TASK, tokenizer, LENGTH, N, cache_dir=tmp_path)
    path = cache_path(TASK, tokenizer, LENGTH, cache_dir=tmp_path)
    lines = sample_lines(path)
    edited = [with_changed_answer(lines[0]), *lines[1:]]
    # The edit with a checksum recomputed the wrong way (over the raw text, not the samples' content).
    forged = {"format": cache_module.CACHE_FORMAT, "samples": N, "sha256": hashlib.sha256(b"x").hexdigest()}
    path.write_text(json.dumps(forged) + "\n" + "".join(line + "\n" for line in edited))
    assert load_or_generate(TASK, tokenizer, LENGTH, N, cache_dir=tmp_path) == expected


def test_only_content_counts_not_key_order_or_spacing(tokenizer, tmp_path, monkeypatch):
    expected = load_or_generate(TASK, tokenizer, LENGTH, N, cache_dir=tmp_path)
    path = cache_path(TASK, tokenizer, LENGTH, cache_dir=tmp_path)
    header = path.read_text().splitlines()[0]
    reordered = [
        json.dumps(dict(reversed(list(json.loads(line).items()))), indent=None, separators=(", ", ": "))
        for line in sample_lines(path)
    ]
    path.write_text("\n".join([header, *reordered]) + "\n")
    monkeypatch.setattr("evalkit.ruler.generation.generate", no_generation)
    assert load_or_generate(TASK, tokenizer, LENGTH, N, cache_dir=tmp_path) == expected


def test_cache_files_without_their_checksum_header_are_regenerated_with_a_warning_each(
    tokenizer, tmp_path, capsys, fresh_warnings
):
    expected = {task: generate(task, tokenizer, LENGTH, N) for task in (TASK, "niah_single_2")}
    for task, samples in expected.items():  # sample lines only (no header), and one answer edited
        edited = [dataclasses.replace(samples[0], outputs=["1234567"]), *samples[1:]]
        path = cache_path(task, tokenizer, LENGTH, cache_dir=tmp_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps_jsonl(edited))
    capsys.readouterr()

    for task, samples in expected.items():
        assert load_or_generate(task, tokenizer, LENGTH, N, cache_dir=tmp_path) == samples
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 2 and all("does not match its checksum" in line for line in warnings)
    for task, samples in expected.items():  # rewritten with their header
        path = cache_path(task, tokenizer, LENGTH, cache_dir=tmp_path)
        assert cache_module.read_entry(path, N) == samples and loads_jsonl("\n".join(sample_lines(path))) == samples


# ---------------------------------------------------------------------- per-sample records

RECORDS = [
    {"index": 0, "length": 1000, "prediction": "7 1 2", "references": ["712"], "score": 0.0, "prompt_sha": "aa"},
    {
        "index": 1,
        "length": 1001,
        "prediction": "5550123",
        "references": ["5550123"],
        "score": 100.0,
        "prompt_sha": "bb",
    },
    {"index": 2, "length": 1002, "prediction": "é", "references": ["x"], "score": 0.0, "prompt_sha": "cc"},
]


def written_log(path: Path, records=RECORDS) -> list[str]:
    SampleLog(path, "key").append(records)
    return path.read_text().splitlines()


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def test_records_carry_the_sha256_of_their_canonical_json(tmp_path):
    lines = written_log(tmp_path / "512.jsonl")
    for line, record in zip(lines, RECORDS):
        stored = json.loads(line)
        canonical = json.dumps({**record, "key": "key"}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert stored["sha"] == hashlib.sha256(canonical.encode()).hexdigest()
    reread = SampleLog(tmp_path / "512.jsonl", "key")
    assert [r["prediction"] for _, r in sorted(reread.records.items())] == ["7 1 2", "5550123", "é"]


@pytest.mark.parametrize("field, value", [("prediction", "712"), ("score", 100.0), ("references", ["7 1 2"])])
def test_an_edited_record_is_refused_naming_file_and_line(tmp_path, field, value):
    path = tmp_path / "512.jsonl"
    lines = written_log(path)
    lines[0] = json.dumps({**json.loads(lines[0]), field: value})
    write_lines(path, lines)
    with pytest.raises(UserError) as error:
        SampleLog(path, "key")
    message = str(error.value)
    assert f"{path}:1 " in message and "delete that line" in message and "\n" not in message
    assert path.read_text().splitlines() == lines  # nothing rewritten or recomputed behind the user's back


@pytest.mark.parametrize("line", [0, 2])
def test_a_record_whose_checksum_was_removed_is_refused(tmp_path, line):
    """Every record evalkit writes carries its checksum (results/ was migrated to them): one without is edited."""
    path = tmp_path / "512.jsonl"
    lines = written_log(path)
    lines[line] = json.dumps({**{k: v for k, v in json.loads(lines[line]).items() if k != "sha"}, "score": 100.0})
    write_lines(path, lines)
    with pytest.raises(UserError, match=f"{path}:{line + 1} has no checksum"):
        SampleLog(path, "key")


def test_duplicates_keep_the_first_and_a_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "512.jsonl"
    lines = written_log(path)
    again = written_log(tmp_path / "other.jsonl", [{**r, "prediction": "second copy"} for r in RECORDS[:2]])
    write_lines(path, [lines[0], lines[1], again[0], lines[2], again[1]])  # a second writer's copies
    log = SampleLog(path, "key")
    assert [(i, r["prediction"]) for i, r in sorted(log.records.items())] == [(0, "7 1 2"), (1, "5550123"), (2, "é")]
    log.append([{**RECORDS[2], "index": 3}])
    assert [json.loads(line)["index"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]
    clean = path.read_text().splitlines()
    write_lines(path, [*clean, lines[2][:40]])  # a killed write
    assert sorted(SampleLog(path, "key").records) == [0, 1, 2, 3]
    assert path.read_text().splitlines() == clean  # rewritten clean for the next append


def test_a_sample_log_with_a_foreign_line_is_refused_not_truncated(tmp_path):
    log = tmp_path / "512.jsonl"
    log.write_text("not a record\nnot one either\n")
    with pytest.raises(UserError, match="512.jsonl:1 is not a sample record"):
        SampleLog(log, "key")
    assert log.read_text() == "not a record\nnot one either\n"


def test_ruler_refuses_an_edited_record_in_one_line(tmp_path, capsys):
    """End to end on the shipped tiny checkpoint: the edited record is never scored."""
    out = tmp_path / "results"
    args = ["ruler", "--ckpts", str(SHIPPED), "--lengths", "1k", "--tasks", TASK, "--samples", "2", "--out", str(out)]
    assert run_cli(args) == 0
    log = out / SHIPPED_ANCHOR.name / "step-600" / "ruler" / TASK / "1024.jsonl"
    lines = log.read_text().splitlines()
    record = json.loads(lines[1])
    write_lines(log, [lines[0], json.dumps({**record, "prediction": record["references"][0], "score": 100.0})])
    summary = (log.parents[2] / "ruler-summary.json").read_text()
    capsys.readouterr()

    assert run_cli(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"error: {log}:2 does not match its checksum")
    assert err.count("error:") == 1 and "Traceback" not in err  # one line after the progress, no traceback
    assert (log.parents[2] / "ruler-summary.json").read_text() == summary  # the edited score reached nothing


# ---------------------------------------------------------------------- the leaderboard

SETTINGS = {"tasks": ["niah_single_1", "vt", "fwe"], "num_samples": 10, "seed": 42}


def ruler_summary(run: str, step: int, scores: dict, version: str = "0.1.0", git: str = "abc") -> dict:
    """scores: {(task, length): score}."""
    cells = {"run": run, "step": step, "metric": "string_match_all", "n": 10}
    return {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "ruler",
        "run": run,
        "step": step,
        "checkpoint": f"/x/{run}/step-{step}",
        "rows": [{**cells, "task": t, "length": n, "value": s} for (t, n), s in scores.items()],
        "skipped": [],
        "provenance": {
            "settings": SETTINGS,
            "evalkit_version": version,
            "git_hash": git,
            "engine": {"engine": "hf", "dtype": "fp32", "batch_size": 8, "tokenizer_fingerprint": "tok"},
            "checkpoint_meta": {"paradigm": "anchor"},
        },
    }


def write_summary(root: Path, summary: dict) -> Path:
    path = root / summary["run"] / f"step-{summary['step']}" / "ruler-summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return path


def leaderboard(*args) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "evalkit.cli", "leaderboard", *map(str, args)]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)


def test_one_checkpoint_in_two_directories_from_two_versions_is_refused(tmp_path):
    """The reviewer's case: 0 in one summary, 100 in the other; once shown as 0.00 and 50.00."""
    a = write_summary(tmp_path / "old", ruler_summary("tiny", 10, {("niah_single_1", 1024): 0.0}, "0.1.0", "abc"))
    b = write_summary(tmp_path / "new", ruler_summary("tiny", 10, {("niah_single_1", 1024): 100.0}, "0.2.0", "def"))
    out = tmp_path / "board.md"
    result = leaderboard(tmp_path / "old", tmp_path / "new", "--out", out)
    assert result.returncode == 2 and not out.exists()
    (line,) = result.stderr.strip().splitlines()
    assert "tiny step 10" in line and str(a) in line and str(b) in line
    assert "0.1.0 (abc)" in line and "0.2.0 (def)" in line and "pass only one" in line


def test_one_checkpoint_twice_is_refused_even_when_identical(tmp_path):
    summary = ruler_summary("tiny", 10, {("niah_single_1", 1024): 50.0})
    write_summary(tmp_path / "one", summary)
    write_summary(tmp_path / "copy" / "nested", summary)
    result = leaderboard(tmp_path / "one", tmp_path / "copy", "--out", tmp_path / "board.md")
    assert result.returncode == 2 and "is in two summaries" in result.stderr
    assert "written by" not in result.stderr  # same version: nothing to point out
    alone = leaderboard(tmp_path, "--out", tmp_path / "b2.md")  # a copy inside one directory: the same
    assert alone.returncode == 2 and "is in two summaries" in alone.stderr


def test_the_same_file_reached_twice_is_read_once(tmp_path):
    write_summary(tmp_path / "r", ruler_summary("tiny", 10, {("niah_single_1", 1024): 50.0}))
    twice = leaderboard(tmp_path / "r", tmp_path / "r" / "tiny", "--out", tmp_path / "twice.md")
    once = leaderboard(tmp_path / "r", "--out", tmp_path / "once.md")
    assert twice.returncode == 0 == once.returncode, twice.stderr
    assert (tmp_path / "twice.md").read_text() == (tmp_path / "once.md").read_text()


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda rows: rows + [dict(rows[0], score=100.0)], "holds niah_single_1 1024 twice"),
        (lambda rows: rows + [dict(rows[0], run="other")], "holds rows of another checkpoint than tiny step 10"),
    ],
)
def test_a_summary_that_scores_a_cell_twice_is_refused(tmp_path, damage, message):
    summary = ruler_summary("tiny", 10, {("niah_single_1", 1024): 0.0, ("vt", 1024): 20.0})
    summary["rows"] = damage(summary["rows"])
    path = write_summary(tmp_path, summary)
    result = leaderboard(tmp_path, "--out", tmp_path / "board.md")
    assert result.returncode == 2 and f"{path} {message}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def table(text: str, title: str) -> list[list[str]]:
    """The body rows of the markdown table under `title`, as cells."""
    section = text.split(title, 1)[1].split("\n\n")[1]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()[2:]]


def test_main_and_per_task_tables_agree(tmp_path):
    # step 10 at 1K: (30 + 60 + 90) / 3 = 60; step 20: (10 + 20 + 0) / 3 = 10 -> 35 ± 25
    # at 2K: (0 + 6 + 0) / 3 = 2 and (0 + 0 + 3) / 3 = 1 -> 1.5 ± 0.5
    scores = {10: {("niah_single_1", 1024): 30, ("vt", 1024): 60, ("fwe", 1024): 90,
                   ("niah_single_1", 2048): 0, ("vt", 2048): 6, ("fwe", 2048): 0},
              20: {("niah_single_1", 1024): 10, ("vt", 1024): 20, ("fwe", 1024): 0,
                   ("niah_single_1", 2048): 0, ("vt", 2048): 0, ("fwe", 2048): 3}}  # fmt: skip
    for step, cells in scores.items():
        write_summary(tmp_path / "r", ruler_summary("tiny", step, cells))
    out = tmp_path / "board.md"
    assert leaderboard(tmp_path / "r", "--out", out).returncode == 0
    text = out.read_text()
    (main,) = table(text, "## RULER (")
    assert main[5:8] == ["35.00 ± 25.00", "1.50 ± 0.50", "18.25"]  # one run: no best to mark
    per_task = {row[1]: row[2:] for row in table(text, "## RULER per task")}
    assert per_task == {"fwe": ["45.00", "1.50"], "niah_single_1": ["20.00", "0.00"], "vt": ["40.00", "3.00"]}
    for column, expected in ((0, 35.0), (1, 1.5)):  # the main value is the mean of the per-task values
        assert sum(float(values[column]) for values in per_task.values()) / 3 == pytest.approx(expected)
