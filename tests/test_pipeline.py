"""The one evaluation pipeline, through a toy benchmark: adding a benchmark is one class.

The toy scores how many characters an engine "generates" per prompt against a hand-written
expectation; its engine is a fake whose opening and closing are recorded, so the tests see
the pipeline's lifecycle (one engine per checkpoint, closed before the next, none for a
checkpoint whose units are all stored), its skip records, summaries, resumption and --avg.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from evalkit.errors import Skipped, UserError
from evalkit.files import atomic_write_json
from evalkit.models.refs import CheckpointRef
from evalkit.store.result_format import ResultRow, read_row, row_record, summary_name
from evalkit.sweep.engine_choice import EngineChoice
from evalkit.sweep.pipeline import Averages, Benchmark, ProgressEvent, Unit, UnitResult, UnitStore, run_benchmark


class FakeEngine:
    def __init__(self, events: list, path: Path, answers: dict[str, str]):
        self.events, self.path, self.answers = events, path, answers
        events.append(("open", path.name))

    def generate(self, prompt: str) -> str:
        self.events.append(("generate", self.path.name, prompt))
        return self.answers[self.path.name]

    def engine_info(self) -> dict:
        return {"engine": "fake", "model_path": str(self.path)}

    def close(self) -> None:
        self.events.append(("close", self.path.name))


@dataclass
class ToySettings:
    tasks: list[str] = field(default_factory=lambda: ["short", "long", "needs-data"])


class ToyBenchmark(Benchmark):
    """Two scored tasks and one that cannot run; a unit's result is stored as <task>.json."""

    name, title = "toy", "Toy benchmark"

    def __init__(self):
        self.settings, self.engine = ToySettings(), EngineChoice("hf", {"batch_size": 2})

    def check(self, refs: list[CheckpointRef]) -> None:
        if any("refused" in ref.run for ref in refs):
            raise UserError("the toy benchmark refuses this run")

    def units(self) -> list[Unit]:
        return [Unit(task) for task in self.settings.tasks]

    def stored(self, unit: Unit, store: UnitStore) -> UnitResult | None:
        path = store.file(".json")
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        return UnitResult([read_row(self.name, row) for row in record["rows"]], None, False, record["engine"])

    def evaluate(self, engine, unit: Unit, store: UnitStore, progress) -> UnitResult:
        if unit.task == "needs-data":
            raise Skipped("needs a data file that is not here", wanted="data.json")
        answer = engine.get().generate(unit.task)
        progress(1, 1)
        row = ResultRow(self.name, store.ref.run, store.ref.step, unit.task, "chars", float(len(answer)))
        record = {"rows": [row_record(row)], "engine": engine.info()}
        atomic_write_json(store.file(".json"), record)
        return UnitResult([row])

    def finish_summary(self, summary: dict, results: list[UnitResult], earlier: dict | None) -> dict:
        return {**summary, "toy_units": len(results)}

    def average(self, rows: list[ResultRow]) -> Averages:
        by_task: dict[str, list[float]] = {}
        for row in rows:
            by_task.setdefault(row.task, []).append(row.value)
        records = [
            {"task": task, "mean": statistics.fmean(v), "std": statistics.pstdev(v)} for task, v in by_task.items()
        ]
        table = "\n".join(f"| {r['task']} | {r['mean']:.1f} ± {r['std']:.1f} |" for r in records)
        return Averages(records, table, "toy conditions")


def make_checkpoint(root: Path, run: str, step: int, tokenizer: bool = True) -> CheckpointRef:
    path = root / run / f"step-{step}"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "meta.json").write_text(json.dumps({"step": step, "paradigm": "anchor"}))
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return CheckpointRef(run, step, path)


@pytest.fixture
def two_checkpoints(tmp_path):
    return [make_checkpoint(tmp_path / "runs", "toy-run", step) for step in (1, 2)]


def opener(events: list, answers: dict[str, str]):
    def open_engine(name, path, **settings):
        assert name == "hf" and settings == {"batch_size": 2}
        return FakeEngine(events, Path(path), answers)

    return open_engine


def test_summaries_skips_and_the_engine_lifecycle(two_checkpoints, tmp_path):
    events, logged, reported = [], [], []
    out = tmp_path / "out"
    answers = {"step-1": "abc", "step-2": "abcdefg"}
    run = run_benchmark(
        ToyBenchmark(), two_checkpoints, out, open_engine=opener(events, answers), log=logged.append,
        progress=reported.append,
    )  # fmt: skip
    # One typed event per report, naming the checkpoint and the unit the benchmark reported on.
    assert reported == [ProgressEvent(ref, Unit(task), 1, 1) for ref in two_checkpoints for task in ("short", "long")]

    # One engine per checkpoint, closed before the next one opens.
    assert [e[:2] for e in events] == [
        ("open", "step-1"), ("generate", "step-1"), ("generate", "step-1"), ("close", "step-1"),
        ("open", "step-2"), ("generate", "step-2"), ("generate", "step-2"), ("close", "step-2"),
    ]  # fmt: skip
    assert [(r["step"], r["task"], r["value"]) for r in run.rows] == [
        (1, "short", 3.0), (1, "long", 3.0), (2, "short", 7.0), (2, "long", 7.0)
    ]  # fmt: skip
    assert run.skipped == [
        {"run": "toy-run", "step": s, "task": "needs-data", "reason": "needs a data file that is not here",
         "wanted": "data.json"} for s in (1, 2)
    ]  # fmt: skip
    assert "skipped needs-data (toy-run step 1): needs a data file that is not here" in logged

    summary = json.loads((out / "toy-run" / "step-2" / summary_name("toy")).read_text())
    assert summary == run.summaries[1]
    assert summary["benchmark"] == "toy" and (summary["run"], summary["step"]) == ("toy-run", 2)
    assert summary["toy_units"] == 2  # the benchmark's own field
    provenance = summary["provenance"]
    assert provenance["engine"] == {"engine": "fake", "model_path": str(two_checkpoints[1].path)}
    assert provenance["settings"] == {"tasks": ["short", "long", "needs-data"]}
    assert provenance["checkpoint_meta"]["paradigm"] == "anchor"
    assert provenance["git_hash"] and provenance["created"]
    assert not (out / "toy-avg.json").exists()  # no --avg asked


def test_a_rerun_builds_no_engine_and_keeps_the_stamp_of_the_scores(two_checkpoints, tmp_path):
    out = tmp_path / "out"
    first = run_benchmark(ToyBenchmark(), two_checkpoints, out, open_engine=opener([], {"step-1": "a", "step-2": "b"}))

    def no_engine(*_args, **_kwargs):
        raise AssertionError("a checkpoint whose units are all stored must not build its engine")

    logged = []
    again = run_benchmark(ToyBenchmark(), two_checkpoints, out, open_engine=no_engine, log=logged.append)
    assert again.rows == first.rows
    for before, after in zip(first.summaries, again.summaries):
        # Read back, not computed: the engine and the stamp are those of the run that scored them.
        assert after["provenance"]["engine"] == before["provenance"]["engine"]
        assert after["provenance"]["created"] == before["provenance"]["created"]
    assert "short: already scored with these settings, kept" in logged


def test_avg_writes_one_json_and_one_markdown_for_any_benchmark(two_checkpoints, tmp_path):
    out = tmp_path / "out"
    run = run_benchmark(
        ToyBenchmark(), two_checkpoints, out, avg=True, open_engine=opener([], {"step-1": "abc", "step-2": "abcdefg"})
    )
    # By hand: lengths 3 and 7 over the two checkpoints: mean 5, population std 2.
    assert run.averages.records == [
        {"task": "short", "mean": 5.0, "std": 2.0},
        {"task": "long", "mean": 5.0, "std": 2.0},
    ]
    stored = json.loads((out / "toy-avg.json").read_text())
    assert stored["benchmark"] == "toy" and stored["averages"] == run.averages.records
    assert stored["provenance"]["settings"] == {"tasks": ["short", "long", "needs-data"]}
    markdown = (out / "toy-avg.md").read_text()
    assert markdown.startswith("# Toy benchmark, averaged over checkpoints")
    assert "toy conditions" in markdown and "| short | 5.0 ± 2.0 |" in markdown
    assert run.files == {"averages_json": out / "toy-avg.json", "averages_markdown": out / "toy-avg.md"}


def test_a_failing_unit_still_closes_the_engine(two_checkpoints, tmp_path):
    events = []

    class Failing(ToyBenchmark):
        def evaluate(self, engine, unit, store, progress):
            engine.get()
            raise RuntimeError("a unit failed")

    # Each checkpoint's failure is recorded and the sweep goes on; the error comes at the end.
    with pytest.raises(UserError, match="2 of 2 checkpoints failed .*RuntimeError: a unit failed"):
        run_benchmark(Failing(), two_checkpoints, tmp_path / "out", open_engine=opener(events, {}))
    assert events == [("open", "step-1"), ("close", "step-1"), ("open", "step-2"), ("close", "step-2")]


@pytest.mark.parametrize(
    "change, message",
    [
        ("no-tokenizer", "has no tokenizer files"),
        ("refused-run", "the toy benchmark refuses this run"),
        ("engine", "unknown engine 'gguf'; choose one of: hf, vllm"),
        ("batch", "--batch-size must be at least 1, got 0"),
        ("no-checkpoint", "no checkpoint given: pass --ckpts PATH"),
    ],
)
def test_a_refused_request_builds_nothing_and_writes_nothing(change, message, two_checkpoints, tmp_path):
    benchmark, refs = ToyBenchmark(), list(two_checkpoints)
    if change == "no-tokenizer":
        refs.append(make_checkpoint(tmp_path / "runs", "bare", 3, tokenizer=False))
    elif change == "refused-run":
        refs.append(make_checkpoint(tmp_path / "runs", "refused", 3))
    elif change == "engine":
        benchmark.engine = EngineChoice("gguf", {})
    elif change == "batch":
        benchmark.engine = EngineChoice("hf", {"batch_size": 0})
    else:
        refs = []

    def no_engine(*_args, **_kwargs):
        raise AssertionError("a refused request must not build an engine")

    out = tmp_path / "out"
    with pytest.raises(UserError, match=message):
        run_benchmark(benchmark, refs, out, open_engine=no_engine)
    assert not out.exists()  # the checks come before the output lock and any result


def test_a_new_benchmark_reaches_the_leaderboard_through_the_one_schema(two_checkpoints, tmp_path):
    from evalkit.results.leaderboard import build_markdown

    out = tmp_path / "out"
    run_benchmark(ToyBenchmark(), two_checkpoints, out, open_engine=opener([], {"step-1": "abc", "step-2": "abcdefg"}))
    markdown, ruler, general = build_markdown([out])
    assert ruler == [] and general == []
    # Its own section, with the title its summaries record, one column per task/metric:
    # the mean over the two checkpoints, (3 + 7) / 2 = 5, and what the run was evaluated on.
    assert "## Toy benchmark (mean over checkpoints)\n" in markdown  # its rows hold no stderr: the heading says none
    assert "| run | paradigm | model | training data | long chars | short chars |" in markdown
    assert "| toy-run | anchor | ? | ? | 5.0000 | 5.0000 |" in markdown
    assert "- toy toy-run: engine fake" in markdown


def test_stored_summaries_of_every_benchmark_read_as_one_schema():
    from evalkit.store.result_format import summary_rows

    meta = {"paradigm": "anchor", "config": {"model": {"arch": "llama", "num_layers": 4, "hidden_size": 256},
                                             "data": {"source": "builtin"}}}  # fmt: skip
    cell = {"run": "r", "step": 2, "length": 1024, "n": 20}
    ruler = {
        "benchmark": "ruler",
        "run": "r",
        "step": 2,
        "rows": [
            {**cell, "task": "niah_single_1", "metric": "string_match_all", "value": 90.0, "stderr": 6.9},
            {**cell, "task": "qa_1", "metric": "string_match_part", "value": 40.0, "stderr": 1.0},
        ],
        "provenance": {"checkpoint_meta": meta},
    }
    general = {
        "benchmark": "general",
        "run": "r",
        "step": 2,
        "rows": [{"run": "r", "step": 2, "requested": "mmlu", "task": "mmlu_anatomy", "metric": "acc",
                  "filter": "none", "value": 0.25, "stderr": None, "n": 135, "num_fewshot": 5}],
        "provenance": {"checkpoint_meta": {"model": "SmolLM2", "source": {"file_type": "MOSTLY_Q4_1"}}},
    }  # fmt: skip
    described = {"paradigm": "anchor", "model": "llama 4x256", "data": "builtin"}
    assert summary_rows(ruler) == [
        ResultRow("ruler", "r", 2, "niah_single_1", "string_match_all", 90.0, 6.9, 20, 1024, "standard", **described),
        ResultRow("ruler", "r", 2, "qa_1", "string_match_part", 40.0, 1.0, 20, 1024, "standard", **described),
    ]
    assert summary_rows(general) == [
        ResultRow("general", "r", 2, "mmlu_anatomy", "acc", 0.25, None, 135, requested="mmlu", filter="none",
                  num_fewshot=5, paradigm="pretrained", model="SmolLM2", data="MOSTLY_Q4_1 import")
    ]  # fmt: skip


def test_the_repositorys_stored_summaries_still_load():
    """Every summary under results/ (written by earlier versions, migrated once) reads into the schema."""
    from evalkit.store.result_format import summary_rows

    root = Path(__file__).resolve().parents[1] / "results"
    paths = sorted(root.rglob("*-summary.json"))
    assert paths, "results/ holds stored summaries"
    for path in paths:
        summary = json.loads(path.read_text())
        rows = summary_rows(summary)
        assert len(rows) == len(summary["rows"]) and all(row.run == summary["run"] for row in rows)
        assert all(row.metric and (row.value is None or isinstance(row.value, float)) for row in rows)


def test_rows_written_now_read_back_as_the_rows_the_benchmark_made():
    """row_record (what a summary stores) and read_row (the one reader) are inverses for this
    version's rows, RULER's anchor-encoded cells and lm-eval's rows alike, every number stored as
    `value`."""
    from evalkit.store.result_format import SCHEMA_VERSION, export_record, summary_rows

    made = [
        ResultRow("ruler", "r", 2, "qa_1", "string_match_part", 40.0, 1.0, 20, length=1024, encoding="standard"),
        ResultRow("ruler", "r", 2, "vt", "string_match_all", 5.0, 2.0, 20, length=1024, encoding="anchor",
                  doc_tokens=128, documents=7.5),
        ResultRow("general", "r", 2, "mmlu_anatomy", "acc", 0.25, None, 135, requested="mmlu", filter="none",
                  num_fewshot=5),
        ResultRow("toy", "r", 2, "short", "chars", 3.0),
    ]  # fmt: skip
    records = [row_record(row) for row in made]
    assert records[0] == {"run": "r", "step": 2, "task": "qa_1", "metric": "string_match_part", "length": 1024,
                          "value": 40.0, "stderr": 1.0, "n": 20}  # fmt: skip
    assert [record["value"] for record in records] == [40.0, 5.0, 0.25, 3.0]
    assert records[1]["encoding"] == "anchor" and records[1]["doc_tokens"] == 128 and records[1]["documents"] == 7.5
    assert [read_row(row.benchmark, record) for row, record in zip(made, records)] == made
    summary = {"schema_version": SCHEMA_VERSION, "benchmark": "ruler", "run": "r", "step": 2, "rows": records[:2]}
    assert summary_rows(summary) == made[:2]
    assert made[1].series() == "r [anchor, 128-token docs]" and made[0].series() == "r"
    assert export_record(made[1])["encoding"] == "anchor-128" and "doc_tokens" not in export_record(made[1])


def test_finish_summary_returns_a_new_summary_and_leaves_the_pipelines_as_it_was():
    """RULER's and lm-eval's own summary fields come in a new dict; the argument is not touched."""
    import copy

    from evalkit.general.runner import GeneralBenchmark, GeneralSettings
    from evalkit.ruler.runner import RulerBenchmark, RulerSettings

    def made(benchmark: str) -> dict:
        settings = {"tasks": ["niah_single_1"], "lengths": [1024]}
        return {"benchmark": benchmark, "run": "r", "step": 1, "checkpoint": "/c", "rows": [], "skipped": [],
                "provenance": {"settings": settings, "engine": None}}  # fmt: skip

    ruler_row = ResultRow("ruler", "r", 1, "niah_single_1", "string_match_all", 50.0, 1.0, 2, 1024, "standard")
    ruler = RulerBenchmark(RulerSettings(tasks=["niah_single_1"], lengths=[1024]))
    summary = made("ruler")
    summary["rows"] = [row_record(ruler_row)]
    before = copy.deepcopy(summary)
    finished = ruler.finish_summary(summary, [UnitResult([ruler_row], "key-1")], None)
    assert summary == before
    assert finished["provenance"]["data_keys"] == {"niah_single_1@1024": "key-1"}

    entry = {"num_fewshot": 0, "fewshot_source": "given", "file": "general/t.json", "resumed": True}
    general = GeneralBenchmark(GeneralSettings(tasks=["t"]))
    summary = made("general")
    before = copy.deepcopy(summary)
    finished = general.finish_summary(summary, [UnitResult([], ("t", entry))], None)  # a unit's (task, entry)
    assert summary == before
    assert list(finished)[-2:] == ["tasks", "provenance"]  # the order the summaries have always had
    assert finished["tasks"] == {"t": {"num_fewshot": 0, "fewshot_source": "given", "file": "general/t.json",
                                       "resumed": True}}  # fmt: skip
    assert finished["provenance"]["lm_eval_version"]


def test_a_benchmark_missing_a_required_method_cannot_be_built():
    class NoAverage(Benchmark):
        def units(self):
            return []

        def evaluate(self, engine, unit, store, progress):
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="average"):
        NoAverage()


def test_the_unit_store_names_the_files_every_earlier_run_wrote(tmp_path):
    """The layouts RULER and lm-eval tasks wrote before the pipeline owned them, written out by hand:
    a rerun finds every stored sample log and task record where it always was."""
    ref = CheckpointRef("run-a", 600, tmp_path / "ckpt")
    ruler = UnitStore(tmp_path, ref, "ruler", Unit("niah_single_1", 4096))
    assert ruler.file(".jsonl") == tmp_path / "run-a" / "step-600" / "ruler" / "niah_single_1" / "4096.jsonl"
    assert ruler.file(".anchor-128.jsonl").name == "4096.anchor-128.jsonl"
    general = UnitStore(tmp_path, ref, "general", Unit("mmlu/abstract algebra"))
    assert (
        general.file(".lm_eval.json")
        == tmp_path / "run-a" / "step-600" / "general" / "mmlu_abstract_algebra.lm_eval.json"
    )


class CachingToy(ToyBenchmark):
    transient = ("_cache",)

    def __init__(self):
        super().__init__()
        self._cache = {"tokenizer": lambda: None}  # what pickle refuses: it must not travel


def test_the_base_class_declares_what_an_executor_reads():
    """unit_cost, log and pickling are the base class's: a benchmark that says nothing weighs 1 per
    unit, logs nowhere, and a pickled copy carries its `transient` caches empty, the rest as is."""
    import pickle

    toy = CachingToy()
    assert [toy.unit_cost(unit) for unit in toy.units()] == [1.0, 1.0, 1.0]
    assert toy.log("a note") is None
    copy = pickle.loads(pickle.dumps(toy))
    assert copy._cache == {} and toy._cache != {}
    assert copy.settings == toy.settings and copy.engine == toy.engine
