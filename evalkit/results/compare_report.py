"""`evalkit compare`'s outputs: the markdown tables, the JSON records and the plot."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path

from evalkit.lengths import length_label as label_of_length
from evalkit.markdown import markdown_table
from evalkit.results.compare import LOWER_IS_BETTER, Comparison, Difference, EffectiveLength, significant
from evalkit.store.result_format import length_text  # a LongBench-E bucket in words, else cell_length_label


def cell_length_label(length: int | None) -> str:
    """evalkit.lengths' label, and "–" for a cell without a length (a general task)."""
    return "–" if length is None else label_of_length(length)


def length_or_below(length: int | None, shortest: int) -> str:
    """An effective length's label: "< shortest" where the shortest length already falls below."""
    return label_of_length(length) if length is not None else f"< {label_of_length(shortest)}"


def interval(e: EffectiveLength, shortest: int) -> str:
    return f"[{length_or_below(e.low, shortest)}, {length_or_below(e.high, shortest)}]"


def _signed(value: float) -> str:
    return f"{value + 0.0:+.2f}" if round(value, 2) != 0 else "+0.00"


def _p(value: float) -> str:
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _value(value: float, runs: list[float]) -> str:
    """A side's value, and for several training runs the between-seed spread: mean ± std over the runs
    of each run's checkpoint-averaged score."""
    if len(runs) < 2:
        return f"{value:.2f}"
    return f"{value:.2f} ± {statistics.stdev(runs):.2f} ({len(runs)} runs)"


def _marked(d: Difference) -> str:
    """The difference, bold where it stays significant at 0.05 after Holm, and its MDE."""
    text = f"{_signed(d.difference)} [{_signed(d.low)}, {_signed(d.high)}]"
    return (f"**{text}**" if significant(d) else text) + f" (MDE {d.mde:.2f})"


def summary_table(comparison: Comparison) -> str:
    """One row per pair, one column per length: the task average's difference and its 95% interval."""
    lengths = sorted({d.length for d in comparison.averages if d.length is not None})
    rows = []
    for a, b in dict.fromkeys((d.baseline, d.other) for d in comparison.averages):
        by_length = {d.length: d for d in comparison.averages if (d.baseline, d.other) == (a, b)}
        cells = [_marked(by_length[n]) if n in by_length else "–" for n in lengths]
        rows.append([f"{b} − {a}", *cells])
    return markdown_table(["B − A (task average)", *map(cell_length_label, lengths)], rows)


def differences_table(comparison: Comparison, interactions: bool = False) -> str:
    """One row per difference (B − A), or with `interactions` per interaction ((A − B) − (C − D))."""
    rows = []
    for d in comparison.interactions if interactions else comparison.differences + comparison.averages:
        task = f"**average ({d.tasks} tasks)**" if d.task == "average" else d.task
        metric = d.metric + (f" ({d.filter})" if d.filter not in (None, "none") else "")
        metric += " (lower is better)" if d.metric in LOWER_IS_BETTER else ""
        rows.append([f"{d.other} − {d.baseline}", task, metric, length_text(d.task, d.length),
                     _value(d.baseline_value, d.baseline_runs), _value(d.other_value, d.other_runs),
                     _signed(d.difference), f"{d.stderr:.2f}", f"[{_signed(d.low)}, {_signed(d.high)}]"
                     f" (MDE {d.mde:.2f})", _p(d.p), _p(d.p_holm), d.samples, d.pairing, d.pairing_detail])  # fmt: skip
    names = ["(A − B) − (C − D)", "C − D", "A − B"] if interactions else ["B − A", "A", "B"]
    header = [names[0], "task", "metric", "length", *names[1:], names[0], "se", "95% interval", "p", "p (Holm)",
              "samples", "paired by", "pairing"]  # fmt: skip
    return markdown_table(header, rows)


def effective_table(comparison: Comparison) -> str:
    lengths = sorted({n for e in comparison.effective for n in e.scores})
    rows = []
    for e in comparison.effective:
        scores = [f"{e.scores[n]:.2f}" if n in e.scores else "–" for n in lengths]
        checkpoints = ", ".join(map(str, comparison.checkpoints.get(e.series, [])))
        runs = len(comparison.runs.get(e.series, []))
        checkpoints = f"{runs} runs × ({checkpoints})" if runs else checkpoints
        shortest = min(e.scores)  # never empty: a series without RULER lengths has no effective length
        rows.append([e.series, checkpoints, *scores, length_or_below(e.length, shortest), interval(e, shortest)])
    effective = f"effective length (≥ {comparison.threshold:.2f})"
    header = ["series", "checkpoints", *map(cell_length_label, lengths), effective, "95% interval"]
    return markdown_table(header, rows)


def markdown(comparison: Comparison, command: str) -> str:
    threshold = f"{comparison.threshold:.2f}" + (
        "" if comparison.threshold_source == "given" else f" ({comparison.threshold_source}'s task average)"
    )
    parts = [
        "# Comparison",
        "",
        f"Command: `{command}`",
        "",
        f"Hierarchical bootstrap over checkpoints and samples: {comparison.replicates} replicates, seed "
        f"{comparison.seed}; samples answered alike by both sides are resampled together (paired), and so are "
        'the checkpoints of series of the same checkpoints (column "paired by"). Intervals '
        "are 95% percentile intervals, unadjusted; p-values are Holm-adjusted across every task × length × pair "
        "cell (and, separately, across the per-length averages). Bold: significant at 0.05 after Holm. MDE: the "
        "minimum detectable effect, the true difference this test (before Holm) calls with 80% power, 2.80 "
        "standard errors: what the design could have seen.",
        "",
    ]
    if comparison.runs:
        parts[-2] += (
            " A series of several training runs ("
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in comparison.runs.items())
            + ") resamples its runs, then their checkpoints, then samples (series of the same seeds draw alike: "
            "paired by seed), so a difference is called only beyond the variation between seeds. Its A or B value "
            "shows mean ± std over its runs of each run's checkpoint-averaged score."
        )
    if comparison.averages:
        parts += ["## Task average per length (B − A, 95% interval)", "", summary_table(comparison), ""]
    parts += ["## Per task", "", differences_table(comparison), ""]
    if comparison.interactions:
        parts += ["## Interactions ((A − B) − (C − D), from the same replicates; Holm across these cells and, "
                  "separately, their averages)", "", differences_table(comparison, interactions=True), ""]  # fmt: skip
    if comparison.effective:
        title = f"## Effective length (task average ≥ {threshold} at that length and every shorter one)"
        parts += [title, "", effective_table(comparison), ""]
    return "\n".join(parts)


def json_records(comparison: Comparison, command: str) -> dict:
    from evalkit.store.provenance import stamp

    records = {
        "seed": comparison.seed,
        "replicates": comparison.replicates,
        "threshold": comparison.threshold,
        "threshold_source": comparison.threshold_source,
        "checkpoints": comparison.checkpoints,
        "runs": comparison.runs,
        "correction": "Holm across every task x length x pair cell; separately across the per-length averages, "
        "the interactions' cells and the interactions' averages",
        "differences": [asdict(d) for d in comparison.differences],
        "averages": [asdict(d) for d in comparison.averages],
        "interactions": [asdict(d) for d in comparison.interactions],
        "effective_lengths": [
            {**asdict(e), "scores": {str(k): v for k, v in e.scores.items()}} for e in comparison.effective
        ],
    }
    return {"command": command, **stamp(), **finite(records)}


def finite(value):
    """NaN (and ±inf) as None, so the JSON parses anywhere and a CSV cell is empty."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def plot(comparison: Comparison, stem: Path) -> list[Path]:
    """The task average's B − A against length, with its 95% interval, one line per pair."""
    if not comparison.averages:
        return []
    from evalkit.figures import new_figure, write_figure
    from evalkit.results.plots import length_axis

    figure, axes = new_figure()
    pairs = list(dict.fromkeys((d.baseline, d.other) for d in comparison.averages))
    for offset, (a, b) in enumerate(pairs):
        entries = sorted(
            (d for d in comparison.averages if (d.baseline, d.other) == (a, b)), key=lambda d: d.length or 0
        )
        shift = 2 ** ((offset - (len(pairs) - 1) / 2) * 0.04)  # side by side on the log axis
        xs = [(d.length or 0) * shift for d in entries]
        ys = [d.difference for d in entries]
        errors = [[d.difference - d.low for d in entries], [d.high - d.difference for d in entries]]
        axes.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=f"{b} − {a}")
    axes.axhline(0, color="grey", linewidth=0.8)
    length_axis(axes, {d.length for d in comparison.averages if d.length is not None})
    axes.set(ylabel="B − A (task average, points)", title="Difference with its 95% interval (hierarchical bootstrap)")
    axes.legend(fontsize=7)
    return write_figure(figure, stem)
