"""Seeds as replicates in evalkit compare: a series of several training runs resamples its runs, then
each run's checkpoints, then samples; checked against a hierarchical bootstrap written here, against
simulations with a known answer, and, for one-run series, against the numbers compare gave before."""

import hashlib
import json
import math
import pathlib
import re
import statistics

import numpy as np
import pytest

from evalkit.errors import UserError
from evalkit.results.compare import compare, interaction, normal_p, significant
from evalkit.results.compare_report import differences_table, json_records, markdown
from evalkit.results.samples import Cell, LoggedSample, Series, load_series
from tests.helpers import error_line, evalkit_here
from tests.results.test_compare import run_compare, set_paradigm, write_checkpoint

CELL = Cell("ruler", "niah_single_1", 1024, "string_match_all")


def run(name: str, checkpoints: list[list[float]], stream: str | None = None) -> Series:
    """One training run whose checkpoints answered the same samples 0..n-1 (references r<i>)."""
    one = Series(name, stream=stream)
    for step, scores in enumerate(checkpoints):
        one.checkpoints[step] = {CELL: {(0, i): LoggedSample(float(s), json.dumps([f"r{i}"]), f"p{i}")
                                        for i, s in enumerate(scores)}}  # fmt: skip
    return one


def seeds(name: str, runs: list[list[list[float]]]) -> Series:
    return Series(name, runs=[run(f"{name}-seed{k}", checkpoints) for k, checkpoints in enumerate(runs)])


def test_one_run_series_give_the_numbers_compare_gave_before_runs():
    """Four one-run series (paired by samples, by checkpoint and samples, and not at all), 2 lengths x 2
    tasks x 3 checkpoints: every difference, interval, p-value and effective length is the one compare
    gave at ce8ddc8 (before series held runs), draw for draw (its digest, computed there)."""
    rng = np.random.default_rng(11)
    found = {}
    for name, shift, refs, ident in (("A", 0.0, "r", "a"), ("B", 0.2, "r", "b"), ("C", 0.1, "r", "a"),
                                     ("D", 0.3, "x", "d")):  # fmt: skip
        one = Series(name)
        for step in (10, 20, 30):
            one.identities[step] = f"{ident}{step}"
            cells = {}
            for length in (1024, 2048):
                for task in ("niah_single_1", "vt"):
                    p = min(1.0, 0.5 + shift - (length - 1024) / 4096 + rng.normal(0, 0.05))
                    scores = 100.0 * (rng.random(12) < p)
                    cells[Cell("ruler", task, length, "m")] = {
                        (0, i): LoggedSample(float(s), json.dumps([f"{refs}{task}{length}-{i}"]), f"p{i}")
                        for i, s in enumerate(scores)
                    }
            one.checkpoints[step] = cells
        found[name] = one
    result = compare(found, ["A", "B", "C", "D"], replicates=300, seed=9, threshold=40.0)
    numbers: list[list] = [
        [round(x, 9) for x in (d.difference, d.low, d.high, d.stderr, d.p, d.p_holm)]
        for d in result.differences + result.averages
    ]
    numbers += [[e.length, e.low, e.high] for e in result.effective]
    assert hashlib.sha256(json.dumps(numbers).encode()).hexdigest()[:16] == "67ff3fa5eec578cc"
    assert result.runs == {} and all(len(d.baseline_runs) == len(d.other_runs) == 1 for d in result.differences)


def test_between_seed_spread_widens_the_interval_and_only_a_difference_beyond_it_is_called():
    """Runs far apart (run means 20, 50, 80 against 30, 50, 70) with tiny noise within each run: equal
    means, so the interval must cover 0 with the standard error sqrt(s_A²/3 + s_B²/3) of the run means
    (the within-run part is ~0.2 points), though any one seed against one seed is called; a difference
    of 75 points against a spread of 1 is called."""
    rng = np.random.default_rng(5)

    def noisy(means: list[float]) -> list[list[list[float]]]:
        return [[list(m + rng.normal(0, 1, 20)) for _ in range(2)] for m in means]

    a, b = seeds("A", noisy([20, 50, 80])), seeds("B", noisy([30, 50, 70]))
    (d,) = compare({"A": a, "B": b}, ["A", "B"], replicates=40000, seed=1).differences
    by_hand = math.sqrt(statistics.variance([20, 50, 80]) / 3 + statistics.variance([30, 50, 70]) / 3)  # 20.8
    assert d.stderr == pytest.approx(by_hand, rel=0.04)
    assert d.low < 0 < d.high and not significant(d)
    assert statistics.stdev(d.baseline_runs) == pytest.approx(30.0, abs=0.3)  # the between-seed spread
    # One seed against one seed (the compare of one run per series) calls the difference the seeds refute.
    (single,) = compare({"A": a.runs[0], "B": b.runs[0]}, ["A", "B"], replicates=2000).differences
    assert single.difference == pytest.approx(10.0, abs=1.0) and significant(single)

    far = seeds("F", noisy([95, 96, 97]))
    low = seeds("L", noisy([20, 21, 22]))
    found = compare({"L": low, "F": far}, ["L", "F"], replicates=4000, seed=2)
    (d,) = found.differences
    assert d.difference == pytest.approx(75.0, abs=0.5) and significant(d)
    assert d.stderr == pytest.approx(math.sqrt(2 / 3), rel=0.15)  # run means' s = 1 each
    assert statistics.stdev(d.other_runs) == pytest.approx(1.0, abs=0.1)
    assert re.search(
        r"\| 2\d\.\d\d ± [01]\.\d\d \(3 runs\) \| 9\d\.\d\d ± [01]\.\d\d \(3 runs\) \|", differences_table(found)
    )


def hierarchical_bootstrap(sides: list, replicates: int, rng, paired_seeds: bool = False) -> np.ndarray:
    """Each series' value over replicates (sides × replicates), written from the documented rule: per
    replicate one draw of the samples (all series answered the same ones: paired), per series its own
    draw of runs (or, paired by seed, one draw of seeds for all: run k of each is seed k) and per run of
    its checkpoints, each stage's spread scaled to the unbiased s²/n (the value mean + √(n/(n−1)) times
    the drawn mean's deviation from it)."""
    n = sides[0][0].shape[1]

    def stage(values: np.ndarray, drawn_indices=None) -> float:
        mean = values.mean()
        if len(values) == 1:
            return float(mean)
        indices = rng.integers(0, len(values), len(values)) if drawn_indices is None else drawn_indices
        return float(mean + math.sqrt(len(values) / (len(values) - 1)) * (values[indices].mean() - mean))

    out = np.empty((len(sides), replicates))
    for r in range(replicates):
        samples = rng.integers(0, n, n)
        seeds = rng.integers(0, len(sides[0]), len(sides[0])) if paired_seeds else None
        for k, runs in enumerate(sides):
            out[k, r] = stage(np.array([stage(scores[:, samples].mean(axis=1)) for scores in runs]), seeds)
    return out


def test_multi_run_intervals_match_a_hierarchical_bootstrap_written_here():
    """3 runs x 2 checkpoints against 4 runs x 3 checkpoints, 15 paired 0/100 samples, with seed,
    checkpoint and sample variation. Tolerances from the Monte-Carlo error of B = 6000 replicates on
    each side: a standard deviation's relative error is about sqrt((kurtosis − 1) / 4B) ≈ 0.9%, so
    1.3% for the two (5% is 4 of those); a 2.5% quantile's is sqrt(0.025·0.975/B) / φ(1.96) ≈ 0.035
    standard errors, 0.05 for the two (0.2 is 4 of those)."""
    rng = np.random.default_rng(3)

    def runs(effects: list[float], checkpoints: int) -> list[np.ndarray]:
        made = []
        for effect in effects:
            p = np.clip(effect + rng.normal(0, 0.05, (checkpoints, 1)) + np.linspace(-0.2, 0.2, 15), 0, 1)
            made.append(100.0 * (rng.random((checkpoints, 15)) < p))
        return made

    raw_a, raw_b = runs([0.4, 0.55, 0.5], 2), runs([0.5, 0.7, 0.6, 0.65], 3)
    a = Series("A", runs=[run(f"a{k}", scores.tolist()) for k, scores in enumerate(raw_a)])
    b = Series("B", runs=[run(f"b{k}", scores.tolist()) for k, scores in enumerate(raw_b)])
    (d,) = compare({"A": a, "B": b}, ["A", "B"], replicates=6000, seed=4).differences
    reference = np.diff(hierarchical_bootstrap([raw_a, raw_b], 6000, np.random.default_rng(99)), axis=0)[0]
    by_run = {side: [float(scores.mean()) for scores in raw] for side, raw in (("a", raw_a), ("b", raw_b))}
    assert d.baseline_runs == pytest.approx(by_run["a"]) and d.other_runs == pytest.approx(by_run["b"])
    assert d.difference == pytest.approx(statistics.fmean(by_run["b"]) - statistics.fmean(by_run["a"]))
    se = float(np.std(reference, ddof=1))
    assert d.stderr == pytest.approx(se, rel=0.05)
    low, high = np.percentile(reference, [2.5, 97.5])
    assert d.low == pytest.approx(low, abs=0.2 * se) and d.high == pytest.approx(high, abs=0.2 * se)
    assert d.pairing == "samples"  # runs of two series are never paired; their samples are


def test_runs_of_the_same_seeds_pair_by_seed_as_a_paired_bootstrap_written_here():
    """3 seeds x 2 checkpoints on each side, 20 paired 0/100 samples; a seed's effect (0.3, 0.5, 0.7)
    is common to both paradigms, B is 0.08 better in every seed. Runs of the same training streams
    share the draw of seeds: the interval matches the paired hierarchical bootstrap written here (the
    tolerances of the test above), and is narrower than the same runs drawn independently."""
    rng = np.random.default_rng(8)

    def runs(shift: float) -> list[np.ndarray]:
        made = []
        for effect in (0.3, 0.5, 0.7):
            p = np.clip(effect + shift + rng.normal(0, 0.03, (2, 1)) + np.linspace(-0.2, 0.2, 20), 0, 1)
            made.append(100.0 * (rng.random((2, 20)) < p))
        return made

    raw_a, raw_b = runs(0.0), runs(0.08)
    # B's runs listed in another order than A's: the streams, not the order given, pair them
    a = Series("A", runs=[run(f"a{k}", x.tolist(), f"seed {k}") for k, x in enumerate(raw_a)])
    b = Series("B", runs=[run(f"b{k}", x.tolist(), f"seed {k}") for k, x in reversed(list(enumerate(raw_b)))])
    (d,) = compare({"A": a, "B": b}, ["A", "B"], replicates=6000, seed=4).differences
    reference = np.diff(hierarchical_bootstrap([raw_a, raw_b], 6000, np.random.default_rng(99), True), axis=0)[0]
    se = float(np.std(reference, ddof=1))
    assert d.stderr == pytest.approx(se, rel=0.05)
    low, high = np.percentile(reference, [2.5, 97.5])
    assert d.low == pytest.approx(low, abs=0.2 * se) and d.high == pytest.approx(high, abs=0.2 * se)
    assert d.pairing == "seeds+samples"
    (apart,) = compare({"A": a, "B": b}, ["A", "B"], replicates=6000, seed=4, pairing="independent").differences
    unpaired = hierarchical_bootstrap([raw_a, raw_b], 6000, np.random.default_rng(99))  # samples paired there
    assert apart.stderr > 1.5 * d.stderr and apart.pairing == "none"
    assert float(np.std(unpaired[1] - unpaired[0], ddof=1)) > 1.5 * se


def test_an_interaction_is_the_difference_of_two_paired_contrasts_replicate_by_replicate():
    """H2's design in miniature: four arms (full and anchor, bf16 and fp32) of 3 seeds x 2 checkpoints
    on 20 shared 0/100 samples, a seed effect common to all, BF16 costing full 0.15 and anchor nothing.
    (full_bf16 − full_fp32) − (anchor_bf16 − anchor_fp32): its point value is the difference of the
    run-mean differences by hand, each seed's contrasts are the per-seed differences by hand, and its
    interval matches the four-series paired bootstrap written here (tolerances of the tests above)."""
    rng = np.random.default_rng(12)
    uniforms = {effect: rng.random((2, 20)) for effect in (0.3, 0.5, 0.7)}  # a seed's samples: alike in every arm
    raw = {}
    for arm, shift in (("full_bf16", -0.15), ("full_fp32", 0.0), ("anchor_bf16", 0.0), ("anchor_fp32", 0.0)):
        p = {e: np.clip(e + shift + rng.normal(0, 0.03, (2, 1)) + np.linspace(-0.2, 0.2, 20), 0, 1) for e in uniforms}
        raw[arm] = [100.0 * (uniforms[e] < p[e]) for e in uniforms]
    found = {arm: Series(arm, runs=[run(f"{arm}{k}", x.tolist(), f"seed {k}") for k, x in enumerate(runs)])
             for arm, runs in raw.items()}  # fmt: skip
    result = compare(found, list(found), baseline="full_fp32", replicates=6000, seed=4,
                     interactions=("full_bf16-full_fp32:anchor_bf16-anchor_fp32",))  # fmt: skip
    cell, average = result.interactions  # the one task, and its task average at 1K
    by_seed = {arm: np.array([x.mean() for x in runs]) for arm, runs in raw.items()}
    full, anchor = by_seed["full_bf16"] - by_seed["full_fp32"], by_seed["anchor_bf16"] - by_seed["anchor_fp32"]
    assert cell.other_runs == pytest.approx(list(full)) and cell.baseline_runs == pytest.approx(list(anchor))
    assert cell.difference == pytest.approx(full.mean() - anchor.mean())
    assert (cell.other, cell.baseline) == ("(full_bf16 − full_fp32)", "(anchor_bf16 − anchor_fp32)")
    fb, ff, ab, af = hierarchical_bootstrap([raw[a] for a in found], 6000, np.random.default_rng(99), True)
    reference = (fb - ff) - (ab - af)
    se = float(np.std(reference, ddof=1))
    assert cell.stderr == pytest.approx(se, rel=0.05)
    low, high = np.percentile(reference, [2.5, 97.5])
    assert cell.low == pytest.approx(low, abs=0.2 * se) and cell.high == pytest.approx(high, abs=0.2 * se)
    assert cell.pairing == "seeds+samples" and cell.p == pytest.approx(normal_p(cell.difference, cell.stderr))
    assert (average.task, average.difference, average.stderr) == ("average", cell.difference, cell.stderr)
    assert "## Interactions" in markdown(result, "cmd") and len(json_records(result, "cmd")["interactions"]) == 2
    # The effect its test calls 4 times in 5: 2.80 standard errors (z_0.975 + z_0.8 from a printed table).
    assert cell.mde == pytest.approx((1.960 + 0.8416) * cell.stderr, rel=1e-3)
    assert f"(MDE {cell.mde:.2f})" in markdown(result, "cmd")


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("full-bf16-full-fp32", "give A-B:C-D"),  # no second contrast
        ("full-bf16-full-fp32:anchor-bf16-anchor-fp16", "give A-B:C-D"),  # an unknown series
        ("full-bf16-full-fp32:anchor-bf16-full-bf16", "names a series twice"),
    ],
)
def test_an_interaction_names_four_known_series(spec, fragment):
    names = ["full-bf16", "full-fp32", "anchor-bf16", "anchor-fp32"]
    assert interaction("full-bf16-full-fp32:anchor-bf16-anchor-fp32", names) == tuple(names)  # "-" in names
    with pytest.raises(UserError, match=fragment):
        interaction(spec, names)


def test_the_command_reports_an_interaction_and_refuses_a_bad_one_in_a_line(tmp_path, capsys):
    """Per seed (4 samples): full fp32 50, 75, 25 and bf16 25, 50, 0; anchor fp32 75, 100, 50 and bf16
    75, 75, 50: (full_bf16 − full_fp32) − (anchor_bf16 − anchor_fp32) = −25 − (−8.33) = −16.67 by hand."""
    out = tmp_path / "results"
    answers = {
        "full-fp32": [[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]],
        "full-bf16": [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]],
        "anchor-fp32": [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]],
        "anchor-bf16": [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]],
    }
    for arm, per_seed in answers.items():
        for seed, correct in enumerate(per_seed, start=1):
            write_checkpoint(out, f"{arm}-seed{seed}", 1, "niah_single_1", 1024, correct)
            set_paradigm(out, f"{arm}-seed{seed}", 1, arm.split("-")[0], seed)
    labels = [f"{arm.replace('-', '_')}={out}/{arm}-seed*" for arm in answers]
    spec = "full_bf16-full_fp32:anchor_bf16-anchor_fp32"
    done = evalkit_here(capsys, "compare", *labels, "--baseline", "full_fp32", "--replicates", "300",
                        "--interaction", spec, "--out", tmp_path / "cmp")  # fmt: skip
    assert done.returncode == 0, done.stderr
    row = ("| (full_bf16 − full_fp32) − (anchor_bf16 − anchor_fp32) | niah_single_1 | string_match_all | 1K "
           "| -8.33 ± 14.43 (3 runs) | -25.00 ± 0.00 (3 runs) | -16.67 |")  # fmt: skip
    assert row in (tmp_path / "cmp" / "compare.md").read_text().split("## Interactions")[1]
    records = json.loads((tmp_path / "cmp" / "compare.json").read_text())["interactions"]
    assert [(d["task"], round(d["difference"], 2), d["pairing"]) for d in records] == [
        ("niah_single_1", -16.67, "seeds+samples"), ("average", -16.67, "seeds+samples")]  # fmt: skip
    refused = evalkit_here(
        capsys, "compare", *labels, "--baseline", "full_fp32", "--interaction", "full_bf16-full_fp32"
    )
    assert error_line(refused).startswith("error: --interaction 'full_bf16-full_fp32': give A-B:C-D")


def test_a_seed_effect_common_to_both_sides_cancels_only_when_the_seeds_match():
    """Seed means 20, 50, 80 (A) and 25, 55, 85 (B), tiny noise within each run: paired by seed B − A
    is 5 ± ~0.3 and called; with one of B's runs of another seed (another data stream) nothing pairs
    the runs and the seed spread (SD 30) hides it."""
    rng = np.random.default_rng(6)

    def noisy(name: str, means: list[float], streams: list[str]) -> Series:
        made = [run(f"{name}{k}", [list(m + rng.normal(0, 1, 20)) for _ in range(2)], stream)
                for k, (m, stream) in enumerate(zip(means, streams))]  # fmt: skip
        return Series(name, runs=made)

    same = ["seed 1", "seed 2", "seed 3"]
    a, b = noisy("A", [20, 50, 80], same), noisy("B", [25, 55, 85], same)
    (d,) = compare({"A": a, "B": b}, ["A", "B"], replicates=4000, seed=1).differences
    assert d.difference == pytest.approx(5.0, abs=0.5) and significant(d) and d.stderr < 1.0
    other = noisy("B", [25, 55, 85], ["seed 1", "seed 2", "seed 9"])
    (d,) = compare({"A": a, "B": other}, ["A", "B"], replicates=4000, seed=1).differences
    assert not significant(d) and d.stderr > 15 and d.pairing == "samples"


def test_a_glob_of_run_directories_is_one_series_of_seeds(tmp_path):
    out = tmp_path / "results"
    answers = {"full": [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], "anchor": [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]}
    for paradigm, per_seed in answers.items():
        for seed, correct in enumerate(per_seed, start=1):
            for step in (1, 2):
                write_checkpoint(out / f"{paradigm}-seed{seed}", f"{paradigm}-seed{seed}", step, "niah_single_1",
                                 1024, correct)  # fmt: skip
                set_paradigm(out / f"{paradigm}-seed{seed}", f"{paradigm}-seed{seed}", step, paradigm, seed)
    found = load_series([f"full={out}/full-seed*", f"anchor={out}/anchor-seed*"])
    assert [r.name for r in found["anchor"].runs] == ["anchor-seed1", "anchor-seed2", "anchor-seed3"]
    # the runs' training streams, read from their checkpoints' records: the seeds pair
    assert found["anchor"].runs[1].stream == "base /bases/tiny · seed 2 · data data2"
    (d,) = compare(found, ["full", "anchor"], replicates=300).differences
    assert d.pairing == "seeds+samples"
    root = pathlib.Path(__file__).resolve().parents[2]
    done = run_compare(f"full={out}/full-seed*", f"anchor={out}/anchor-seed*", "--replicates", "300", "--out",
                       str(tmp_path / "cmp"), cwd=root)  # fmt: skip
    assert done.returncode == 0, done.stderr
    # per seed, full: 25, 50, 0 -> 25 ± 25; anchor: 75, 50, 100 -> 75 ± 25 (mean ± std over runs)
    assert (
        "| anchor − full | niah_single_1 | string_match_all | 1K | 25.00 ± 25.00 (3 runs) | 75.00 ± 25.00 (3 runs) "
        "| +50.00 |" in done.stdout
    )
    records = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert records["runs"]["full"] == ["full-seed1", "full-seed2", "full-seed3"]
    # A glob of one directory is that directory: the numbers compare gave for it.
    one = compare(load_series([f"full={out}/full-seed1*", f"anchor={out}/anchor-seed1"]), ["full", "anchor"],
                  replicates=300)  # fmt: skip
    two = compare(load_series([f"full={out}/full-seed1", f"anchor={out}/anchor-seed1"]), ["full", "anchor"],
                  replicates=300)  # fmt: skip
    assert one.differences == two.differences and not one.runs


def test_runs_of_one_series_must_be_one_recipe_and_evaluated_alike(tmp_path):
    out = tmp_path / "results"
    for name, paradigm in (("x-seed1", "anchor"), ("x-seed2", "full")):
        write_checkpoint(out / name, name, 1, "niah_single_1", 1024, [1, 0])
        set_paradigm(out / name, name, 1, paradigm)
    with pytest.raises(UserError, match="x-seed2 differs from x-seed1 in paradigm"):
        load_series([f"x={out}/x-seed*"])
    with pytest.raises(UserError, match="no directory matches"):
        load_series([f"x={out}/y-seed*"])
    lacking = Series("A", runs=[run("a1", [[100.0, 0.0]]), Series("a2", checkpoints={0: {}})])
    with pytest.raises(UserError, match=r"series A \(run a2\): niah_single_1 at 1024 is missing at step"):
        compare({"A": lacking, "B": seeds("B", [[[0.0, 100.0]], [[100.0, 0.0]]])}, ["A", "B"], replicates=200)


def test_the_leaderboard_tables_runs_named_seed_n_as_one_series_of_seeds(tmp_path):
    """full's seeds score 0, 10 and 20 at 1K, anchor's 90, 100 and 100 (10 samples, 2 checkpoints
    each): the seeds table shows mean ± std over the runs (10.00 ± 10.00, 96.67 ± 5.77 by hand), bolds
    anchor (far beyond the seed spread) and gives anchor the effective length 1K; a run without a
    seed in its name stays a run of its own."""
    from evalkit.results.leaderboard import build_markdown

    out = tmp_path / "results"
    for paradigm, rights in (("full", (0, 1, 2)), ("anchor", (9, 10, 10))):
        for seed, right in enumerate(rights, start=1):
            for step in (1, 2):
                name = f"{paradigm}-seed{seed}"
                write_checkpoint(out, name, step, "niah_single_1", 1024, [1] * right + [0] * (10 - right))
                set_paradigm(out, name, step, paradigm)
    write_checkpoint(out, "other", 1, "niah_single_1", 1024, [1] * 5 + [0] * 5)
    text, _, _ = build_markdown([out])
    seeds = text.split("## RULER over seeds")[1].split("##")[0]
    assert "| anchor | anchor-seed1, anchor-seed2, anchor-seed3 | **96.67 ± 5.77** | 1K [" in seeds
    assert "| full | full-seed1, full-seed2, full-seed3 | 10.00 ± 10.00 | < 1K [< 1K, < 1K] |" in seeds
    assert "other" not in seeds
