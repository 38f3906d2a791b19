"""LongBench-E per bucket and BABILong per length through `evalkit general`, on their offline fixtures and the
shipped tiny checkpoints: each length's row against a recomputation from the logged samples (LongBench's own
bucket rule, written here from THUDM/LongBench eval.py), per-length storage and resume, --avg, compare and the
leaderboard per length (RULER's per-length average untouched), and a real task whose data is absent as one line.

The engine's generation is scripted (as in test_longbench.py) so that the buckets and lengths score apart."""

import json
import shutil
import statistics
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path

import pytest

pytest.importorskip("rouge", reason="LongBench's metrics need evalkit[longbench] (jieba, fuzzywuzzy, rouge)")

from lm_eval.tasks._yaml_loader import load_yaml  # noqa: E402

import evalkit.engines  # noqa: E402
from evalkit.errors import UserError  # noqa: E402
from evalkit.general.catalog import TASKS_DIR, offline_hubs  # noqa: E402
from evalkit.general.runner import GeneralSettings  # noqa: E402
from evalkit.sweep.pipeline import run_benchmark  # noqa: E402
from tests.general.conftest import general  # noqa: E402
from tests.helpers import run_cli  # noqa: E402
from tests.sweep.helpers import SHIPPED_FULL, tiny_refs, tiny_settings  # noqa: E402

LONGBENCH_E = "evalkit_fixture_longbench_e"
BABILONG = "evalkit_fixture_babilong"
RUN = SHIPPED_FULL.name
FIXTURES = TASKS_DIR / "evalkit_fixtures"

# Scripted answers, found by a phrase of the document's prompt, with their qa F1 by hand (LongBench's
# normalisation drops articles): buckets 0-4k (1 + 0) / 2, 4-8k (2/3 + 1) / 2, 8k+ (1 + 1) / 2.
LONGBENCH_E_ANSWERS = {
    "Copper Bell": "Ashcombe",
    "barque Wren": "a farm",
    "Saltmere": "in 1830",
    "Morning at Lisk": "Quay Street",
    "Fennick": "Evening Tide",
    "Mount Carra": "Pellow",
}
BUCKETS_BY_HAND = {0: 0.5, 4000: (2 / 3 + 1) / 2, 8000: 1.0}
# BABILong: the 0k documents answered right for Mary and Daniel, the 1k ones (with distractor text) for Mary only.
BABILONG_BY_HAND = {0: 2 / 3, 1024: 1 / 3}
LOCATIONS = {"Mary": "bathroom", "Daniel": "garden", "Sandra": "kitchen"}


def babilong_answer(prompt: str) -> str:
    person = prompt.rstrip().splitlines()[-1].removeprefix("Where is ").rstrip("?")
    right = person == "Mary" or (person == "Daniel" and "grey fields" not in prompt)
    return f"The most recent location of {person} is {LOCATIONS[person] if right else 'nowhere'}."


@contextmanager
def scripted_answers():
    from evalkit.engines.hf import HFEngine

    def scripted(self, prompts, max_new_tokens, stop):
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in prompts]
        found = [[a for phrase, a in LONGBENCH_E_ANSWERS.items() if phrase in text] for text in texts]
        return [answers[0] if answers else babilong_answer(text) for answers, text in zip(found, texts)]

    patch = pytest.MonkeyPatch()
    patch.setattr(HFEngine, "_generate_tokens", scripted)
    try:
        yield
    finally:
        patch.undo()


def longbench_bucket(words: int) -> int:
    """THUDM/LongBench eval.py scorer_e: "0-4k" if length < 4000, "4-8k" if < 8000, else "8k+" (lower bounds)."""
    return 0 if words < 4000 else 4000 if words < 8000 else 8000


def babilong_general(**settings):
    return general([LONGBENCH_E, BABILONG], babilong_lengths=["0k", "1k", "2k"], **settings)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """Both fixtures on the two shipped checkpoints with --avg, BABILong at 0k, 1k and 2k (absent from its
    data), and RULER into the same --out: (out, the general EvaluationRun)."""
    out = tmp_path_factory.mktemp("lengths")
    with scripted_answers():
        run = run_benchmark(babilong_general(), tiny_refs(), out, avg=True)
    from evalkit.ruler.runner import RulerBenchmark

    run_benchmark(RulerBenchmark(tiny_settings(samples=2, tasks=["niah_single_1"])), tiny_refs(), out)
    return out, run


def logged(out: Path, step: int, name: str) -> list[dict]:
    path = out / RUN / f"step-{step}" / "general" / name
    return [json.loads(line) for line in path.read_text().splitlines()]


def rows_of(run, task: str, step: int) -> dict[tuple[str, int | None], dict]:
    return {(r["metric"], r.get("length")): r for r in run.rows if r["task"] == task and r["step"] == step}


def steps(run) -> list[int]:
    return sorted({r["step"] for r in run.rows})


def test_longbench_e_buckets_are_the_means_of_their_logged_samples(scored):
    out, run = scored
    for step in steps(run):
        samples = logged(out, step, f"{LONGBENCH_E}.samples.jsonl")
        rows = rows_of(run, LONGBENCH_E, step)
        for metric in ("score", "qa_f1_score"):
            by_bucket: dict[int, list[float]] = {}
            for sample in samples:
                by_bucket.setdefault(longbench_bucket(sample["doc"]["length"]), []).append(sample["metrics"][metric])
            assert sorted(by_bucket) == [0, 4000, 8000]
            for bucket, values in by_bucket.items():
                row = rows[(metric, bucket)]
                assert row["value"] == pytest.approx(statistics.fmean(values), abs=1e-12)
                assert row["value"] == pytest.approx(BUCKETS_BY_HAND[bucket], abs=1e-9)
                assert row["n"] == len(values) == 2
                assert row["stderr"] == pytest.approx(statistics.stdev(values) / len(values) ** 0.5)
            every = [v for values in by_bucket.values() for v in values]
            assert rows[(metric, None)]["value"] == pytest.approx(statistics.fmean(every))  # lm-eval's own row


def test_babilong_rows_per_length_are_the_means_of_their_logged_samples_and_a_missing_length_is_one_line(scored):
    out, run = scored
    for summary in run.summaries:
        step = summary["step"]
        for length, expected in BABILONG_BY_HAND.items():
            samples = logged(out, step, f"{BABILONG}/{length}.samples.jsonl")
            (row,) = [r for r in summary["rows"] if r["task"] == BABILONG and r["length"] == length]
            assert row["value"] == pytest.approx(statistics.fmean(s["metrics"]["acc"] for s in samples))
            assert row["value"] == pytest.approx(expected) and row["n"] == 3 and row["num_fewshot"] == 2
            # the length reached the loader: only the 1k documents carry the distractor text
            assert all(("grey fields" in s["doc"]["input"]) == (length == 1024) for s in samples)
        (skip,) = summary["skipped"]
        assert (skip["task"], skip["length"]) == (BABILONG, 2048) and "\n" not in skip["reason"]
        assert "no documents of length 2k" in skip["reason"]
        assert set(summary["tasks"]) == {LONGBENCH_E, f"{BABILONG} @ 0k", f"{BABILONG} @ 1k"}


def test_avg_averages_each_length_over_the_checkpoints(scored):
    out, run = scored
    averages = run.averages.records
    for task, metric, length in [(BABILONG, "acc", 0), (BABILONG, "acc", 1024), (LONGBENCH_E, "score", 4000)]:
        (average,) = [a for a in averages if (a["task"], a["metric"], a["length"]) == (task, metric, length)]
        values = [r["value"] for r in run.rows if (r["task"], r["metric"], r.get("length")) == (task, metric, length)]
        assert average["steps"] == steps(run) and average["mean"] == pytest.approx(statistics.fmean(values))
    table = (out / "general-avg.md").read_text()
    assert f"| {RUN} | 550, 600 | {BABILONG} | 1K | acc | {1 / 3:.4f} ± 0.0000 | 2 |" in table
    assert f"| {RUN} | 550, 600 | {LONGBENCH_E} | 4-8k words | score | {5 / 6:.4f} ± 0.0000 | 0 |" in table


def test_the_leaderboard_shows_each_length_and_ruler_averages_only_ruler(scored, tmp_path):
    out, run = scored
    assert run_cli(["leaderboard", str(out), "--out", str(tmp_path / "lb.md")]) == 0
    board = (tmp_path / "lb.md").read_text()
    general_section = board[board.index("## General tasks") :]
    header, _, values = general_section.splitlines()[2:5]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in values.split("|")]))
    assert cells[f"{BABILONG} acc @ 0K"].startswith(f"{2 / 3:.4f}")
    assert cells[f"{BABILONG} acc @ 1K"].startswith(f"{1 / 3:.4f}")
    for bucket, label in ((0, "0-4k"), (4000, "4-8k"), (8000, "8k+")):
        assert cells[f"{LONGBENCH_E} score @ {label} words"].startswith(f"{BUCKETS_BY_HAND[bucket]:.4f}")
    # RULER's 1K cell: the mean over its own rows only, though BABILong also has rows at 1024
    ruler = [json.loads(p.read_text()) for p in sorted(out.glob("*/step-*/ruler-summary.json"))]
    ruler_mean = statistics.fmean(row["value"] for summary in ruler for row in summary["rows"])
    ruler_section = board[board.index("## RULER") : board.index("## General tasks")]
    assert f"| {ruler_mean:.2f} ± " in ruler_section


def test_compare_differs_each_length_and_bucket(scored, tmp_path):
    out, _ = scored
    other = tmp_path / "other"
    shutil.copytree(out, other)
    assert run_cli(["compare", f"a={out}", f"b={other}", "--baseline", "a", "--out", str(tmp_path / "c")]) == 0
    found = json.loads((tmp_path / "c" / "compare.json").read_text())["differences"]
    general = {(d["task"], d["metric"], d["length"]): d["baseline_value"] for d in found if d["benchmark"] == "general"}
    for length, expected in BABILONG_BY_HAND.items():
        assert general[(BABILONG, "acc", length)] == pytest.approx(expected)
    for bucket, expected in BUCKETS_BY_HAND.items():
        assert general[(LONGBENCH_E, "qa_f1_score", bucket)] == pytest.approx(expected)
    assert "| 4-8k words |" in (tmp_path / "c" / "compare.md").read_text()


def test_each_length_is_stored_and_resumed_apart(scored, tmp_path, monkeypatch):
    source, run = scored
    out = tmp_path / "copy"
    shutil.copytree(source, out)
    one_length = out / RUN / "step-600" / "general" / BABILONG / "1024.json"
    one_length.unlink()  # as a run killed after its first length
    before = {p: p.stat().st_mtime_ns for p in out.rglob("general/**/*") if p.is_file()}
    with scripted_answers():
        again = run_benchmark(babilong_general(), tiny_refs(), out)
    changed = {p for p in out.rglob("general/**/*") if p.is_file() and before.get(p) != p.stat().st_mtime_ns}
    assert changed == {one_length.with_name(f"1024{suffix}") for suffix in (".json", ".lm_eval.json", ".samples.jsonl")}
    assert sorted(again.rows, key=json.dumps) == sorted(run.rows, key=json.dumps)

    def no_engine(*_args, **_kwargs):
        raise AssertionError("every length is on disk: no engine is built")

    monkeypatch.setattr(evalkit.engines, "get_engine", no_engine)
    fewer = run_benchmark(general([BABILONG], babilong_lengths=["0k"]), tiny_refs(), out)
    assert {(r["step"], r["length"]) for r in fewer.rows} == {(550, 0), (600, 0)}


def test_real_tasks_without_their_data_are_one_line_each_and_the_rest_runs(tmp_path, monkeypatch):
    """lm-eval's longbench_hotpotqa_e and babilong_qa1, offline with empty caches: each (and each length) a
    one-line skip naming its dataset, tried once per run, while the fixture beside them is scored."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    tasks = ["longbench_hotpotqa_e", "babilong_qa1", BABILONG]
    with offline_hubs():
        run = run_benchmark(general(tasks, babilong_lengths=["0k", "1k"]), tiny_refs(), tmp_path / "out")
    for summary in run.summaries:
        reasons = {(s["task"], s.get("length")): s["reason"] for s in summary["skipped"]}
        assert set(reasons) == {("longbench_hotpotqa_e", None), ("babilong_qa1", 0), ("babilong_qa1", 1024)}
        assert all("\n" not in reason for reason in reasons.values())
        assert "Xnhyacinth/LongBench" in reasons[("longbench_hotpotqa_e", None)]
        assert "RMT-team/babilong-1k-samples" in reasons[("babilong_qa1", 1024)]
        assert {(r["task"], r["length"]) for r in summary["rows"]} == {(BABILONG, 0), (BABILONG, 1024)}


def lm_eval_babilong_qa1() -> dict:
    folder = files("lm_eval.tasks") / "babilong"
    common = load_yaml(folder / "_babilong_common_yaml", resolve_func=False, recursive=False)
    return {**common, **load_yaml(folder / "babilong_qa1.yaml", resolve_func=False, recursive=False)}


def fixture(name: str) -> dict:
    return load_yaml(FIXTURES / f"{name}.yaml", resolve_func=False, recursive=False)


def function(reference) -> list[str]:
    """A `!function` reference (a dotted module path, or lm-eval's resolved file path) as its last three parts."""
    return str(reference).replace("/", ".").split(".")[-3:]


def test_the_fixtures_run_lm_evals_definitions_of_their_tasks():
    real, mine = lm_eval_babilong_qa1(), fixture(BABILONG)
    for key in ("description", "doc_to_text", "doc_to_target", "target_delimiter", "num_fewshot", "fewshot_config"):
        assert mine[key] == real[key], key
    assert mine["generation_kwargs"] == real["generation_kwargs"] and mine["metric_list"] == real["metric_list"]
    assert function(mine["process_results"]) == function(real["process_results"])
    real_e = load_yaml(files("lm_eval.tasks") / "longbench" / "hotpotqa_e.yaml", resolve_func=False, recursive=False)
    mine_e = fixture(LONGBENCH_E)
    for key in ("max_gen_toks", "until"):
        assert mine_e["generation_kwargs"][key] == real_e["generation_kwargs"][key]
    assert mine_e["metric_list"] == real_e["metric_list"]
    assert function(mine_e["process_results"]) == function(real_e["process_results"])


@pytest.mark.parametrize(
    "given, message",
    [
        (["4096"], "could not read '4096'"),
        (["1k", "1K"], "names a length twice"),
    ],
)
def test_babilong_lengths_are_babilongs_names(given, message):
    with pytest.raises(UserError, match=message):
        GeneralSettings([BABILONG], babilong_lengths=given)
    with pytest.raises(UserError, match="none is in --tasks"):
        GeneralSettings([LONGBENCH_E], babilong_lengths=["1k"])
