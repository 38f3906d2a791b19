"""General tasks through run_benchmark end to end on the offline fixtures: scores against a computation by hand, the
results layout, --avg, resume, skipped tasks (missing data, requests beyond the window)."""

import json
import shutil
import statistics
from pathlib import Path

import pytest

import evalkit.engines
from evalkit.errors import UserError
from evalkit.general.catalog import TASKS_DIR, offline_hubs
from evalkit.general.tables import general_average_table
from evalkit.models.refs import resolve_checkpoints
from evalkit.sweep.pipeline import run_benchmark

from .conftest import RUN, engine_for, general

MMLU_STYLE = "evalkit_fixture_mmlu_style"
HELLASWAG_STYLE = "evalkit_fixture_hellaswag_style"
SUBJECTS = {"arithmetic": "elementary arithmetic", "english": "simple English", "python": "the Python language"}
FIXTURE_DATA = TASKS_DIR / "evalkit_fixtures"


def fixture_rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURE_DATA / name).read_text().splitlines()]


def value(rows: list[dict], task: str, metric: str = "acc") -> float:
    (row,) = [r for r in rows if r["task"] == task and r["metric"] == metric and r["filter"] == "none"]
    return row["value"]


@pytest.fixture(scope="module")
def scored(tiny_run, tmp_path_factory):
    """Both fixtures on both checkpoints, with --avg: (refs, out, the EvaluationRun)."""
    out = tmp_path_factory.mktemp("general")
    refs = resolve_checkpoints([str(tiny_run)])
    run = run_benchmark(
        general([MMLU_STYLE, HELLASWAG_STYLE], engine_settings={"dtype": "fp32", "batch_size": 8}),
        refs,
        out,
        avg=True,
    )
    return refs, out, run


# ---------------------------------------------------------------------- scores by hand


def mmlu_style_prompt(subject: str, question: dict, shots: list[dict]) -> str:
    """mmlu's format, written out here: description, 5 solved dev questions, then the question."""

    def block(doc: dict) -> str:
        lines = [doc["question"], *(f"{letter}. {choice}" for letter, choice in zip("ABCD", doc["choices"]))]
        return "\n".join(lines) + "\nAnswer:"

    solved = [block(doc) + " " + "ABCD"[doc["answer"]] for doc in shots]
    description = f"The following are multiple choice questions (with answers) about {SUBJECTS[subject]}.\n\n"
    return description + "\n\n".join([*solved, block(question)])


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: values[i])


def test_mmlu_style_matches_five_shot_argmax_by_hand(scored, tiny_run):
    _, _, run = scored
    engine = engine_for(tiny_run / "step-1")
    docs = fixture_rows("mmlu_style.jsonl")
    rows = [r for r in run.rows if r["step"] == 1]
    correct_total, questions_total = 0, 0
    for subject in SUBJECTS:
        shots = [d for d in docs if d["subject"] == subject and d["split"] == "dev"]
        tests = [d for d in docs if d["subject"] == subject and d["split"] == "test"]
        correct = 0
        for doc in tests:
            prompt = mmlu_style_prompt(subject, doc, shots)
            scores = [logprob for logprob, _ in engine.loglikelihood([(prompt, f" {letter}") for letter in "ABCD"])]
            correct += argmax(scores) == doc["answer"]
        assert value(rows, f"{MMLU_STYLE}_{subject}") == pytest.approx(correct / len(tests), abs=1e-9)
        correct_total, questions_total = correct_total + correct, questions_total + len(tests)
    # The group's number is the mean over all questions (weight_by_size), as lm-eval's mmlu group.
    assert value(rows, MMLU_STYLE) == pytest.approx(correct_total / questions_total, abs=1e-9)
    (group_row,) = [r for r in rows if r["task"] == MMLU_STYLE]
    assert group_row["n"] == questions_total == 30 and group_row["num_fewshot"] == 5


def test_hellaswag_style_acc_and_acc_norm_by_hand(scored, tiny_run):
    _, _, run = scored
    engine = engine_for(tiny_run / "step-2")
    docs = [d for d in fixture_rows("hellaswag_style.jsonl") if d["split"] == "validation"]
    acc, acc_norm = [], []
    for doc in docs:
        # hellaswag's query: "<activity>: <ctx_a> <Ctx_b>", then each ending after a space, 0-shot.
        query = f"{doc['activity_label']}: {doc['ctx_a']} {doc['ctx_b'].capitalize()}"
        scores = [logprob for logprob, _ in engine.loglikelihood([(query, " " + ending) for ending in doc["endings"]])]
        gold = int(doc["label"])
        acc.append(argmax(scores) == gold)
        acc_norm.append(argmax([s / len(e) for s, e in zip(scores, doc["endings"])]) == gold)  # per character
    rows = [r for r in run.rows if r["step"] == 2]
    assert value(rows, HELLASWAG_STYLE, "acc") == pytest.approx(statistics.fmean(acc), abs=1e-9)
    assert value(rows, HELLASWAG_STYLE, "acc_norm") == pytest.approx(statistics.fmean(acc_norm), abs=1e-9)
    assert {r["num_fewshot"] for r in rows if r["task"] == HELLASWAG_STYLE} == {0}


# ---------------------------------------------------------------------- layout and averages


def test_results_layout_rows_and_provenance(scored):
    refs, out, run = scored
    assert [(s["run"], s["step"]) for s in run.summaries] == [(RUN, 1), (RUN, 2)] and run.skipped == []
    for ref in refs:
        step_dir = out / RUN / f"step-{ref.step}"
        summary = json.loads((step_dir / "general-summary.json").read_text())
        assert summary["skipped"] == [] and set(summary["tasks"]) == {MMLU_STYLE, HELLASWAG_STYLE}
        for row in summary["rows"]:
            assert set(row) == {
                "run",
                "step",
                "requested",
                "task",
                "metric",
                "filter",
                "value",
                "stderr",
                "n",
                "num_fewshot",
            }
            assert "," not in row["metric"] and row["filter"] == "none"
        assert {r["task"] for r in summary["rows"] if r["requested"] == MMLU_STYLE} == {
            MMLU_STYLE,
            *(f"{MMLU_STYLE}_{s}" for s in SUBJECTS),
        }
        provenance = summary["provenance"]
        assert provenance["engine"]["engine"] == "hf" and provenance["engine"]["dtype"] == "fp32"
        assert provenance["git_hash"] and provenance["evalkit_version"] and provenance["lm_eval_version"]
        assert provenance["settings"]["tasks"] == [MMLU_STYLE, HELLASWAG_STYLE]
        for task in (MMLU_STYLE, HELLASWAG_STYLE):
            record = json.loads((step_dir / "general" / f"{task}.json").read_text())
            lm_eval_json = json.loads((step_dir / "general" / f"{task}.lm_eval.json").read_text())
            assert record["rows"] == [r for r in summary["rows"] if r["requested"] == task]
            assert lm_eval_json["results"][task]  # lm-eval's own result JSON, kept whole
            assert lm_eval_json["config"]["evalkit_engine"]["model_path"] == str(ref.path)
            samples = (step_dir / "general" / f"{task}.samples.jsonl").read_text().splitlines()
            assert len(samples) == 30 and all("prompt_hash" in json.loads(line) for line in samples)


def test_average_over_checkpoints_matches_the_rows(scored):
    _, out, run = scored
    for average in run.averages.records:
        per_checkpoint = [
            r["value"] for r in run.rows if all(r[k] == average[k] for k in ("run", "task", "metric", "filter"))
        ]
        assert average["steps"] == [1, 2] and len(per_checkpoint) == 2
        assert average["mean"] == pytest.approx(statistics.fmean(per_checkpoint))
        assert average["std"] == pytest.approx(statistics.pstdev(per_checkpoint))
    table = (out / "general-avg.md").read_text()
    assert general_average_table(run.averages.records) in table
    for task, metric in ((MMLU_STYLE, "acc"), (HELLASWAG_STYLE, "acc"), (HELLASWAG_STYLE, "acc_norm")):
        values = [value([r for r in run.rows if r["step"] == step], task, metric) for step in (1, 2)]
        line = (
            f"| {RUN} | 1, 2 | {task} | {metric} | {statistics.fmean(values):.4f} ± {statistics.pstdev(values):.4f} |"
        )
        assert line in table
    stored = json.loads((out / "general-avg.json").read_text())["averages"]
    assert stored == run.averages.records


# ---------------------------------------------------------------------- resume


def stamps(out: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(out.glob("*/step-*/general/*"))}


def test_rerun_recomputes_nothing_and_a_missing_task_only(scored, monkeypatch):
    refs, out, run = scored
    before = stamps(out)

    def no_engine(*_args, **_kwargs):
        raise AssertionError("a finished checkpoint must not load its engine")

    monkeypatch.setattr(evalkit.engines, "get_engine", no_engine)
    again = run_benchmark(
        general([MMLU_STYLE, HELLASWAG_STYLE], engine_settings={"dtype": "fp32", "batch_size": 4}),
        refs,
        out,
    )
    assert stamps(out) == before  # another batch size measures the same thing: nothing recomputed
    assert again.rows == run.rows
    assert all(entry["resumed"] for s in again.summaries for entry in s["tasks"].values())

    monkeypatch.undo()
    removed = out / RUN / "step-2" / "general" / f"{HELLASWAG_STYLE}.json"
    removed.unlink()
    resumed = run_benchmark(general([MMLU_STYLE, HELLASWAG_STYLE], engine_settings={"dtype": "fp32"}), refs, out)
    changed = {path for path, stamp in stamps(out).items() if before.get(path) != stamp}
    assert changed == {
        str(removed.with_name(f"{HELLASWAG_STYLE}{suffix}")) for suffix in (".json", ".lm_eval.json", ".samples.jsonl")
    }
    assert resumed.rows == run.rows


def test_other_settings_are_scored_again(scored, tmp_path):
    refs, scored_out, _ = scored
    out = tmp_path / "copy"
    shutil.copytree(scored_out, out)  # the shared results stay as the other tests expect them
    one_shot = run_benchmark(
        general([HELLASWAG_STYLE], num_fewshot=1, limit=4.0, engine_settings={"dtype": "fp32"}),
        refs[:1],
        out,
    )
    (summary,) = one_shot.summaries
    assert summary["tasks"][HELLASWAG_STYLE] == {
        "num_fewshot": 1,
        "fewshot_source": "given",
        "resumed": False,
        "file": f"general/{HELLASWAG_STYLE}.json",
    }
    assert {(r["num_fewshot"], r["n"]) for r in summary["rows"]} == {(1, 4)}
    limit = summary["provenance"]["settings"]["limit"]
    assert limit == 4 and isinstance(limit, int)  # 4.0 from a CLI float means 4 documents


# ---------------------------------------------------------------------- skipped tasks


def write_task(folder: Path, name: str, dataset: str) -> None:
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\n{dataset}\noutput_type: multiple_choice\ntest_split: test\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: answer\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )


def test_missing_data_skips_that_task_with_one_line_and_the_rest_runs(tiny_run, tmp_path, monkeypatch):
    from lm_eval.tasks import TaskManager

    tasks_dir = tmp_path / "user_tasks"
    tasks_dir.mkdir()
    missing_file = tmp_path / "nowhere" / "questions.jsonl"
    local = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {missing_file}"
    write_task(tasks_dir, "local_missing", local)
    write_task(tasks_dir, "hub_missing", "dataset_path: evalkit-tests/no-such-dataset")
    tried = []
    real_load = TaskManager.load
    monkeypatch.setattr(TaskManager, "load", lambda self, names: tried.extend(names) or real_load(self, names))
    refs = resolve_checkpoints([str(tiny_run)])
    with offline_hubs():  # as a user without network who set the switches; the test never reaches out
        run = run_benchmark(
            general(
                ["local_missing", "hub_missing", HELLASWAG_STYLE],
                limit=3,
                include_paths=[tasks_dir],
                engine_settings={"dtype": "fp32"},
            ),
            refs,
            tmp_path / "out",
        )
    assert tried.count("hub_missing") == tried.count("local_missing") == 1  # not retried for the second checkpoint
    for summary in run.summaries:
        reasons = {skip["task"]: skip["reason"] for skip in summary["skipped"]}
        assert set(reasons) == {"local_missing", "hub_missing"}
        assert all("\n" not in reason for reason in reasons.values())
        assert str(missing_file) in reasons["local_missing"]
        assert "evalkit-tests/no-such-dataset" in reasons["hub_missing"]
        assert "HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1" in reasons["hub_missing"]
        assert "load_dataset('evalkit-tests/no-such-dataset')" in reasons["hub_missing"]
        assert {r["requested"] for r in summary["rows"]} == {HELLASWAG_STYLE}
    assert not list((tmp_path / "out").glob("*/*/general/*_missing*"))


def test_requests_beyond_the_window_skip_the_task_with_counts(tiny_run, tmp_path):
    refs = resolve_checkpoints([str(tiny_run / "step-1")])
    run = run_benchmark(
        general([MMLU_STYLE, HELLASWAG_STYLE], limit=2, engine_settings={"dtype": "fp32", "max_length": 64}),
        refs,
        tmp_path,
    )
    (skip,) = run.skipped
    assert skip["task"] == MMLU_STYLE and skip["window"] == 64 and skip["longest"] > 64
    assert skip["requests_over_window"] == skip["requests"] == 3 * 2 * 4  # every 5-shot prompt is too long
    assert "never truncates" in skip["reason"]
    assert {r["requested"] for r in run.rows} == {HELLASWAG_STYLE}  # its 0-shot prompts fit


def test_bad_requests_are_user_errors_before_any_work(tiny_run, tmp_path):
    refs = resolve_checkpoints([str(tiny_run / "step-1")])
    with pytest.raises(UserError, match="--num-fewshot"):
        run_benchmark(general([MMLU_STYLE], num_fewshot=-1), refs, tmp_path)
    with pytest.raises(UserError, match="unknown dtype"):
        run_benchmark(general([MMLU_STYLE], engine_settings={"dtype": "int4"}), refs, tmp_path)
    with pytest.raises(UserError, match="--limit"):
        run_benchmark(general([MMLU_STYLE], limit=0), refs, tmp_path)
    with pytest.raises(UserError, match="unknown engine"):
        run_benchmark(general([MMLU_STYLE], engine="tgi"), refs, tmp_path)
    with pytest.raises(UserError, match="not a directory"):
        run_benchmark(general([MMLU_STYLE], include_paths=[tmp_path / "no-such-folder"]), refs, tmp_path)
    assert not any(tmp_path.iterdir())


def test_the_request_is_checked_once_and_lm_eval_starts_only_after_the_pipelines_checks(tmp_path, monkeypatch):
    """The pipeline's checks run once (no general-only pass runs them ahead); the task
    catalog (lm-eval's start) is made by the benchmark's own check, after them: a request the
    pipeline refuses makes none."""
    import evalkit.general.catalog
    import evalkit.sweep.pipeline
    from tests.sweep.helpers import tiny_refs

    checks, catalogs = [], []
    real_check = evalkit.sweep.pipeline.check_tokenizer  # one call per checkpoint per run of the checks
    monkeypatch.setattr(evalkit.sweep.pipeline, "check_tokenizer", lambda ref: (checks.append(ref), real_check(ref))[1])

    class Catalog:
        def __init__(self, include_paths, names):
            catalogs.append(names)

        def check(self, names):
            pass

        def fewshot(self, name, asked):  # the first unit's plan: far enough
            raise UserError("stopped at the first unit")

    monkeypatch.setattr(evalkit.general.catalog, "TaskCatalog", Catalog)
    refs = tiny_refs()[:1]
    with pytest.raises(UserError, match="stopped at the first unit"):
        run_benchmark(general(["some_task"]), refs, tmp_path / "out")
    assert checks == refs and catalogs == [["some_task"]]

    bare = tmp_path / "bare"
    shutil.copytree(refs[0].path, bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json"):
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(UserError, match="has no tokenizer files"):
        run_benchmark(general(["some_task"]), resolve_checkpoints([str(bare)]), tmp_path / "out2")
    assert catalogs == [["some_task"]]  # refused by the pipeline first: no lm-eval start


@pytest.mark.parametrize(
    "given, message",
    [
        ({"tasks": []}, "no task given"),
        ({"num_fewshot": -1}, "--num-fewshot must be 0 or more, got -1"),
        ({"limit": float("nan")}, "--limit must be a number of documents"),
        ({"limit": 2.5}, "give a whole number of documents"),
        ({"too_long": "all"}, "--too-long must be one of task, documents, middle"),
        ({"too_long": "documents", "limit": 3}, "cannot be combined"),
    ],
)
def test_general_settings_are_validated_where_they_are_made(given, message):
    """One settings dataclass, validated once on construction (as RulerSettings), whoever builds it."""
    from evalkit.general.runner import GeneralSettings

    with pytest.raises(UserError, match=message):
        GeneralSettings(**{"tasks": ["t"], **given})
    limited = GeneralSettings(tasks=["t"], limit=10.0)
    assert limited.limit == 10 and isinstance(limited.limit, int)  # a CLI float of whole documents
