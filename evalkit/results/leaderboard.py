"""`evalkit leaderboard`: tables and plots from stored summaries (docs/leaderboards.md)."""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from evalkit.errors import UserError
from evalkit.lengths import length_label as _label  # the one length label, tables and plots alike
from evalkit.markdown import markdown_table
from evalkit.results.summaries import FAILED_SUFFIX, GENERAL_SUMMARY, RULER_SUMMARY, not_read_note, summary_files
from evalkit.store.averages import (
    HELMET_RECALL,
    RULER,
    Category,
    RunAverage,
    length_averages,
    per_checkpoint_length_means,
)
from evalkit.store.result_format import (
    EXPORT_FIELDS,
    NO_KEY_TOKENS,
    STANDARD,
    SUMMARY_SUFFIX,
    ResultRow,
    describe_checkpoint,
    export_record,
    length_text,  # a LongBench-E bucket in words, else _label
    not_understood,
    series_name,
    summary_name,
    summary_rows,
)

# What each row was trained as, from the checkpoint's meta: these columns after the run in every table.
CHECKPOINT_COLUMNS = ("paradigm", "model", "data")
CHECKPOINT_HEADER = ("paradigm", "model", "training data")  # not the data a benchmark evaluated on
ColumnValues = dict[tuple[str, str], tuple[float, float | None]]  # (run, column) -> (mean, mean stderr)


@dataclass
class RunInfo:
    run: str
    steps: list[int] = field(default_factory=list)
    described: tuple[str, str, str] = ("?", "?", "?")  # CHECKPOINT_COLUMNS
    settings: dict = field(default_factory=dict)  # RULER: tasks, samples, seed per run
    skipped: dict[tuple[str, int], str] = field(default_factory=dict)


def encoding_series(ruler: list[dict]) -> list[dict]:
    """Each RULER summary as one summary per encoding it holds, its run named as the series
    (ResultRow.series): every table and plot shows two encodings as two rows, never averaged."""
    split = []
    for summary in ruler:
        rows: dict[str, list[ResultRow]] = defaultdict(list)
        skips: dict[str, list[dict]] = defaultdict(list)
        for row in summary_rows(summary):
            rows[row.series()].append(row)
        for skip in summary.get("skipped", []):
            skips[series_name(summary["run"], skip.get("encoding"), skip.get("doc_tokens"))].append(skip)
        for name in sorted(set(rows) | set(skips), key=lambda name: (name != summary["run"], name)):
            # its encoding is in the name now, so each row reads as standard
            standard = [replace(row, run=name, encoding=STANDARD, doc_tokens=None) for row in rows[name]]
            split.append({**summary, "run": name, "rows": standard, "skipped": skips[name]})
    return split


def run_infos(ruler: list[dict]) -> dict[str, RunInfo]:
    infos: dict[str, RunInfo] = {}
    for summary in ruler:
        info = infos.setdefault(summary["run"], RunInfo(summary["run"]))
        info.steps.append(int(summary["step"]))
        info.described = describe_checkpoint(summary)
        settings = summary.get("provenance", {}).get("settings", {})
        # another prompt format: another task
        key = {"tasks": tuple(sorted(settings.get("tasks", []))), "samples": settings.get("num_samples"),
               "seed": settings.get("seed"), "sizing": settings.get("sizing", "exact"),
               "prompt_format": settings.get("prompt_format", "base")}  # fmt: skip
        if info.settings and info.settings != key:
            raise UserError(
                f"run {info.run}: its checkpoints were evaluated with different settings; re-run them alike"
            )
        info.settings = key
        for skip in summary.get("skipped", []):
            info.skipped[(skip["task"], int(skip["length"]))] = skip["reason"]
    return infos


def ruler_cells(rows: list[ResultRow], category: Category = RULER) -> dict[tuple[str, int], RunAverage]:
    """--avg's (run, length) cells, without its demand that every checkpoint scored the same tasks."""
    averages = length_averages(rows, same_tasks=False, category=category)
    return {(average.run, average.length): average for average in averages}


def _best(values: dict[str, float]) -> set[str]:
    """The one run strictly ahead (at the shown precision) of at least one other: a tie has no
    best, so neither does a column where every run scores the same (the zeros of untrained runs)."""
    shown = {run: round(v, 2) for run, v in values.items()}
    leaders = [run for run, v in shown.items() if v == max(shown.values())]
    return set(leaders) if len(leaders) == 1 < len(shown) else set()


def ahead_by_compare(means: dict[tuple[str, int], float], series: dict | None) -> dict[int, set[str]]:
    """Per length, the run (or series of seeds) to bold: the strict leader by `means` that compare's
    test finds ahead of every other (docs/leaderboards.md)."""
    from evalkit.results.compare import compare, significant

    runs_at: dict[int, set[str]] = defaultdict(set)
    for run, n in means:
        runs_at[n].add(run)
    bold: dict[int, set[str]] = {n: set() for n in runs_at}
    runs = set().union(*runs_at.values())
    if series is None or not runs <= set(series):
        return bold
    ahead = {n: _best({run: means[(run, n)] for run in at}) for n, at in runs_at.items()}  # before any test
    for leader in sorted(set().union(*ahead.values())):
        others = sorted(runs - {leader})
        try:
            found = compare({run: series[run] for run in [leader, *others]}, [leader, *others], baseline=leader, seed=0)
        except UserError:
            continue  # logs compare cannot read alike: no test, no bold
        for n, candidates in ahead.items():
            behind = [d for d in found.averages if d.length == n]
            if leader in candidates and len(behind) == len(runs_at[n]) - 1:
                if all(d.difference < 0 and significant(d) for d in behind):
                    bold[n].add(leader)
    return bold


def ruler_table(
    rows: list[ResultRow], infos: dict[str, RunInfo], best: dict[int, set[str]], category: Category = RULER
) -> str:
    """`best`: per length, the runs to bold (ahead_by_compare)."""
    cells = ruler_cells(rows, category)
    lengths = sorted({length for _, length in cells})
    differs = _differing_settings(infos)
    table = []
    for run, info in sorted(infos.items()):
        mine = {n: cells[(run, n)] for n in lengths if (run, n) in cells}
        text = [_spread(run, n, best, (mine[n].mean, mine[n].std) if n in mine else None) for n in lengths]
        # never bold: compare tests no average over lengths
        avg = f"{statistics.fmean(cell.mean for cell in mine.values()):.2f}" if mine else "–"
        behind = _behind(mine, info.settings.get("samples"))
        mark = " †" if run in differs else ""
        table.append([f"{run}{mark}", *info.described, ", ".join(map(str, sorted(info.steps))), *text, avg, behind])
    header = ["run", *CHECKPOINT_HEADER, "steps", *map(_label, lengths), "avg", "behind each value"]
    return markdown_table(header, table)


def _spread(run: str, n: int, best: dict[int, set[str]], found: tuple[float, float] | None) -> str:
    """A RULER cell: mean ± std, bold where `best` (ahead_by_compare) names the run at length n."""
    text = "–" if found is None else f"{found[0]:.2f} ± {found[1]:.2f}"
    return f"**{text}**" if run in best.get(n, set()) else text


SEED_RUN = re.compile(r"(?P<series>.+)-seed\d+")  # docs/comparing.md's loop names each run NAME-seedN


def seed_series(infos: dict[str, RunInfo]) -> dict[str, list[str]]:
    """Runs NAME-seedN as the seeds of NAME, where two or more are, all trained alike."""
    groups: dict[str, list[str]] = defaultdict(list)
    for run in sorted(infos):
        found = SEED_RUN.fullmatch(run)
        if found:
            groups[found["series"]].append(run)
    return {name: runs for name, runs in groups.items() if len({infos[run].described for run in runs}) == 1 < len(runs)}


def seeds_table(rows: list[ResultRow], groups: dict[str, list[str]], logged: dict | None, threshold: float) -> str:
    from evalkit.results.compare import Bootstrap, effective_length
    from evalkit.results.compare_report import interval, length_or_below
    from evalkit.results.samples import Series

    cells = ruler_cells(rows)
    lengths = sorted({n for _, n in cells})
    per_run = {(name, n): [cells[(run, n)].mean for run in runs if (run, n) in cells]
               for name, runs in groups.items() for n in lengths}  # fmt: skip
    values = {key: found for key, found in per_run.items() if len(found) == len(groups[key[0]])}
    series = None
    if logged is not None and all(run in logged for runs in groups.values() for run in runs):
        series = {name: Series(name, paradigm=logged[runs[0]].paradigm, runs=[logged[run] for run in runs])
                  for name, runs in groups.items()}  # fmt: skip
    best = ahead_by_compare({key: statistics.fmean(found) for key, found in values.items()}, series)
    table = []
    for name, runs in groups.items():
        spreads = {n: (statistics.fmean(v), statistics.stdev(v)) for (s, n), v in values.items() if s == name}
        shown = [_spread(name, n, best, spreads.get(n)) for n in lengths]
        effective = "– (no per-sample logs)"
        if series is not None:
            try:
                e = effective_length(Bootstrap({name: series[name]}, 2000, seed=0), name, threshold)
                effective = f"{length_or_below(e.length, min(e.scores))} {interval(e, min(e.scores))}"
            except UserError as err:  # logs the bootstrap cannot use
                effective = f"– (per-sample logs unusable: {err})"
        table.append([name, ", ".join(runs), *shown, effective])
    header = ["series", "runs", *map(_label, lengths), f"effective length (≥ {threshold:.2f}) [95% interval]"]
    return markdown_table(header, table)


def _behind(cells: dict[int, RunAverage], samples) -> str:
    """Checkpoints, tasks and samples behind a run's values; the lengths named when counts differ."""
    by_count: dict[tuple[int, int], list[int]] = defaultdict(list)
    for n, cell in cells.items():
        by_count[(len(cell.checkpoints), len(cell.tasks))].append(n)
    if len(by_count) == 1:
        ((k, t),) = by_count
        return f"{k} ckpt × {t} tasks × {samples} samples"
    parts = [
        f"{k} ckpt × {t} tasks at {', '.join(_label(n) for n in ns)}"
        for (k, t), ns in sorted(by_count.items(), key=lambda kv: kv[1])
    ]
    return "; ".join(parts) + f"; {samples} samples each"


def _differing_settings(infos: dict[str, RunInfo]) -> set[str]:
    """Runs whose RULER settings differ from the most common ones (marked †)."""
    keys = {run: json.dumps(info.settings, sort_keys=True, default=list) for run, info in infos.items()}
    common = Counter(keys.values()).most_common(1)  # a tie goes to the first run's settings
    return {run for run, key in keys.items() if key != common[0][0]}


def per_task_table(rows: list[ResultRow]) -> str:
    cells: dict[tuple[str, str, int], list[ResultRow]] = defaultdict(list)
    for row in rows:
        if row.length is not None:  # every RULER row has one
            cells[(row.run, row.task, row.length)].append(row)
    lengths = sorted({n for _, _, n in cells})
    table = []
    for run, task in sorted({(r, t) for r, t, _ in cells}):
        shown = [_task_cell(cells[(run, task, n)]) if (run, task, n) in cells else "–" for n in lengths]
        table.append([run, task, *shown])
    return markdown_table(["run", "task", *map(_label, lengths)], table)


def _task_cell(rows: list[ResultRow]) -> str:
    if len(rows) == 1 and rows[0].stderr is not None:
        return f"{rows[0].value:.2f} ± {rows[0].stderr:.2f}"
    return f"{statistics.fmean(row.value for row in rows if row.value is not None):.2f}"


Shown = tuple[ResultRow, str]  # a row the board tables, with what it was measured on beyond its column ("": nothing)


def shown_rows(summary: dict) -> list[Shown]:
    """A non-RULER summary's rows, each with what it was measured on beyond its column; of lm-eval's,
    the tasks asked for (mmlu, not its 57 subjects)."""
    rows = summary_rows(summary)
    if summary.get("benchmark") == "general":
        rows = [row for row in rows if (row.requested or row.task) == row.task]
    # the evaluation data: ppl's `eval_data` (--data's name and a hash of the documents read); a ppl
    # summary written before it: --data's name, its documents unrecorded; other benchmarks record none
    provenance = summary.get("provenance") or {}
    settings, data = provenance.get("settings") or {}, provenance.get("eval_data")
    if isinstance(data, dict):
        data = f"{data.get('name', '?')} (sha256 {str(data.get('sha256', '?'))[:8]})"
    elif summary.get("benchmark") == "ppl" and isinstance(settings.get("data"), str):
        data = f"{Path(settings['data']).name or settings['data']} (documents not recorded)"
    else:
        data = ""
    limit = settings.get("limit")
    limited = f", limit {limit}" if limit is not None else ""
    return [(row, data or ("" if row.num_fewshot is None else f"{row.num_fewshot}-shot{limited}")) for row in rows]


def _columns(shown: list[Shown], separator: str) -> list[str]:
    """Each row's column: task/metric (an lm-eval filter other than none: a metric of its own) and
    length, split by what the rows were measured on where one column's rows differ there: numbers
    from two data sets (or shots) never stand in one column."""
    bases = [
        f"{row.task}{separator}{row.metric}"
        + (f" ({row.filter})" if row.filter not in (None, "none") else "")
        + (f" @ {length_text(row.task, row.length)}" if row.length is not None else "")
        for row, _ in shown
    ]
    measured: dict[str, set[str]] = defaultdict(set)
    for base, (_, on) in zip(bases, shown):
        measured[base].add(on)
    return [base if len(measured[base]) == 1 else f"{base}{separator}[{on}]" for base, (_, on) in zip(bases, shown)]


def benchmark_cells(shown: list[Shown], separator: str = " ") -> ColumnValues:
    """(run, column) -> the mean over its checkpoints with a number and the mean of their stderrs (None
    where none is recorded): one column per task/metric (and length; _columns)."""
    values: dict[tuple[str, str], list[tuple[float, float | None]]] = defaultdict(list)
    for (row, _), column in zip(shown, _columns(shown, separator)):
        if row.value is not None:
            values[(row.series(), column)].append((row.value, row.stderr))  # an encoding: a series of its own
    cells: ColumnValues = {}
    for key, found in values.items():
        errors = [error for _, error in found if error is not None]
        cells[key] = (statistics.fmean(value for value, _ in found), statistics.fmean(errors) if errors else None)
    return cells


# The long-context board: (benchmark, axis) -> (run -> length -> mean over checkpoints). The axis is
# "tokens", or "words" for LongBench-E's buckets (LongBench counts words): never one column.
Board = dict[tuple[str, str], dict[str, dict[int, float]]]


def long_context_board(ruler: list[dict], general: list[dict]) -> Board:
    """Each long-context benchmark of the summaries per length, named with its metric: RULER's and HELMET Recall's
    task averages (as their tables), LongBench-E's buckets and BABILong's lengths as the mean over
    tasks of each task's mean over checkpoints (LongBench's `score`, BABILong's `acc`)."""
    from evalkit.store.result_format import LONGBENCH_E, is_babilong

    ruler_rows = [row for summary in ruler for row in summary["rows"]]  # encoding_series' summaries
    general_rows = [row for summary in general for row, _ in shown_rows(summary)]
    board: Board = {}
    for category, label in ((RULER, "RULER (string_match, mean of tasks)"),
                            (HELMET_RECALL, "HELMET Recall (recall and SubEM, mean of 4)")):  # fmt: skip
        for (run, length), cell in ruler_cells(ruler_rows, category).items():
            board.setdefault((label, "tokens"), {}).setdefault(run, {})[length] = cell.mean
    picks = (
        (lambda task: bool(LONGBENCH_E.fullmatch(task)), "score", ("LongBench-E (score, mean of tasks)", "words")),
        (is_babilong, "acc", ("BABILong (acc, mean of tasks)", "tokens")),
    )
    for belongs, metric, key in picks:
        by_task: dict[tuple[str, int, str], list[float]] = defaultdict(list)
        for row in general_rows:
            if row.length is not None and row.value is not None and row.metric == metric and belongs(row.task):
                by_task[(row.series(), row.length, row.task)].append(row.value)  # one per checkpoint
        for run, length in dict.fromkeys((run, length) for run, length, _ in by_task):
            means = [statistics.fmean(values) for (r, n, _), values in by_task.items() if (r, n) == (run, length)]
            board.setdefault(key, {}).setdefault(run, {})[length] = statistics.fmean(means)
    return board


def board_table(board: Board) -> str:
    """One row per benchmark and run, one column per length (tokens, then LongBench-E's word buckets)."""
    from evalkit.store.result_format import LONGBENCH_E_BUCKETS

    columns = sorted({(axis, n) for (_, axis), runs in board.items() for cells in runs.values() for n in cells},
                     key=lambda column: (column[0] == "words", column[1]))  # fmt: skip
    header = [LONGBENCH_E_BUCKETS[n] if axis == "words" else _label(n) for axis, n in columns]
    table = [
        [label, run, *(f"{runs[run][n]:.2f}" if a == axis and n in runs[run] else "" for a, n in columns)]
        for (label, axis), runs in board.items()
        for run in sorted(runs)
    ]
    return markdown_table(["benchmark (metric)", "run", *header], table)


def checkpoint_means(rows: list[ResultRow]) -> dict[str, dict[int, float]]:
    """run -> step -> the checkpoint's RULER average over lengths (of its per-length task averages)."""
    per_step: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (run, step, _length), (mean, _tasks) in per_checkpoint_length_means(rows, RULER).items():
        per_step[run][step].append(mean)
    return {run: {step: statistics.fmean(means) for step, means in steps.items()} for run, steps in per_step.items()}


def benchmark_table(shown: list[Shown]) -> str:
    rows = [row for row, _ in shown]
    described = {row.series(): tuple(getattr(row, name) for name in CHECKPOINT_COLUMNS) for row in rows}
    values = benchmark_cells(shown)
    columns_of = _columns(shown, " ")
    missing: dict[tuple[str, str], list[str]] = defaultdict(list)
    on: dict[str, set[str]] = defaultdict(set)
    for (row, measured), column in zip(shown, columns_of):
        on[row.series()].add(measured)
        if row.value is None:
            # why: LongPPL over no key token, or the benchmark's NaN (lm-eval's)
            missing[(row.series(), column)].append("0 key tokens" if "longppl" in row.metric else "no number")
    columns = sorted(set(columns_of))
    evaluated = any(any(found) for found in on.values())  # a column only where a row records it
    table = [
        [
            run,
            *described[run],
            *(["; ".join(sorted(on[run]))] if evaluated else []),
            *(_cell(values.get((run, column)), missing.get((run, column), [])) for column in columns),
        ]
        for run in sorted(on)
    ]
    text = markdown_table(["run", *CHECKPOINT_HEADER, *(["evaluated on"] if evaluated else []), *columns], table)
    zero = any("0 key tokens" in reasons for reasons in missing.values())
    return f"{text}\n\n{NO_KEY_TOKENS}." if zero else text


def _cell(found: tuple[float, float | None] | None, missing: list[str]) -> str:
    mean = "–" if found is None else f"{found[0]:.4f}" + ("" if found[1] is None else f" ± {found[1]:.4f}")
    if not missing:
        return mean
    why = ", ".join(sorted(set(missing)))
    return f"– ({why})" if found is None else f"{mean} (not in the mean: {len(missing)} ckpt, {why})"


def provenance_notes(summaries: list[dict]) -> str:
    lines: dict[str, str] = {}  # one line per engine and evalkit of a run: the first summary's tokenizer
    for summary in summaries:
        p = summary.get("provenance", {})
        engine = p.get("engine", {})
        line = (
            f"- {summary['benchmark']} {summary['run']}: engine {engine.get('engine')}, dtype "
            f"{engine.get('dtype')}, batch size {engine.get('batch_size')}, evalkit {p.get('evalkit_version')} "
            f"({p.get('git_hash')})"
        )
        lines.setdefault(line, f"{line}, tokenizer {engine.get('tokenizer_fingerprint', '?')}")
    return "\n".join(lines.values())


def benchmark_summaries(dirs: list[Path], notes: list[str] | None = None) -> dict[str, list[dict]]:
    """Every benchmark's summaries under `dirs`, by name: RULER's, lm-eval tasks', then the others by
    name. One that holds nothing to table is left out, a line saying why added to `notes`."""
    stored = {path.name[: -len(SUMMARY_SUFFIX)] for d in dirs for path in Path(d).rglob(f"*{SUMMARY_SUFFIX}")}
    found: dict[str, list[dict]] = {}
    for name in ("ruler", "general", *sorted(stored - {"ruler", "general"})):
        for path, summary in summary_files(dirs, summary_name(name), notes):
            why = _nothing_to_table(name, summary)
            if why is None:
                found.setdefault(name, []).append(summary)
            elif notes is not None:
                notes.append(f"- {path}: not in any table: {why}")
    return found


def _nothing_to_table(name: str, summary: dict) -> str | None:
    """Why a summary adds nothing to any table (None: it does): no row (RULER's skips are listed)."""
    skipped = summary.get("skipped") or []
    if (summary["rows"] or skipped) if name == "ruler" else shown_rows(summary):
        return None
    if not summary["rows"]:
        first = skipped[0].get("reason") if skipped and isinstance(skipped[0], dict) else None
        return "it holds no row" + (f": every cell was skipped ({first})" if first else "")
    return f"none of its {len(summary['rows'])} rows is of a task asked for (only a group's members)"


def logged_series(dirs: list[Path]) -> tuple[dict | None, str]:
    """(The series of the per-sample logs under `dirs`, or None, and why not)."""
    from evalkit.results.samples import merge, read_directory

    series: dict = {}
    try:
        for directory in dirs:
            for name, one in read_directory(directory).items():
                if series.setdefault(name, one) is not one:  # the run's RULER and lm-eval results, two directories
                    merge(series[name], one)
    except UserError as err:  # a board of summaries only (or unusable logs)
        return None, "no per-sample logs" if "is missing" in str(err) else f"per-sample logs unusable: {err}"
    return series, "no per-sample logs"


def effective_length_table(
    logged: tuple[dict | None, str],
    rows: list[ResultRow],
    threshold: float | None = None,
    threshold_from: str | None = None,
) -> tuple[str, float]:
    """Each run's effective length: the point from the table's means, the interval from the logs."""
    from evalkit.results.compare import RULER_THRESHOLD, Bootstrap, effective_length, longest_holding
    from evalkit.results.compare_report import interval, length_or_below

    cells = ruler_cells(rows)
    runs = sorted({run for run, _ in cells})
    lengths = {run: sorted(n for r, n in cells if r == run) for run in runs}
    if threshold_from is not None:
        if threshold_from not in lengths:
            raise UserError(f"--threshold-from {threshold_from!r}: no RULER run of that name ({', '.join(runs)})")
        threshold = cells[(threshold_from, lengths[threshold_from][0])].mean
    threshold = RULER_THRESHOLD if threshold is None else threshold
    series, unusable = logged
    boot = None
    if series is not None:
        try:
            boot = Bootstrap({name: series[name] for name in runs if name in series}, 2000, seed=0)
        except UserError as err:  # logs the bootstrap cannot use: points without intervals
            unusable = f"per-sample logs unusable: {err}"
    table = []
    for run in runs:
        point = longest_holding(lengths[run], [cells[(run, n)].mean for n in lengths[run]], threshold)
        spread = f"– ({unusable})"
        if boot is not None and run in boot.series and any(c.benchmark == "ruler" for c in boot.series[run].cells()):
            spread = interval(effective_length(boot, run, threshold), lengths[run][0])
        table.append([run, length_or_below(point, lengths[run][0]), spread])
    return markdown_table(["run", "effective length", "95% interval (bootstrap, seed 0)"], table), threshold


def failure_records(dirs: list[Path]) -> list[Path]:
    """The <name>-failed.json files a sweep left under `dirs` (one per checkpoint that failed)."""
    return sorted({p.resolve() for d in dirs for p in Path(d).rglob(f"*{FAILED_SUFFIX}")})


def nothing_to_show(found_none: str, dirs: list[Path]) -> UserError:
    """No result to show: failure records named where there are some (rerunning is not "first")."""
    where = ", ".join(map(str, dirs))
    records = failure_records(dirs)
    if not records:
        return UserError(f"{found_none} under {where}; run evalkit ruler/general first")
    shown = ", ".join(map(str, records[:3])) + (f" and {len(records) - 3} more" if len(records) > 3 else "")
    return UserError(
        f"{found_none} under {where}, but {len(records)} failure record{'s' if len(records) > 1 else ''} "
        f"({shown}): those checkpoints failed; each record gives the reason: mend them and rerun"
    )


def failure_notes(dirs: list[Path]) -> str:
    """One line per checkpoint a sweep recorded as failed (<name>-failed.json), with its reason."""
    lines = []
    for path in failure_records(dirs):
        try:
            record = json.loads(path.read_text())
            reason = not_understood(path, record, FAILED_SUFFIX)
            line = f"- {record['run']} step {record['step']} ({record['benchmark']}): {record['reason']}"
            line = line if reason is None else f"- {path}: not read: {reason}"
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
            line = f"- {path}: a failure record that cannot be read"
        lines.append(line.replace("\n", " "))
    return "\n".join(lines)


def build_markdown(
    dirs: list[Path], threshold: float | None = None, threshold_from: str | None = None, depth: dict | None = None
) -> tuple[str, list[dict], list[dict]]:
    """`depth`: depth.depth_runs(dirs), if read already."""
    from evalkit.results.depth import TITLE as DEPTH_TITLE
    from evalkit.results.depth import depth_runs, depth_sections

    unread: list[str] = []
    others = benchmark_summaries(dirs, unread)
    ruler = encoding_series(others.pop("ruler", []))
    general = others.get("general", [])  # tabled with the others (benchmark_summaries' order), plotted apart
    if not ruler and not others:
        left_out = f" ({len(unread)} left out: {unread[0][2:]})" if unread else ""
        raise nothing_to_show(f"no {RULER_SUMMARY}, {GENERAL_SUMMARY} or other *{SUMMARY_SUFFIX}{left_out}", dirs)
    parts = [TITLE, ""]
    section = lambda title, *body: parts.extend([f"## {title}", "", *body, ""])  # noqa: E731
    if ruler:
        rows = [row for s in ruler for row in s["rows"]]
        infos = run_infos(ruler)
        logged = logged_series(dirs)
        best = ahead_by_compare({k: c.mean for k, c in ruler_cells(rows).items()}, logged[0])
        section(
            "RULER (mean ± std over each run's checkpoints of the per-length task average; bold: ahead of the rest "
            "by `evalkit compare`'s test, Holm-adjusted p < 0.05 on the per-sample logs)",
            ruler_table(rows, infos, best),
        )
        differs = sorted(_differing_settings(infos))
        if differs:
            parts.append("† evaluated with different settings than the other runs (not directly comparable):")
            for run in differs:
                s = infos[run].settings
                parts.append(
                    # run_infos' key: every field present
                    f"- {run}: tasks {', '.join(s['tasks'])}; {s['samples']} samples; seed {s['seed']}; "
                    f"sizing {s['sizing']}; prompt format {s['prompt_format']}"
                )
            parts.append("")
        skipped = [f"- {run}: {task} at {_label(n)} skipped: {why}"
                   for run in sorted(infos) for (task, n), why in sorted(infos[run].skipped.items())]  # fmt: skip
        parts += ["Skipped tasks (not scored, not averaged):", "", "\n".join(skipped) or "- none", ""]
        effective, used = effective_length_table(logged, rows, threshold, threshold_from)
        section(f"RULER effective length (the longest length whose task average is ≥ {used:.2f} there and at every "
                "shorter length)", effective)  # fmt: skip
        groups = seed_series(infos)
        if groups:
            section(
                "RULER over seeds (runs NAME-seedN as replicates of NAME: mean ± std over the runs of each run's "
                "value above; bold and intervals by `evalkit compare`'s bootstrap over runs, then checkpoints, "
                "then samples)",
                seeds_table(rows, groups, logged[0], used),
            )
        recall = {run for run, _ in ruler_cells(rows, HELMET_RECALL)}
        if recall:
            title = f"HELMET Recall (as RULER's, of {', '.join(HELMET_RECALL.tasks)}, where all four are scored)"
            section(title, ruler_table(rows, {run: infos[run] for run in recall}, {}, HELMET_RECALL))
        section("RULER per task (mean over checkpoints; one checkpoint: score ± standard error over its samples)",
                per_task_table(rows))  # fmt: skip
        depth = depth_runs(dirs) if depth is None else depth
        if depth:
            section(DEPTH_TITLE, *depth_sections(depth))
    board = long_context_board(ruler, general)
    if len(board) > 1:  # RULER alone has its own table
        section("Long context by length (each benchmark in its own metric and units; mean over checkpoints)",
                board_table(board))  # fmt: skip
    for name, summaries in others.items():
        default = "General tasks" if name == "general" else name
        title = next((s["title"] for s in summaries if isinstance(s.get("title"), str)), default)  # the benchmark's own
        shown = [one for summary in summaries for one in shown_rows(summary)]
        errors = " ± stderr" if any(row.stderr is not None for row, _ in shown) else ""  # ppl's rows never hold one
        section(f"{title} (mean over checkpoints{errors})", benchmark_table(shown))
    if unread:
        parts += ["## " + not_read_note(unread), ""]
    failures = failure_notes(dirs)
    if failures:
        section("Failed checkpoints (not scored; rerun them once mended)", failures)
    everything = ruler + [summary for summaries in others.values() for summary in summaries]
    section("Provenance", provenance_notes(everything), "")
    return "\n".join(parts), ruler, general


def write_export(dirs: list[Path], out: Path, form: str, unread: list[str] | None = None) -> Path:
    """--format csv|json: every stored number under `dirs` as a long-form row of EXPORT_FIELDS; a
    summary of another format is left out, a line saying why added to `unread` (JSON: "not_read")."""
    import csv
    import io

    from evalkit.files import atomic_write_json, atomic_write_text
    from evalkit.results.compare_report import finite
    from evalkit.store.provenance import stamp

    summaries = [summary for found in benchmark_summaries(dirs, unread).values() for summary in found]
    # A number lm-eval could not compute (NaN) is an empty cell / null, so strict parsers read the file.
    rows = [finite(export_record(row)) for summary in summaries for row in summary_rows(summary)]
    if not rows:
        raise nothing_to_show(f"no *{SUMMARY_SUFFIX} with rows", dirs)
    fields = list(EXPORT_FIELDS)
    if form == "json":
        atomic_write_json(out, {"fields": fields, "rows": rows, "not_read": unread or [], "provenance": stamp()})
    else:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(out, text.getvalue())
    return out


TITLE = "# Leaderboard"  # the first line of the markdown, by which a rerun knows it as its own
# write_leaderboard's figures, .png and .svg
PLOT_STEMS = ("ruler-vs-length", "ruler-vs-step", "general", "niah-depth", "niah-depth-difference", "long-context")


def check_leaderboard_outputs(out: Path, plots_dir: Path | None = None) -> None:
    """Before any work: the markdown and figures write_leaderboard replaces are none of the user's."""
    from evalkit.files import refuse_foreign

    refuse_foreign([out], heading=TITLE)
    plots_dir = plots_dir or out.parent / "plots"
    refuse_foreign([plots_dir / f"{stem}{suffix}" for stem in PLOT_STEMS for suffix in (".png", ".svg")], "--plots")


def write_leaderboard(
    dirs: list[Path],
    out: Path,
    plots_dir: Path | None = None,
    threshold: float | None = None,
    threshold_from: str | None = None,
) -> Path:
    """The leaderboard markdown at `out`, its plots in plots_dir (default: plots/ beside it)."""
    import os

    from evalkit.files import atomic_write_text
    from evalkit.results import plots
    from evalkit.results.depth import depth_runs, differences

    depth = depth_runs(dirs)
    markdown, ruler, general = build_markdown(dirs, threshold, threshold_from, depth)
    plots_dir = plots_dir or out.parent / "plots"
    written = []
    if ruler:
        rows = [row for summary in ruler for row in summary["rows"]]
        cells = {key: (cell.mean, cell.std) for key, cell in ruler_cells(rows).items()}
        written += plots.ruler_vs_length(cells, plots_dir / "ruler-vs-length")
        written += plots.ruler_vs_step(checkpoint_means(rows), plots_dir / "ruler-vs-step")
    if depth:
        written += plots.depth_heatmaps({name: run.grid() for name, run in depth.items()}, plots_dir / "niah-depth")
    gaps = differences(depth)
    if gaps:
        written += plots.depth_heatmaps(gaps, plots_dir / "niah-depth-difference", difference=True)
    if general:
        shown = [one for summary in general for one in shown_rows(summary)]
        written += plots.general_bars(benchmark_cells(shown, "\n"), plots_dir / "general")
    board = long_context_board(ruler, general)
    if len(board) > 1:
        written += plots.long_context(board, plots_dir / "long-context")
    figures = [p for p in written if p.suffix == ".png"]
    if figures:
        markdown += "## Plots\n\n" + "\n".join(f"![{p.stem}]({os.path.relpath(p, out.parent)})" for p in figures) + "\n"
    atomic_write_text(out, markdown)
    return out
