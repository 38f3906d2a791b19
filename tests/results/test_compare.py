"""evalkit compare and effective length against differences, errors and thresholds computed by hand,
and the bootstrap interval's coverage on simulated scores with a known difference."""

import json
import math
import shutil
import statistics
import subprocess
import sys

import numpy as np
import pytest

from evalkit.errors import UserError
from evalkit.results.compare import compare, holm, longest_holding, normal_p
from evalkit.results.samples import Cell, LoggedSample, Series, load_series
from evalkit.store.result_format import SCHEMA_VERSION
from evalkit.store.sample_log import record_checksum

CELL = Cell("ruler", "niah_single_1", 1024, "string_match_all")


def series(name: str, checkpoints: dict[int, list[float]], references=None, cell: Cell = CELL) -> Series:
    """A series whose checkpoints answered samples 0..n-1 (references r<i> unless given)."""
    one = Series(name)
    for step, scores in checkpoints.items():
        refs = references or [f"r{i}" for i in range(len(scores))]
        one.checkpoints[step] = {
            cell: {i: LoggedSample(float(s), json.dumps([refs[i]]), f"p{i}") for i, s in enumerate(scores)}
        }
    return one


def test_paired_difference_and_error_are_the_per_sample_differences():
    rng = np.random.default_rng(1)
    a = rng.choice([0.0, 100.0], size=40).tolist()
    b = [min(100.0, x + 100.0 * (rng.random() < 0.3)) for x in a]
    found = compare({"A": series("A", {0: a}), "B": series("B", {0: b})}, ["A", "B"], replicates=20000, seed=3)
    (difference,) = found.differences
    d = [y - x for x, y in zip(a, b)]
    by_hand = statistics.pstdev(d) / math.sqrt(len(d))  # the bootstrap's plug-in standard error
    assert difference.difference == pytest.approx(statistics.fmean(d))
    assert difference.stderr == pytest.approx(by_hand, rel=0.04)
    assert difference.pairing_detail == "paired, same prompts"
    assert difference.low == pytest.approx(statistics.fmean(d) - 1.96 * by_hand, abs=0.25 * by_hand)
    assert difference.p == pytest.approx(math.erfc(abs(statistics.fmean(d)) / difference.stderr / math.sqrt(2)))


def test_other_references_are_never_paired_and_require_refuses():
    a, b = [100.0, 0.0, 100.0, 0.0] * 10, [100.0, 100.0, 0.0, 100.0] * 10
    other = [f"x{i}" for i in range(40)]  # other needles: other samples
    pair = {"A": series("A", {0: a}), "B": series("B", {0: b}, references=other)}
    (difference,) = compare(pair, ["A", "B"], replicates=20000, seed=4).differences
    assert difference.pairing_detail.startswith("independent: references differ at sample 0")
    by_hand = math.hypot(statistics.pstdev(a) / math.sqrt(40), statistics.pstdev(b) / math.sqrt(40))
    assert difference.stderr == pytest.approx(by_hand, rel=0.04)
    with pytest.raises(UserError, match="cannot pair, independent: references differ at sample 0"):
        compare(pair, ["A", "B"], replicates=200, pairing="require")


def test_same_references_other_prompts_pair_and_say_so():
    a = series("A", {0: [100.0, 0.0, 100.0]})
    b = series("B", {0: [100.0, 100.0, 0.0]})
    for i, sample in b.checkpoints[0][CELL].items():
        b.checkpoints[0][CELL][i] = LoggedSample(sample.score, sample.identity, f"other{i}")
    (difference,) = compare({"A": a, "B": b}, ["A", "B"], replicates=200).differences
    assert difference.pairing_detail == "paired, same references, prompts differ"


def test_checkpoints_average_as_the_leaderboard_and_their_spread_counts():
    """Samples all alike within a checkpoint: only the checkpoints vary, and the error is
    sqrt(s_A^2/K_A + s_B^2/K_B) with the sample standard deviations over checkpoints."""
    values_a, values_b = [10.0, 20.0, 30.0, 40.0], [30.0, 30.0, 50.0, 50.0]
    a = series("A", {step: [v] * 20 for step, v in enumerate(values_a)})
    b = series("B", {step: [v] * 20 for step, v in enumerate(values_b)})
    (difference,) = compare({"A": a, "B": b}, ["A", "B"], replicates=40000, seed=5).differences
    assert difference.difference == pytest.approx(statistics.fmean(values_b) - statistics.fmean(values_a)) == 15.0
    by_hand = math.sqrt(statistics.variance(values_a) / 4 + statistics.variance(values_b) / 4)
    assert difference.stderr == pytest.approx(by_hand, rel=0.04)


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert normal_p(0.0, 0.0) == 1.0 and normal_p(2.0, 0.0) == 0.0
    assert normal_p(1.96, 1.0) == pytest.approx(0.05, abs=1e-3)


def test_holm_is_applied_across_the_cells():
    cells = [Cell("ruler", task, 1024, "m") for task in ("niah_single_1", "vt", "cwe")]
    a, b = Series("A"), Series("B")
    for one, shift in ((a, 0.0), (b, 1.0)):
        one.checkpoints[0] = {
            c: {i: LoggedSample(float(i % 5) + shift * k, str(i), None) for i in range(30)} for k, c in enumerate(cells)
        }
    found = compare({"A": a, "B": b}, ["A", "B"], replicates=2000, seed=0)
    assert [d.p_holm for d in found.differences] == pytest.approx(holm([d.p for d in found.differences]))
    (average,) = found.averages
    assert average.task == "average" and average.tasks == 3 and average.difference == pytest.approx(1.0)


@pytest.mark.parametrize(
    "scores, expected",
    [
        ([90, 86, 80, 88], 2048),  # the dip at 4K ends it: 8K's 88 does not count
        ([85.6, 85.6, 85.6, 85.6], 8192),  # at the threshold holds
        ([80, 90, 90, 90], None),  # below at the shortest length
    ],
)
def test_longest_holding_by_hand(scores, expected):
    assert longest_holding([1024, 2048, 4096, 8192], scores, 85.6) == expected


def test_effective_length_with_its_interval_and_a_threshold_from_a_run():
    def at_lengths(name, per_length):
        one = Series(name)
        one.checkpoints[0] = {}
        for length, scores in per_length.items():
            cell = Cell("ruler", "niah_single_1", length, "string_match_all")
            one.checkpoints[0][cell] = {i: LoggedSample(s, str(i), None) for i, s in enumerate(scores)}
        return one

    # Deterministic scores: every replicate agrees, so the interval is the point.
    sure = at_lengths("sure", {1024: [100.0] * 10, 2048: [90.0] * 10, 4096: [50.0] * 10})
    # 9 of 10 samples right at 2K: the task average is 90, but a replicate often draws 2 wrong ones.
    unsure = at_lengths("unsure", {1024: [100.0] * 10, 2048: [100.0] * 9 + [0.0], 4096: [0.0] * 10})
    found = compare({"sure": sure, "unsure": unsure}, ["sure", "unsure"], replicates=2000, seed=1)
    by_name = {e.series: e for e in found.effective}
    assert (by_name["sure"].length, by_name["sure"].low, by_name["sure"].high) == (2048, 2048, 2048)
    assert by_name["unsure"].length == 2048 and (by_name["unsure"].low, by_name["unsure"].high) == (1024, 2048)
    from_run = compare(
        {"sure": sure, "unsure": unsure}, ["sure", "unsure"], replicates=200, threshold_from="sure"
    )  # sure's 1K average, 100: only samples all right hold
    assert from_run.threshold == 100.0 and from_run.threshold_source == "sure at 1024"
    assert {e.series: e.length for e in from_run.effective} == {"sure": 1024, "unsure": 1024}


@pytest.mark.parametrize(
    "checkpoints, checkpoint_sd, paired",
    [
        (2, 0.02, True),  # the tiny study's shape: two checkpoints that differ little, the same samples
        (6, 0.08, True),  # checkpoints that swing: the checkpoint level must carry it
        (1, 0.0, False),  # other samples on each side (another seed): independent
    ],
)
def test_interval_covers_a_known_difference_about_95_percent_of_the_time(checkpoints, checkpoint_sd, paired):
    """200 simulated experiments of 60 samples a side, each checkpoint with its own random effect;
    the true difference is 10 points. A 95% interval should cover it 90-99% of the time (binomial
    sd at 200 experiments: 1.5 points; the percentile bootstrap under-covers a little).
    Measured with this seed: 97%, 95.5%, 94.5%. (Two checkpoints that swing widely, sd 0.08,
    under-cover: 89%; two values cannot estimate a spread, docs/comparing.md.)"""
    rng = np.random.default_rng(2026)
    covered = 0
    for experiment in range(200):
        shared = rng.random(60)
        sides = {}
        for name, rate in (("A", 0.5), ("B", 0.6)):
            latent = shared if paired else rng.random(60)
            scores = {}
            for step in range(checkpoints):
                effect = rng.normal(0, checkpoint_sd)
                scores[step] = (100.0 * (latent < rate + effect + rng.normal(0, 0.05, 60))).tolist()
            references = [f"{'' if paired else name}{i}" for i in range(60)]
            sides[name] = series(name, scores, references=references)
        # the truth: E[score B] - E[score A] = 100 * (0.6 - 0.5) over samples, effects and noise
        found = compare(sides, ["A", "B"], replicates=400, seed=experiment).differences[0]
        assert found.pairing_detail.startswith("paired" if paired else "independent")
        covered += found.low <= 10.0 <= found.high
    assert 0.90 <= covered / 200 <= 0.99, covered


def of_checkpoints(one: Series, run: str = "run") -> Series:
    """The series' checkpoints named as the weights of `run` at each step (samples.checkpoint_identity's form)."""
    one.identities = {step: f"/ckpts/{run}/step-{step}@{step}#meta" for step in one.steps()}
    return one


def test_series_of_the_same_checkpoints_pair_by_checkpoint():
    """Samples all alike within a checkpoint: only the checkpoints vary. Paired by checkpoint, the error is
    that of the per-checkpoint differences d = B - A = 3, 1, 6, 4: sqrt(var(d)/4) = sqrt((13/3)/4) = 1.041;
    unpaired it would be sqrt(var(A)/4 + var(B)/4) = sqrt(500/3/4 + 593/3/4) = 9.544."""
    values_a, values_b = [10.0, 20.0, 30.0, 40.0], [13.0, 21.0, 36.0, 44.0]
    a = series("A", {step: [v] * 20 for step, v in enumerate(values_a)})
    b = series("B", {step: [v] * 20 for step, v in enumerate(values_b)})
    (unpaired,) = compare({"A": a, "B": b}, ["A", "B"], replicates=40000, seed=5).differences
    assert unpaired.pairing == "samples" and unpaired.stderr == pytest.approx(9.544, rel=0.04)
    pair = {"A": of_checkpoints(a), "B": of_checkpoints(b)}
    (paired,) = compare(pair, ["A", "B"], replicates=40000, seed=5).differences
    assert paired.difference == pytest.approx(3.5)
    assert paired.pairing == "checkpoints+samples" and paired.stderr == pytest.approx(1.041, rel=0.04)
    assert paired.low == pytest.approx(1.0, abs=0.5) and paired.high == pytest.approx(6.0, abs=0.5)  # mean of 4 of d
    (asked,) = compare(pair, ["A", "B"], replicates=2000, pairing="independent").differences
    assert asked.pairing == "none"
    other = {"A": of_checkpoints(a), "B": of_checkpoints(b, run="another")}  # other weights, same step numbers
    (apart,) = compare(other, ["A", "B"], replicates=2000).differences
    assert apart.pairing == "samples"


def test_pairing_by_checkpoint_covers_and_narrows():
    """200 simulated experiments: two series (say two encodings) of the same 6 checkpoints answering the
    same 60 samples. A sample's score is its difficulty (sd 10, shared) + its checkpoint's effect (sd 15,
    shared by both series) + noise (sd 5); B adds the true difference, 10 points, plus a per-checkpoint
    departure from it (sd 2). Paired by checkpoint, the 95% interval should cover 10 about 95% of the
    time (90-99%: binomial sd 1.5 points at 200) and be far narrower than the interval that resamples
    each series' checkpoints on its own, which carries the shared effect twice (by hand: a standard
    error of about sqrt(4/6 + 2*25/360) = 0.9 against sqrt(2*225/6) = 8.7). Measured with this seed: 95%
    coverage, median widths 4.0 paired against 28.7."""
    rng = np.random.default_rng(36)
    covered, widths, unpaired_widths = 0, [], []
    for experiment in range(200):
        difficulty, effects, departures = rng.normal(0, 10, 60), rng.normal(0, 15, 6), rng.normal(0, 2, 6)
        sides = {}
        for name, shift in (("A", 0.0), ("B", 10.0)):
            scores = {step: (50 + difficulty + effects[step] + rng.normal(0, 5, 60)
                             + (shift + departures[step] if shift else 0.0)).tolist() for step in range(6)}  # fmt: skip
            sides[name] = series(name, scores)
        unpaired = compare(sides, ["A", "B"], replicates=400, seed=experiment).differences[0]
        paired_sides = {name: of_checkpoints(one) for name, one in sides.items()}
        found = compare(paired_sides, ["A", "B"], replicates=400, seed=experiment).differences[0]
        assert found.pairing == "checkpoints+samples"
        covered += found.low <= 10.0 <= found.high
        widths.append(found.high - found.low)
        unpaired_widths.append(unpaired.high - unpaired.low)
    assert 0.90 <= covered / 200 <= 0.99, covered
    assert statistics.median(widths) < 0.25 * statistics.median(unpaired_widths)


def test_checkpoint_identity_is_read_from_the_summaries(tmp_path):
    """Two sizings of one checkpoint in two directories (exact=, nvidia=) pair by checkpoint; the same
    path retrained in place (another meta.json) does not."""
    for label in ("exact", "nvidia", "retrained"):
        write_checkpoint(tmp_path / label, "m", 1, "niah_single_1", 1024, [1, 0, 1, 1])
        path = tmp_path / label / "m" / "step-1" / "ruler-summary.json"
        summary = json.loads(path.read_text())
        summary["checkpoint"] = "/ckpts/m/step-1"
        summary["provenance"]["checkpoint_meta"] = {"paradigm": "full", "git_hash": label == "retrained"}
        path.write_text(json.dumps(summary))
    found = load_series([f"{label}={tmp_path / label}" for label in ("exact", "nvidia", "retrained")])
    result = compare(found, ["exact", "nvidia", "retrained"], replicates=200)
    assert {d.other: d.pairing for d in result.differences} == {"nvidia": "checkpoints+samples",
                                                                "retrained": "samples"}  # fmt: skip


def test_the_weights_fingerprint_decides_the_pairing_where_summaries_record_it(tmp_path):
    """The fingerprint merge checks shards by (provenance.weights): a copy of the same weights under
    another directory pairs by checkpoint; other weights at the same path do not."""
    fingerprints = {"here": "aaa", "copied": "aaa", "other": "bbb"}
    for label, fingerprint in fingerprints.items():
        write_checkpoint(tmp_path / label, "m", 1, "niah_single_1", 1024, [1, 0, 1, 1])
        path = tmp_path / label / "m" / "step-1" / "ruler-summary.json"
        summary = json.loads(path.read_text())
        summary["checkpoint"] = f"/ckpts/{label}/step-1" if label == "copied" else "/ckpts/m/step-1"
        summary["provenance"]["weights"] = fingerprint
        path.write_text(json.dumps(summary))
    found = load_series([f"{label}={tmp_path / label}" for label in fingerprints])
    result = compare(found, list(fingerprints), replicates=200)
    assert {d.other: d.pairing for d in result.differences} == {"copied": "checkpoints+samples",
                                                                "other": "samples"}  # fmt: skip


# --- from stored files, through the command ---


def write_checkpoint(out, run, step, task, length, correct, references=None, label=None, summary_score=None):
    """A RULER checkpoint as evalkit ruler writes it: the per-sample log and the summary."""
    directory = out / run / f"step-{step}"
    name = f"{length}.jsonl" if label is None else f"{length}.{label}.jsonl"
    log = directory / "ruler" / task / name
    log.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, ok in enumerate(correct):
        ref = (references or [f"n{i}" for i in range(len(correct))])[i]
        record = {"index": i, "length": length - 200, "prediction": ref if ok else "x", "references": [ref],
                  "score": 100.0 * ok, "prompt_sha": f"p{i}", "key": "k"}  # fmt: skip
        record["sha"] = record_checksum(record)
        lines.append(json.dumps(record) + "\n")
    with log.open("a") as handle:
        handle.writelines(lines)
    score = round(100.0 * sum(correct) / len(correct), 2) if summary_score is None else summary_score
    row = {"run": run, "step": step, "task": task, "metric": "string_match_all", "length": length, "value": score}
    row["n"] = len(correct)
    if label is not None:
        row.update(encoding="anchor", doc_tokens=int(label.split("-")[1]))
    path = directory / "ruler-summary.json"
    empty = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "ruler",
        "run": run,
        "step": step,
        "rows": [],
        "skipped": [],
    }
    empty["provenance"] = {}
    summary = json.loads(path.read_text()) if path.is_file() else empty
    summary["rows"].append(row)
    path.write_text(json.dumps(summary))


def test_series_and_encodings_are_read_from_the_logs(tmp_path):
    write_checkpoint(tmp_path, "full", 10, "niah_single_1", 1024, [1, 0, 1, 1])
    write_checkpoint(tmp_path, "full", 10, "niah_single_1", 1024, [1, 0, 0, 0], label="anchor-128")
    found = load_series([str(tmp_path)])
    assert sorted(found) == ["full", "full [anchor, 128-token docs]"]
    (cells,) = found["full [anchor, 128-token docs]"].checkpoints.values()
    assert [s.score for s in cells[CELL].values()] == [100.0, 0.0, 0.0, 0.0]
    labelled = load_series([f"mine={tmp_path}"])
    assert "mine: full" in labelled


def test_a_log_that_is_not_what_its_summary_scored_is_refused(tmp_path):
    write_checkpoint(tmp_path, "full", 10, "niah_single_1", 1024, [1, 0, 1, 1], summary_score=50.0)
    with pytest.raises(UserError, match="does not hold the samples its summary scored"):
        load_series([str(tmp_path)])


def run_compare(*args, cwd):
    command = [sys.executable, "-m", "evalkit.cli", "compare", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_command_writes_the_table_the_json_and_the_plot(tmp_path):
    out = tmp_path / "results"
    for run, correct in (("full", [1, 0, 1, 1, 0, 0]), ("anchor", [1, 1, 1, 1, 0, 1])):
        for step in (1, 2):
            write_checkpoint(out, run, step, "niah_single_1", 1024, correct)
            write_checkpoint(out, run, step, "niah_single_1", 2048, correct[:3] + [0, 0, 0])
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    done = run_compare(str(out), "--baseline", "full", "--replicates", "500", "--seed", "7", "--out",
                       str(tmp_path / "cmp"), cwd=root)  # fmt: skip
    assert done.returncode == 0, done.stderr
    # 1K: anchor 83.33, full 50.00 at both checkpoints -> +33.33; paired, same prompts.
    assert "| anchor − full | niah_single_1 | string_match_all | 1K | 50.00 | 83.33 | +33.33 |" in done.stdout
    assert "paired, same prompts" in done.stdout
    records = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert records["seed"] == 7 and records["replicates"] == 500
    assert [e["length"] for e in records["effective_lengths"]] == [None, None]  # both below 85.6 at 1K
    assert (tmp_path / "cmp" / "compare-vs-length.png").is_file()
    refused = run_compare(str(out), "--baseline", "nobody", cwd=root)
    assert refused.returncode == 2 and "error: --baseline 'nobody' is not among the series" in refused.stderr
    assert "Traceback" not in refused.stderr
    missing = run_compare(str(tmp_path / "nowhere"), cwd=root)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_leaderboard_shows_the_effective_length_interval_from_the_logs(tmp_path):
    import pathlib

    out = tmp_path / "results"
    write_checkpoint(out, "sure", 1, "niah_single_1", 1024, [1] * 10)
    write_checkpoint(out, "sure", 1, "niah_single_1", 2048, [0] * 10)
    write_checkpoint(out, "unsure", 1, "niah_single_1", 1024, [1] * 9 + [0])  # 90: holds, but not in every replicate
    root = pathlib.Path(__file__).resolve().parents[2]
    board = tmp_path / "board.md"
    command = [sys.executable, "-m", "evalkit.cli", "leaderboard", str(out), "--out", str(board)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    text = board.read_text()
    assert "| sure | 1K | [1K, 1K] |" in text
    assert "| unsure | 1K | [< 1K, 1K] |" in text


def test_pooled_seeds_pair_kth_directory_with_kth(tmp_path):
    """Two seeds' evaluations of one checkpoint under two sizings (the former scripts/compare_ruler_runs.py
    case): sample 0 of seed 1 is another sample than sample 0 of seed 0, so each seed pairs with itself."""
    for seed, (a_ok, b_ok) in enumerate([([1, 0], [1, 1]), ([0, 0], [0, 1])]):
        refs = [f"s{seed}n{i}" for i in (0, 1)]
        write_checkpoint(tmp_path / f"a{seed}", "m", 0, "niah_single_1", 4096, a_ok, references=refs)
        write_checkpoint(tmp_path / f"b{seed}", "m", 0, "niah_single_1", 4096, b_ok, references=refs)
    arguments = [f"exact={tmp_path / 'a0'}", f"exact={tmp_path / 'a1'}", f"nvidia={tmp_path / 'b0'}",
                 f"nvidia={tmp_path / 'b1'}"]  # fmt: skip
    found = load_series(arguments)
    assert sorted(found) == ["exact", "nvidia"]
    (d,) = compare(found, ["exact", "nvidia"], replicates=20000, seed=2).differences
    # Paired over 4 samples: differences 0, 100, 0, 100 -> mean 50, plug-in sd 50, error 25.
    assert d.difference == 50.0 and d.samples == "4" and d.pairing_detail == "paired, same prompts"
    assert d.stderr == pytest.approx(25.0, rel=0.04)
    crossed = load_series([f"exact={tmp_path / 'a0'}", f"exact={tmp_path / 'a1'}", f"nvidia={tmp_path / 'b1'}",
                           f"nvidia={tmp_path / 'b0'}"])  # fmt: skip  # seed 1 against seed 0: other samples
    (d,) = compare(crossed, ["exact", "nvidia"], replicates=200).differences
    assert d.pairing_detail.startswith("independent: references differ at sample 0")


def write_general(out, run, step, task, accs, docs=None):
    """An lm-eval task as evalkit general writes it: the per-document samples and the summary row."""
    directory = out / run / f"step-{step}"
    (directory / "general").mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"task": task, "doc_id": i, "filter": "none", "metrics": {"acc": float(a)},
                    "doc_hash": (docs or [f"d{j}" for j in range(len(accs))])[i], "target_hash": "t",
                    "prompt_hash": f"p{i}"}) + "\n"
        for i, a in enumerate(accs)
    ]  # fmt: skip
    (directory / "general" / f"{task}.samples.jsonl").write_text("".join(lines))
    row = {"run": run, "step": step, "requested": task, "task": task, "metric": "acc", "filter": "none",
           "value": sum(accs) / len(accs), "stderr": 0.1, "n": len(accs), "num_fewshot": 0}  # fmt: skip
    summary = {"schema_version": SCHEMA_VERSION, "benchmark": "general", "run": run, "step": step, "rows": [row]}
    summary["provenance"] = {}
    (directory / "general-summary.json").write_text(json.dumps(summary))


def test_lm_eval_tasks_compare_per_document(tmp_path):
    write_general(tmp_path, "full", 1, "fixture_mc", [1, 0, 0, 1, 0])
    write_general(tmp_path, "anchor", 1, "fixture_mc", [1, 1, 0, 1, 1])
    write_general(tmp_path / "other", "other", 1, "fixture_mc", [1, 1, 0, 1, 1], docs=list("vwxyz"))
    found = load_series([str(tmp_path / "full"), str(tmp_path / "anchor"), str(tmp_path / "other")])
    result = compare(found, ["full", "anchor", "other"], replicates=20000, seed=1)
    by_other = {d.other: d for d in result.differences}
    d = by_other["anchor"]
    assert (d.task, d.metric, d.length, d.difference) == ("fixture_mc", "acc", None, pytest.approx(0.4))
    # per-document differences 0, 1, 0, 0, 1: plug-in sd 0.49, error 0.49 / sqrt(5)
    assert d.pairing_detail == "paired, same prompts" and d.stderr == pytest.approx(0.4899 / math.sqrt(5), rel=0.04)
    assert by_other["other"].pairing_detail.startswith("independent: references differ at sample 0")
    assert result.averages == [] and result.effective == []  # no lengths: no task average per length


def test_a_run_in_a_ruler_and_a_general_directory_is_one_series(tmp_path):
    """The quickstart's layout: results/ruler and results/general hold the same runs."""
    import pathlib

    for run, correct, accs in (("full", [1] * 10, [1, 0, 0, 1]), ("anchor", [1] * 9 + [0], [1, 1, 0, 1])):
        write_checkpoint(tmp_path / "ruler", run, 1, "niah_single_1", 1024, correct)
        write_general(tmp_path / "general", run, 1, "fixture_mc", accs)
    found = load_series([str(tmp_path / "ruler"), str(tmp_path / "general")])
    assert sorted(found) == ["anchor", "full"]
    assert {c.benchmark for c in found["full"].cells()} == {"ruler", "general"}
    result = compare(found, ["full", "anchor"], replicates=200)
    assert sorted(d.task for d in result.differences) == ["fixture_mc", "niah_single_1"]
    with pytest.raises(UserError, match="in two of the given directories; name them apart"):
        load_series([str(tmp_path / "ruler"), str(tmp_path / "ruler" / "full")])  # the same cells twice
    board = tmp_path / "board.md"
    command = [sys.executable, "-m", "evalkit.cli", "leaderboard", str(tmp_path / "ruler"), str(tmp_path / "general"),
               "--out", str(board)]  # fmt: skip
    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    assert "| full | 1K | [1K, 1K] |" in board.read_text()


def test_the_json_is_the_same_whatever_the_processs_hash_seed(tmp_path):
    """A length's task average was taken over a set of cells in hash order, so compare.json's last
    digits moved between runs of the same command; the cells are averaged in their sorted order."""
    import os
    import pathlib

    out = tmp_path / "results"
    tasks = ["niah_single_1", "niah_single_2", "vt", "cwe", "fwe", "qa_1", "qa_2"]
    for run, shift in (("full", 0), ("anchor", 1)):
        for k, task in enumerate(tasks):
            correct = [(i * (k + 2) + shift) % 3 != 0 for i in range(7 + k)]  # sevenths, ninths, ...
            write_checkpoint(out, run, 1, task, 1024, correct)
    root = pathlib.Path(__file__).resolve().parents[2]
    made = []
    for seed in ("1", "2", "3", "4"):
        command = [sys.executable, "-m", "evalkit.cli", "compare", str(out), "--baseline", "full",
                   "--replicates", "200", "--out", str(tmp_path / f"cmp-{seed}")]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=root, env=env)
        assert done.returncode == 0, done.stderr
        record = json.loads((tmp_path / f"cmp-{seed}" / "compare.json").read_text())
        made.append({key: value for key, value in record.items() if key not in ("provenance", "command", "created")})
    assert all(other == made[0] for other in made[1:])


# --- silent drops and defaults (issue #36) ---


def set_paradigm(out, run, step, paradigm, seed=None):
    """The checkpoint's meta.json record: its paradigm, and with a seed its training stream (a base, the
    seed, the data's fingerprint) as evalkit train records it."""
    path = out / run / f"step-{step}" / "ruler-summary.json"
    summary = json.loads(path.read_text())
    summary["provenance"]["checkpoint_meta"] = {"paradigm": paradigm}
    if seed is not None:
        stream = {"config": {"seed": seed, "model": {"path": "/bases/tiny"}}, "data_fingerprint": f"data{seed}"}
        summary["provenance"]["checkpoint_meta"].update(stream)
    path.write_text(json.dumps(summary))


def test_the_default_baseline_is_full_attention_else_asked_for(tmp_path):
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    out = tmp_path / "results"
    for run, paradigm in (("a-anchor", "anchor"), ("b-intra", "intra_doc"), ("z-full", "full")):
        write_checkpoint(out, run, 1, "niah_single_1", 1024, [1, 0, 1, 1, 0, 1])
        set_paradigm(out, run, 1, paradigm)
    done = run_compare(str(out), "--replicates", "200", cwd=root)
    assert done.returncode == 0, done.stderr
    assert "| a-anchor − z-full |" in done.stdout and "| b-intra − z-full |" in done.stdout  # not "− a-anchor"
    shutil.rmtree(out / "z-full")
    refused = run_compare(str(out), "--replicates", "200", cwd=root)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "no series is full attention by its checkpoints' records (a-anchor: anchor, b-intra: intra_doc)" in line
    assert "pass --baseline SERIES" in line
    assert run_compare(str(out), "--replicates", "200", "--baseline", "b-intra", cwd=root).returncode == 0


def test_a_series_named_twice_is_one_line(tmp_path):
    import pathlib

    out = tmp_path / "results"
    for run in ("A", "B"):
        write_checkpoint(out, run, 1, "niah_single_1", 1024, [1, 0, 1, 1])
    done = run_compare(str(out), "--series", "A,A", "--baseline", "A", cwd=pathlib.Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --series names A twice; name each series once (at least two)"
    ]


def test_summaries_left_out_are_noted_alike_by_compare_and_every_leaderboard_format(tmp_path):
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    out = tmp_path / "results"
    for run in ("full", "anchor"):
        write_checkpoint(out, run, 1, "niah_single_1", 1024, [1, 0, 1, 1])
    future = out / "future" / "step-1" / "ruler-summary.json"
    future.parent.mkdir(parents=True)
    future.write_text(json.dumps({"schema_version": 999, "benchmark": "ruler", "run": "future", "step": 1, "rows": []}))
    line = f"- {future}: not read: its schema_version is 999"
    heading = "Not read (not in any table; each line says why)"
    compared = run_compare(
        str(out), "--baseline", "full", "--replicates", "200", "--out", str(tmp_path / "c"), cwd=root
    )
    assert compared.returncode == 0 and f"{heading}:" in compared.stderr
    assert compared.stderr.count(line) == 1, compared.stderr  # said once
    assert line in (tmp_path / "c" / "compare.md").read_text()
    for form in ("md", "csv", "json"):
        board = tmp_path / f"board.{form}"
        command = [sys.executable, "-m", "evalkit.cli", "leaderboard", str(out), "--format", form, "--out", str(board)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=root)
        assert done.returncode == 0, done.stderr
        said = board.read_text() if form == "md" else done.stderr
        assert heading in said and line in said, form
    assert json.loads((tmp_path / "board.json").read_text())["not_read"][0].startswith(line)
    # a benchmark compare has no per-sample scores for: compare says so too
    other = out / "full" / "step-1" / "xyz-summary.json"
    other.write_text(
        json.dumps({"schema_version": SCHEMA_VERSION, "benchmark": "xyz", "run": "full", "step": 1, "rows": []})
    )
    compared = run_compare(str(out), "--baseline", "full", "--replicates", "200", cwd=root)
    assert (
        f"- {other}: not read: compare reads ruler-summary.json, general-summary.json and ppl-summary.json, not 'xyz'"
        in (compared.stderr)
    )


def test_the_leaderboard_bolds_only_what_compare_calls_ahead(tmp_path):
    """At 1K "clear" (30 of 30) is ahead of "noise" and "zero" far beyond noise: bold, as compare's
    interval says. At 2K "noise" leads "clear" by one sample of 30 (+3.33; paired by sample, B − A is −100 at
    one sample and 0 elsewhere, so the interval reaches 0): the former board bolded it as the strict
    best; compare calls it noise, so it is not bold."""
    import pathlib

    out = tmp_path / "results"
    write_checkpoint(out, "clear", 1, "niah_single_1", 1024, [1] * 30)
    write_checkpoint(out, "clear", 1, "niah_single_1", 2048, [1] * 15 + [0] * 15)
    write_checkpoint(out, "noise", 1, "niah_single_1", 1024, [1] * 15 + [0] * 15)
    write_checkpoint(out, "noise", 1, "niah_single_1", 2048, [1] * 16 + [0] * 14)
    write_checkpoint(out, "zero", 1, "niah_single_1", 1024, [0] * 30)
    write_checkpoint(out, "zero", 1, "niah_single_1", 2048, [0] * 30)
    root = pathlib.Path(__file__).resolve().parents[2]
    board = tmp_path / "board.md"
    command = [sys.executable, "-m", "evalkit.cli", "leaderboard", str(out), "--out", str(board)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr
    text = board.read_text()
    assert "| **100.00 ± 0.00** | 50.00 ± 0.00 |" in text  # clear: bold at 1K only
    assert "| 50.00 ± 0.00 | 53.33 ± 0.00 |" in text  # noise: the 2K lead is not bold
    by_compare = compare(load_series([str(out)]), ["noise", "clear", "zero"], baseline="noise", replicates=2000)
    (at_2k,) = [d for d in by_compare.averages if d.length == 2048 and d.other == "clear"]
    assert at_2k.low < 0 <= at_2k.high and at_2k.p_holm >= 0.05  # what compare says of that lead (not bold)


def test_samples_column_names_each_sides_count_and_an_average_of_unlike_counts_varies():
    vt = Cell("ruler", "vt", 1024, "string_match_all")
    a, b = series("A", {0: [100.0] * 10}), series("B", {0: [0.0] * 10})
    a.checkpoints[0].update(series("A", {0: [100.0] * 20}, cell=vt).checkpoints[0])
    b.checkpoints[0].update(series("B", {0: [0.0] * 8}, cell=vt).checkpoints[0])
    found = compare({"A": a, "B": b}, ["A", "B"], replicates=200)
    assert [(d.task, d.samples) for d in found.differences] == [("niah_single_1", "10"), ("vt", "20/8")]
    assert [d.samples for d in found.averages] == ["varies"]
    b.checkpoints[0].update(series("B", {0: [0.0] * 20}, cell=vt).checkpoints[0])  # now 10 and 20 on both sides
    found = compare({"A": a, "B": b}, ["A", "B"], replicates=200)
    assert [d.samples for d in found.differences] == ["10", "20"] and [d.samples for d in found.averages] == ["varies"]
    b.checkpoints[0].update(series("B", {0: [0.0] * 10}, cell=vt).checkpoints[0])
    a.checkpoints[0].update(series("A", {0: [100.0] * 10}, cell=vt).checkpoints[0])  # 10 everywhere
    assert [d.samples for d in compare({"A": a, "B": b}, ["A", "B"], replicates=200).averages] == ["10"]
