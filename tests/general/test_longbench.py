"""LongBench through `evalkit general`, on the offline LongBench-style fixtures.

The fixtures must run what `--tasks longbench_<task>` runs: lm-eval's own prompt, generation
settings and metric for that task (read here through lm-eval's own YAML loader). The scores
are checked against values computed by hand from scripted answers: the engine's generation is
replaced by one that answers each document with a chosen text, so every metric (F1, ROUGE-L,
counting, edit similarity, classification) is exercised at values other than 0.
"""

import json
from contextlib import contextmanager
from importlib.resources import files

import pytest

pytest.importorskip("rouge", reason="LongBench's metrics need evalkit[longbench] (jieba, fuzzywuzzy, rouge)")

from lm_eval.tasks._yaml_loader import load_yaml  # noqa: E402
from lm_eval.utils import apply_template  # noqa: E402

from evalkit.general.catalog import TASKS_DIR  # noqa: E402
from evalkit.models.refs import resolve_checkpoints  # noqa: E402
from evalkit.sweep.pipeline import run_benchmark  # noqa: E402
from tests.general.conftest import general  # noqa: E402

FIXTURES = TASKS_DIR / "evalkit_fixtures"
GROUP = "evalkit_fixture_longbench"
TASKS = ("hotpotqa", "gov_report", "passage_count", "lcc", "trec")
METRIC = {
    "hotpotqa": "qa_f1_score",
    "gov_report": "rouge_score",
    "passage_count": "count_score",
    "lcc": "code_sim_score",
    "trec": "classification_score",
}


def docs(task: str) -> list[dict]:
    rows = [json.loads(line) for line in (FIXTURES / "longbench_style.jsonl").read_text().splitlines()]
    return [row for row in rows if row["subject"] == task]


def lm_eval_task_file(task: str) -> dict:
    return load_yaml(files("lm_eval.tasks") / "longbench" / f"{task}.yaml", resolve_func=False, recursive=False)


def fixture_file(task: str) -> dict:
    return load_yaml(FIXTURES / f"evalkit_fixture_longbench_{task}.yaml", resolve_func=False, recursive=False)


@pytest.mark.parametrize("task", TASKS)
def test_each_fixture_runs_lm_evals_settings_and_metric_for_its_task(task):
    real, fixture = lm_eval_task_file(task), fixture_file(task)
    for key in ("max_gen_toks", "until"):
        assert fixture["generation_kwargs"][key] == real["generation_kwargs"][key], key
    assert str(fixture["process_results"]).endswith(f"longbench.metrics.{str(real['process_results']).split('.')[-1]}")
    assert [m["metric"] for m in fixture["metric_list"]] == [m["metric"] for m in real["metric_list"]]
    assert fixture.get("target_delimiter", " ") == real.get("target_delimiter", " ")


# Scripted answers per document (found by a phrase only its prompt holds), each one's score by hand:
# hotpotqa, F1 over normalised words: "in 1642" vs "1642" is P 1/2, R 1, F1 2/3; "Mill Road" vs
# "Mill Street" (or "Mill St") 1/2. passage_count: the share of numbers in the answer that are the
# count. trec: 1 / the number of classes named, if the right one is among them. lcc: fuzz ratio
# of the first code line, 1 when equal, 0 when empty. gov_report: ROUGE-L F, 1 for the reference
# itself, 0 for an empty summary.
ANSWERS = {
    "hotpotqa": [
        ("Harbour Lantern", "Kellsby", 1.0),
        ("river Odel", "in 1642", 2 / 3),
        ("Grey Orchard", "Mill Road", 0.5),
    ],
    "passage_count": [
        ("Paragraph 3: The meadow", "3", 1.0),
        ("Paragraph 1: Snow closed", "It is 3 or 2", 0.5),
        ("Paragraph 6: The old mill", "5", 1.0),
    ],
    "trec": [
        ("spring fair", "Location", 1.0),
        ("moons", "Number", 1.0),
        ("founded the library", "Person or Location", 0.5),
    ],
    "lcc": [
        ("def area", "    return width * height", 1.0),
        ("class Counter", "        self.count += 1", 1.0),
        ("import json", "", 0.0),
    ],
    "gov_report": [
        ("water supply", docs("gov_report")[0]["answers"][0], 1.0),
        ("inspectors", "", 0.0),
        ("old computer systems", "", 0.0),
    ],
}


@contextmanager
def scripted_answers():
    """The hf engine answering each fixture document with its scripted answer; yields what it was asked."""
    from evalkit.engines.hf import HFEngine

    seen: dict[str, list[tuple[str, int]]] = {}

    def scripted(self, prompts, max_new_tokens, stop):
        outputs = []
        for ids in prompts:
            prompt = self.tokenizer.decode(ids, skip_special_tokens=True)
            matches = [(t, a) for t, rows in ANSWERS.items() for phrase, a, _ in rows if phrase in prompt]
            assert len(matches) == 1, f"{len(matches)} scripted answers match the prompt {prompt[:80]!r}"
            (task, answer) = matches[0]
            seen.setdefault(task, []).append((prompt, max_new_tokens))
            outputs.append(answer)
        return outputs

    patch = pytest.MonkeyPatch()
    patch.setattr(HFEngine, "_generate_tokens", scripted)
    try:
        yield seen
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def scored(tiny_run, tmp_path_factory):
    """The group on one checkpoint with scripted answers: (EvaluationRun, {task: [(prompt, max_new_tokens)]})."""
    with scripted_answers() as seen:
        refs = resolve_checkpoints([str(tiny_run / "step-1")])
        run = run_benchmark(
            general([GROUP], engine_settings={"dtype": "fp32"}),
            refs,
            tmp_path_factory.mktemp("longbench"),
        )
    return run, seen


def value(rows, task, metric):
    (row,) = [r for r in rows if r["task"] == task and r["metric"] == metric]
    return row["value"]


@pytest.mark.parametrize("task", TASKS)
def test_scores_equal_lm_evals_longbench_metrics_by_hand(scored, task):
    run, _ = scored
    expected = sum(score for _, _, score in ANSWERS[task]) / len(ANSWERS[task])
    name = f"evalkit_fixture_longbench_{task}"
    assert value(run.rows, name, METRIC[task]) == pytest.approx(expected, abs=1e-6)
    assert value(run.rows, name, "score") == pytest.approx(expected, abs=1e-6)


def test_the_group_score_is_the_unweighted_mean_of_its_tasks(scored):
    run, _ = scored
    means = [sum(s for _, _, s in ANSWERS[task]) / len(ANSWERS[task]) for task in TASKS]
    assert value(run.rows, GROUP, "score") == pytest.approx(sum(means) / len(means), abs=1e-6)


@pytest.mark.parametrize("task", TASKS)
def test_prompts_are_lm_evals_longbench_template_and_budget(scored, task):
    _, seen = scored
    real = lm_eval_task_file(task)
    expected = sorted(apply_template(real["doc_to_text"], doc) for doc in docs(task))
    assert sorted(prompt for prompt, _ in seen[task]) == expected
    assert {budget for _, budget in seen[task]} == {real["generation_kwargs"]["max_gen_toks"]}


def test_documents_over_the_window_are_left_out_and_counted_or_skip_the_task(tiny_run, tmp_path):
    """passage_count's three documents need different lengths; a window between the two longest
    leaves out the longest: --too-long task skips the task, documents scores the other two."""
    from transformers import AutoTokenizer

    task = "evalkit_fixture_longbench_passage_count"
    tokenizer = AutoTokenizer.from_pretrained(tiny_run / "step-1")
    real = lm_eval_task_file("passage_count")
    budget = real["generation_kwargs"]["max_gen_toks"]
    needed = [
        len(tokenizer(apply_template(real["doc_to_text"], d))["input_ids"]) + budget for d in docs("passage_count")
    ]
    assert len(set(needed)) == 3
    window = sorted(needed)[1]
    scores = [score for _, _, score in ANSWERS["passage_count"]]
    expected = sum(s for s, n in zip(scores, needed) if n <= window) / 2
    refs = resolve_checkpoints([str(tiny_run / "step-1")])
    settings = {"dtype": "fp32", "max_length": window}
    with scripted_answers():
        whole = run_benchmark(general([task], engine_settings=settings), refs, tmp_path / "task")
        parts = run_benchmark(
            general([task], engine_settings=settings, too_long="documents"),
            refs,
            tmp_path / "documents",
        )
    assert whole.rows == [] and whole.skipped[0]["requests_over_window"] == 1
    assert value(parts.rows, task, "count_score") == pytest.approx(expected, abs=1e-9)
    assert {row["n"] for row in parts.rows if row["task"] == task} == {2}
    summary = json.loads(next((tmp_path / "documents").rglob("general-summary.json")).read_text())
    assert summary["tasks"][task]["over_window"] == {
        task: {"documents_over_window": 1, "documents": 3, "window": window}
    }


def test_middle_truncation_keeps_both_ends_of_what_fits_and_counts_the_cut(tiny_run, tmp_path):
    """--too-long middle: LongBench's own truncation, asked for explicitly. The one document over
    the window is fed as the first and last halves of the tokens that fit beside the budget;
    the others are fed whole; the record counts the cut."""
    from transformers import AutoTokenizer

    from evalkit.engines.hf import HFEngine

    task = "evalkit_fixture_longbench_passage_count"
    tokenizer = AutoTokenizer.from_pretrained(tiny_run / "step-1")
    real = lm_eval_task_file("passage_count")
    budget = real["generation_kwargs"]["max_gen_toks"]
    prompts = [tokenizer(apply_template(real["doc_to_text"], d))["input_ids"] for d in docs("passage_count")]
    window = sorted(len(ids) + budget for ids in prompts)[1]  # the longest does not fit
    room = window - budget
    fed = []
    real_generate = HFEngine._generate_tokens

    def recording(self, batch, max_new_tokens, stop):
        fed.extend(list(ids) for ids in batch)
        return real_generate(self, batch, max_new_tokens, stop)

    refs = resolve_checkpoints([str(tiny_run / "step-1")])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(HFEngine, "_generate_tokens", recording)
        run = run_benchmark(
            general([task], engine_settings={"dtype": "fp32", "max_length": window}, too_long="middle"),
            refs,
            tmp_path,
        )
    longest = max(prompts, key=len)
    expected = longest[: room // 2] + longest[len(longest) - (room - room // 2) :]  # by hand: both ends
    assert sorted(fed, key=len) == sorted([p for p in prompts if p is not longest] + [expected], key=len)
    assert {row["n"] for row in run.rows if row["task"] == task} == {3}  # every document scored
    summary = json.loads(next(tmp_path.rglob("general-summary.json")).read_text())
    assert summary["tasks"][task]["truncated_middle"] == {
        task: {"documents_truncated": 1, "documents": 3, "window": window}
    }


def test_too_long_documents_refuses_a_limit(tiny_run, tmp_path):
    from evalkit.errors import UserError

    refs = resolve_checkpoints([str(tiny_run / "step-1")])
    with pytest.raises(UserError, match="--too-long documents and --limit cannot be combined"):
        run_benchmark(general([GROUP], limit=2, too_long="documents"), refs, tmp_path)
    with pytest.raises(UserError, match="--too-long must be one of task, documents, middle"):
        run_benchmark(general([GROUP], too_long="truncate"), refs, tmp_path)
