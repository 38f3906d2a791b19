"""`evalkit compare`: is series B better than series A, by how much, and is that more than noise?

From stored per-sample scores (evalkit.results.samples), never re-running. The hierarchical
bootstrap (runs, then checkpoints, then sample sets; what shares a draw), the Holm families, the
interactions and effective length are as docs/comparing.md says. Each stage's draw is scaled by
√(n/(n−1)) around the mean over all n, so its variance is the unbiased s²/n, not the plug-in
(n−1)/n of it. The p-value is the normal approximation on the standard error: a percentile
p-value is floored at about 2/replicates, which Holm multiplies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Literal

import numpy as np

from evalkit.errors import UserError
from evalkit.results.samples import Cell, Series, mean_score
from evalkit.store.averages import RULER

# Metrics where a smaller number is the better model (perplexity's loss); every other is higher-better.
LOWER_IS_BETTER = frozenset({"loss"})
RULER_THRESHOLD = 85.6  # RULER's: Llama-2-7B's score at 4K (NVIDIA RULER README)
PAIRINGS = ("auto", "require", "independent")
Pairing = Literal["auto", "require", "independent"]


@dataclass
class Difference:
    """B − A at one cell (task = "average" for the per-length task average)."""

    baseline: str
    other: str
    benchmark: str
    task: str
    metric: str
    length: int | None
    filter: str | None
    baseline_value: float
    other_value: float
    difference: float
    stderr: float
    mde: float  # the minimum detectable effect: MDE_STANDARD_ERRORS standard errors
    low: float
    high: float
    p: float
    p_holm: float
    samples: str  # "30", "30/20" (A/B), or "varies" over an average's tasks
    pairing: str  # paired by "checkpoints" or "seeds" (+"samples"), "samples", or "none"
    pairing_detail: str  # e.g. "paired, same prompts", "independent: references differ at sample 3"
    tasks: int = 1
    # each training run's checkpoint-averaged value (one entry for a one-run series): the between-seed spread
    baseline_runs: list[float] = field(default_factory=list)
    other_runs: list[float] = field(default_factory=list)


@dataclass
class EffectiveLength:
    series: str
    threshold: float
    length: int | None  # None: below the threshold at the shortest length
    low: int | None
    high: int | None
    scores: dict[int, float]


@dataclass
class Comparison:
    differences: list[Difference]
    averages: list[Difference]
    interactions: list[Difference]  # (A − B) − (C − D): "other" is (A − B), "baseline" (C − D); cells, then averages
    effective: list[EffectiveLength]
    seed: int
    replicates: int
    threshold: float
    threshold_source: str
    checkpoints: dict[str, list[int]]
    runs: dict[str, list[str]]  # a series of several training runs: their names


class Bootstrap:
    """The replicates of every series' value at every cell, drawn as docs/comparing.md says."""

    def __init__(self, series: dict[str, Series], replicates: int, seed: int, pairing: Pairing = "auto"):
        if replicates < 100:
            raise UserError(f"--replicates must be at least 100, got {replicates}")
        self.series, self.replicates, self.pairing = series, replicates, pairing
        self.rng = np.random.default_rng(seed)
        # Series of the same checkpoints share one checkpoint draw (paired by checkpoint), their
        # checkpoints taken in the order of their identities so that draw k is the same weights.
        self.checkpoint_group = {name: self._checkpoint_group(one) for name, one in sorted(series.items())}
        # a series' runs in the order of their streams (seeds), then identities, so that series of the
        # same seeds or of the same runs draw alike
        self.runs = {name: sorted(one.members(), key=lambda run: (run.stream or "", _run_group(run) or ()))
                     for name, one in series.items()}  # fmt: skip
        self.run_group = {name: self._run_draw_group(name) for name in self.checkpoint_group}
        checkpoint_draws: dict[object, list[np.ndarray]] = {}
        run_draws: dict[object, np.ndarray | None] = {}
        self.checkpoint_draws, self.run_draws = {}, {}
        for name, group in self.checkpoint_group.items():
            if group not in checkpoint_draws:  # per run its checkpoints' draw
                checkpoint_draws[group] = [self.rng.integers(0, len(run.steps()), size=(replicates, len(run.steps())))
                                           for run in self.runs[name]]  # fmt: skip
            runs = len(self.runs[name])
            if self.run_group[name] not in run_draws:  # then (several runs only) the runs' draw
                draw = self.rng.integers(0, runs, size=(replicates, runs)) if runs > 1 else None
                run_draws[self.run_group[name]] = draw
            self.checkpoint_draws[name], self.run_draws[name] = checkpoint_draws[group], run_draws[self.run_group[name]]
        self.point: dict[tuple[str, Cell], float] = {}
        self.run_points: dict[tuple[str, Cell], list[float]] = {}  # each run's checkpoint-averaged score
        self.values: dict[tuple[str, Cell], np.ndarray] = {}
        self.groups: dict[Cell, dict[tuple[str, int, int], tuple]] = {}  # (series, run, step) -> sample set
        for cell in sorted({cell for one in series.values() for cell in one.cells()}):
            self._draw_cell(cell)

    def _checkpoint_group(self, one: Series) -> object:
        """The series' checkpoints' identities (a hashable key), equal for series of the same checkpoints; its
        own name (a draw of its own) where an identity is missing or pairing is turned off."""
        keys = [_run_group(run) for run in one.members()]
        if self.pairing == "independent" or None in keys:
            return ("own", one.name)
        return keys[0] if len(keys) == 1 else tuple(sorted(keys))  # type: ignore[type-var]

    def _run_draw_group(self, name: str) -> object:
        """Series of the same streams, one run each (paired by seed), share the draw of runs; else as checkpoints."""
        streams = [run.stream for run in self.runs[name]]
        distinct = None not in streams and len(set(streams)) == len(streams)
        if self.pairing != "independent" and len(streams) > 1 and distinct:
            return ("streams", tuple(streams))
        return self.checkpoint_group[name]

    def _draw_cell(self, cell: Cell) -> None:
        members: dict[tuple[str, int, int], dict] = {}  # (series, its run's index, step) -> samples
        for name, one in sorted(self.series.items()):
            if cell not in one.cells():
                continue
            for r, run in enumerate(self.runs[name]):
                missing = [step for step in run.steps() if cell not in run.checkpoints[step]]
                if missing:
                    where = f" (run {run.name})" if one.runs else ""
                    raise UserError(
                        f"series {name}{where}: {cell.label()}{_at(cell)} is missing at step(s) {missing}; "
                        "evaluate every checkpoint of a run (and every run of a series) alike"
                    )
                for step in run.steps():
                    members[(name, r, step)] = run.checkpoints[step][cell]
        # a sample set: (its own series where pairing is off, else None; each sample's index and identity)
        keys = {member: (member[0] if self.pairing == "independent" else None,
                         tuple((i, samples[i].identity) for i in sorted(samples)))
                for member, samples in members.items()}  # fmt: skip
        # in first-appearance order: the draws are reproducible
        draws = {key: self.rng.integers(0, len(key[1]), size=(self.replicates, len(key[1])))
                 for key in dict.fromkeys(keys.values())}  # fmt: skip
        self.groups[cell] = keys
        for name in sorted({member[0] for member in members}):
            values, points = [], []
            for r, run in enumerate(self.runs[name]):
                per_checkpoint = []
                steps = _checkpoint_order(run)
                for step in steps:
                    samples = members[(name, r, step)]
                    scores = np.array([samples[i].score for i in sorted(samples)])
                    per_checkpoint.append(scores[draws[keys[(name, r, step)]]].mean(axis=1))
                resampled = np.stack(per_checkpoint)  # (checkpoints, replicates)
                values.append(_combine(resampled, self.checkpoint_draws[name][r]))
                points.append(float(np.mean([mean_score(members[(name, r, step)]) for step in steps])))
            run_draws = self.run_draws[name]  # the runs, resampled as the checkpoints are
            self.values[(name, cell)] = values[0] if run_draws is None else _combine(np.stack(values), run_draws)
            self.point[(name, cell)] = float(np.mean(points))
            self.run_points[(name, cell)] = points

    def pairing_level(self, cell: Cell, *names: str) -> str:
        """What the difference of `names` at `cell` was paired by: checkpoints (the same weights), else seeds
        (runs of the same streams), with "+samples" where the samples were too, or "samples", or "none"."""
        by_sample = self.pairing_of(cell, *names).startswith("paired")
        if len({self.checkpoint_group[name] for name in names}) == 1:
            by = "checkpoints"
        elif len({self.run_group[name] for name in names}) == 1 and self.run_draws[names[0]] is not None:
            by = "seeds"
        else:
            return "samples" if by_sample else "none"
        return by + "+samples" if by_sample else by

    def pairing_of(self, cell: Cell, *names: str) -> str:
        keys = self.groups[cell]
        mine = {key for (name, *_), key in keys.items() if name in names}
        members = {m: self.runs[m[0]][m[1]].checkpoints[m[2]][cell] for m in keys if m[0] in names}
        if len(mine) == 1 and self.pairing != "independent":
            prompts = {tuple(samples[i].prompt for i in sorted(samples)) for samples in members.values()}
            return "paired, same prompts" if len(prompts) == 1 else "paired, same references, prompts differ"
        if self.pairing == "independent":
            return "independent (asked)"
        return f"independent: {_why_unpaired(members)}"


def _run_group(run: Series) -> tuple | None:
    """A run's checkpoints' identities, sorted; None where one is missing or two are alike."""
    identities = [run.identities[step] for step in run.steps() if step in run.identities]
    known = len(identities) == len(run.steps()) and len(set(identities)) == len(identities)
    return tuple(sorted(identities)) if known else None


def _checkpoint_order(one: Series) -> list[int]:
    """The series' steps in the order of their checkpoints' identities where all are known (the order
    a shared checkpoint draw indexes), else by step."""
    steps = one.steps()
    if all(step in one.identities for step in steps):
        return sorted(steps, key=lambda step: one.identities[step])
    return steps


def _why_unpaired(members: dict[tuple[str, int, int], dict]) -> str:
    (first_member, first), *others = sorted(members.items())
    for member, samples in others:
        for i in sorted(set(first) & set(samples)):
            if first[i].identity != samples[i].identity:
                where = f"{first_member[0]} step {first_member[2]} vs {member[0]} step {member[2]}"
                return f"references differ at sample {_sample_name(i)} ({where})"
        if set(first) != set(samples):
            return f"different sample sets ({len(first)} vs {len(samples)} samples)"
    return "different sample sets"


def _sample_name(key) -> str:
    """A sample's index, with the pooled directory it came from when there are several."""
    if isinstance(key, tuple):
        place, index = key
        return str(index) if place == 0 else f"{index} of pooled directory {place + 1}"
    return str(key)


def _combine(resampled: np.ndarray, checkpoint_draws: np.ndarray) -> np.ndarray:
    """A series' replicate values from its checkpoints' resampled scores (see the module docstring)."""
    count = resampled.shape[0]
    base = resampled.mean(axis=0)
    if count == 1:
        return base
    drawn = np.take_along_axis(resampled, checkpoint_draws.T, axis=0).mean(axis=0)
    return base + math.sqrt(count / (count - 1)) * (drawn - base)


def _at(cell: Cell) -> str:
    return f" at {cell.length}" if cell.length is not None else ""


SIGNIFICANCE = 0.05  # after Holm: what compare marks bold, and the only "best" the leaderboard marks


def significant(difference: Difference) -> bool:
    """compare's test of a difference: its Holm-adjusted p-value below SIGNIFICANCE."""
    return difference.p_holm < SIGNIFICANCE


def normal_p(difference: float, stderr: float) -> float:
    """Two-sided p-value of "no difference" from the bootstrap standard error (normal approximation):
    continuous, so Holm's multiplication is not floored by the replicate count as a percentile p would be."""
    if stderr == 0:
        return 1.0 if difference == 0 else 0.0
    return math.erfc(abs(difference) / stderr / math.sqrt(2))


# The difference compare's test (normal on the bootstrap standard error, two-sided 5%) calls with
# 80% power: z_0.975 + z_0.8 standard errors.
MDE_STANDARD_ERRORS = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: the k-th smallest of m p-values times (m − k + 1), made monotone, capped at 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


Side = tuple[str] | tuple[str, str]  # a series, or the contrast X − Y of two (one side of an interaction)


def _of(table: dict, side: Side, cell: Cell) -> np.ndarray:
    """A side's entry in `table` (boot.point, values or run_points): the series', or X's minus Y's."""
    return np.sum([sign * np.asarray(table[(name, cell)]) for name, sign in zip(side, (1, -1))], axis=0)


def _difference(boot: Bootstrap, a: Side, b: Side, cells: list[Cell], task: str) -> Difference:
    """B − A over `cells` (one cell, or a length's tasks averaged), from the same replicates."""
    point_a, point_b = (float(np.mean([_of(boot.point, s, c) for c in cells])) for s in (a, b))
    draws = np.mean([_of(boot.values, b, c) - _of(boot.values, a, c) for c in cells], axis=0)
    low, high = (float(x) for x in np.percentile(draws, [2.5, 97.5]))  # the 95% percentile interval
    stderr = float(np.std(draws, ddof=1))
    # each run's value; a contrast's per seed, where its two series share the draw of runs (the same seeds)
    runs = {s: [float(v) for v in np.mean([_of(boot.run_points, s, c) for c in cells], axis=0)]
            if boot.run_draws[s[0]] is boot.run_draws[s[-1]] else [] for s in (a, b)}  # fmt: skip
    first, names = cells[0], a + b
    firsts = [boot.runs[s][0] for s in names]
    sizes = {tuple(len(run.checkpoints[run.steps()[0]][c]) for run in firsts) for c in cells}
    samples = "/".join(map(str, dict.fromkeys(sizes.pop()))) if len(sizes) == 1 else "varies"
    label = lambda side: side[0] if len(side) == 1 else f"({side[0]} − {side[1]})"  # noqa: E731
    return Difference(
        baseline=label(a), other=label(b), benchmark=first.benchmark, task=task,
        metric=first.metric if len(cells) == 1 else "task average", length=first.length, filter=first.filter,
        baseline_value=point_a, other_value=point_b, difference=point_b - point_a,
        stderr=stderr, mde=MDE_STANDARD_ERRORS * stderr, low=low, high=high, p=normal_p(point_b - point_a, stderr),
        p_holm=float("nan"), samples=samples,
        pairing=_level_over([boot.pairing_level(c, *names) for c in cells]),
        pairing_detail=_pairing_over([boot.pairing_of(c, *names) for c in cells]),
        tasks=len(cells), baseline_runs=runs[a], other_runs=runs[b],
    )  # fmt: skip


def _pairing_over(each: list[str]) -> str:
    """One cell's pairing, or for an average over tasks: the same for all, else how many were paired."""
    if len(set(each)) == 1:
        return each[0]
    paired = sum(label.startswith("paired") for label in each)
    return "paired" if paired == len(each) else f"{paired} of {len(each)} tasks paired"


def _level_over(levels: list[str]) -> str:
    """An average's pairing: its tasks' where all agree, else the weakest ("mixed" would hide which)."""
    ranked = ["none", "seeds", "checkpoints", "samples", "seeds+samples", "checkpoints+samples"]
    return min(levels, key=ranked.index)


def pairs(names: list[str], baseline: str | None) -> list[tuple[str, str]]:
    """(A, B) pairs: every other series against the baseline (default: the first given)."""
    if len(names) < 2:
        raise UserError(f"compare needs at least two series, found {len(names)}: {', '.join(names) or 'none'}")
    base = baseline if baseline is not None else names[0]
    if base not in names:
        raise UserError(f"--baseline {base!r} is not among the series found: {', '.join(names)}")
    return [(base, other) for other in names if other != base]


def interaction(spec: str, names: list[str]) -> tuple[str, str, str, str]:
    """--interaction A-B:C-D as its four series (names may hold "-": the one split into two known names)."""
    halves = [[(half[:i], half[i + 1 :]) for i, dash in enumerate(half) if dash == "-" and
               {half[:i], half[i + 1 :]} <= set(names)] for half in spec.split(":")]  # fmt: skip
    if len(halves) != 2 or any(len(splits) != 1 for splits in halves):
        raise UserError(f"--interaction {spec!r}: give A-B:C-D, four of the series ({', '.join(names)})")
    (a, b), (c, d) = halves[0][0], halves[1][0]
    if len({a, b, c, d}) < 4:
        raise UserError(f"--interaction {spec!r} names a series twice; (A − B) − (C − D) takes four series")
    return a, b, c, d


FULL_ATTENTION = "full"  # evalkit.attention.paradigms.Paradigm.FULL, as meta.json records it (not imported: torch)


def default_baseline(series: dict[str, Series]) -> str:
    """`compare`'s baseline when none is given: the one series of full attention (its checkpoints'
    meta.json paradigm, as the summaries record it) under the standard encoding; a UserError when
    there is none or several, since the first name in alphabetical order is no baseline."""
    full = [name for name, one in series.items() if one.paradigm == FULL_ATTENTION and one.standard_encoding]
    if len(full) == 1:
        return full[0]
    if full:
        raise UserError(f"{len(full)} series are full attention ({', '.join(full)}); pass --baseline with one of them")
    paradigms = ", ".join(f"{name}: {one.paradigm}" for name, one in series.items())
    raise UserError(f"no series is full attention by its checkpoints' records ({paradigms}); pass --baseline SERIES")


def _rows(boot: Bootstrap, a: Side, b: Side, pairing: Pairing) -> tuple[list[Difference], list[Difference]]:
    """B − A at every cell the sides share, and per RULER length of their task average."""
    shared = sorted(set.intersection(*(boot.series[name].cells() for name in a + b)))
    if not shared:
        raise UserError(f"{' and '.join(a + b)} share no task: nothing to compare")
    cells = [_difference(boot, a, b, [cell], cell.task) for cell in shared]
    for cell, found in zip(shared, cells):
        if pairing == "require" and not found.pairing_detail.startswith("paired"):
            where = f"{found.other} vs {found.baseline}, {cell.label()}{_at(cell)}"
            raise UserError(f"{where}: cannot pair, {found.pairing_detail}")
    ruler = {n: [c for c in shared if _in_ruler_average(c) and c.length == n] for n in _lengths(shared)}
    return cells, [_difference(boot, a, b, at, "average") for at in ruler.values()]


def compare(
    series: dict[str, Series],
    order: list[str],
    *,
    baseline: str | None = None,
    replicates: int = 2000,
    seed: int = 0,
    pairing: Pairing = "auto",
    threshold: float = RULER_THRESHOLD,
    threshold_from: str | None = None,
    interactions: tuple[str, ...] = (),
) -> Comparison:
    """Every pair's differences, per-length averages, each interaction's and every series' effective length."""
    if pairing not in PAIRINGS:
        raise UserError(f"--pairing must be one of {', '.join(PAIRINGS)}, got {pairing!r}")
    compared = pairs(order, baseline)
    fours = [interaction(spec, order) for spec in interactions]
    boot = Bootstrap(series, replicates, seed, pairing)
    pairwise = [_rows(boot, (a,), (b,), pairing) for a, b in compared]
    interacting = [_rows(boot, (c, d), (a, b), pairing) for a, b, c, d in fours]
    # Holm families: the pairs' cells, their averages, the interactions' cells, their averages
    families = [[d for rows in found for d in rows[k]] for found in (pairwise, interacting) for k in (0, 1)]
    for family in families:
        for entry, adjusted in zip(family, holm([d.p for d in family])):
            entry.p_holm = adjusted
    source = "given"
    if threshold_from is not None:
        threshold, source = reference_threshold(boot, threshold_from)
    effective = [effective_length(boot, name, threshold) for name in order if _lengths(series[name].cells())]
    checkpoints = {name: series[name].steps() for name in order}
    runs = {name: [run.name for run in boot.runs[name]] for name in order if series[name].runs}
    differences, averages, cells, means = families
    return Comparison(differences, averages, cells + means, effective, seed, replicates, threshold, source,
                      checkpoints, runs)  # fmt: skip


def _lengths(cells: set[Cell] | list[Cell]) -> list[int]:
    return sorted({c.length for c in cells if _in_ruler_average(c) and c.length is not None})


def _in_ruler_average(cell: Cell) -> bool:
    """One of RULER's 13 tasks (json_kv, run by `evalkit ruler` for HELMET's Recall, is not)."""
    return cell.benchmark == "ruler" and cell.task in RULER.tasks


def series_length_averages(boot: Bootstrap, name: str) -> dict[int, tuple[float, np.ndarray]]:
    """Per length: the series' task average (point) and its replicates."""
    cells = sorted(c for c in boot.series[name].cells() if _in_ruler_average(c))  # one order: the same digits
    at = {length: [c for c in cells if c.length == length] for length in _lengths(boot.series[name].cells())}
    points = {n: float(np.mean([boot.point[(name, c)] for c in cs])) for n, cs in at.items()}
    return {n: (points[n], np.mean([boot.values[(name, c)] for c in cs], axis=0)) for n, cs in at.items()}


def reference_threshold(boot: Bootstrap, name: str) -> tuple[float, str]:
    """--threshold-from: the reference series' task average at its shortest length (its point value)."""
    if name not in boot.series or not _lengths(boot.series[name].cells()):
        raise UserError(f"--threshold-from {name!r}: no RULER series of that name among {', '.join(boot.series)}")
    shortest, (value, _) = min(series_length_averages(boot, name).items())
    return value, f"{name} at {shortest}"


def longest_holding(lengths: list[int], scores: list[float], threshold: float) -> int | None:
    """The longest length with the score at or above threshold there and at every shorter length."""
    held = None
    for length, score in sorted(zip(lengths, scores)):
        if score < threshold:
            break
        held = length
    return held


def effective_length(boot: Bootstrap, name: str, threshold: float) -> EffectiveLength:
    averages = series_length_averages(boot, name)
    lengths = sorted(averages)
    point = longest_holding(lengths, [averages[n][0] for n in lengths], threshold)
    matrix = np.stack([averages[n][1] for n in lengths])  # (lengths, replicates)
    holds = np.cumprod(matrix >= threshold, axis=0)  # 1 while every length so far holds
    count = holds.sum(axis=0)  # how many of the shortest lengths hold, per replicate
    low_count, high_count = (int(x) for x in np.percentile(count, [2.5, 97.5], method="nearest"))
    as_length = lambda k: lengths[k - 1] if k > 0 else None  # noqa: E731
    return EffectiveLength(
        name, threshold, point, as_length(low_count), as_length(high_count), {n: averages[n][0] for n in lengths}
    )
