"""`evalkit leaderboard`: markdown tables and plots from stored summaries, never re-running.

Reads every ruler-summary.json and general-summary.json under the given directories. RULER:
one row per run, one column per length plus the average, each value the mean over the run's
checkpoints of the per-length task average, with its spread, the best cell per column in
bold, and the checkpoints, tasks and samples behind every value; a second table per task.
Runs evaluated with different settings are marked, not silently compared.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import UserError
from evalkit.results.aggregate import per_checkpoint_length_means

RULER_SUMMARY = "ruler-summary.json"
GENERAL_SUMMARY = "general-summary.json"


@dataclass
class RunInfo:
    """What a row of the leaderboard stands for, read from the stored summaries."""

    run: str
    steps: list[int] = field(default_factory=list)
    paradigm: str = "?"
    model: str = "?"
    data: str = "?"
    settings: dict = field(default_factory=dict)  # RULER: tasks, samples, seed per run
    skipped: dict[tuple[str, int], str] = field(default_factory=dict)


def find_summaries(dirs: list[Path], name: str) -> list[dict]:
    found = []
    for directory in dirs:
        for path in sorted(Path(directory).rglob(name)):
            try:
                found.append(json.loads(path.read_text()))
            except (OSError, json.JSONDecodeError) as err:
                raise UserError(f"cannot read {path}: {err}") from None
    return found


def _describe_checkpoint(summary: dict) -> tuple[str, str, str]:
    """(paradigm, model, data) from the checkpoint's meta.json as recorded in the summary."""
    meta = summary.get("provenance", {}).get("checkpoint_meta") or {}
    if isinstance(meta.get("source"), dict):  # an `evalkit import`: a pretrained model, not trained here
        return "pretrained", str(meta.get("model", "?")), f"{meta['source'].get('file_type') or 'GGUF'} import"
    config = meta.get("config") or {}
    model = config.get("model") or {}
    if model.get("path"):
        model_text = Path(model["path"]).name
    elif model:
        model_text = f"{model.get('arch', '?')} {model.get('num_layers', '?')}x{model.get('hidden_size', '?')}"
    else:
        model_text = "?"
    data = (config.get("data") or {}).get("source", "?")
    return meta.get("paradigm", "?"), model_text, data


def run_infos(ruler: list[dict]) -> dict[str, RunInfo]:
    infos: dict[str, RunInfo] = {}
    for summary in ruler:
        info = infos.setdefault(summary["run"], RunInfo(summary["run"]))
        info.steps.append(int(summary["step"]))
        info.paradigm, info.model, info.data = _describe_checkpoint(summary)
        settings = summary.get("provenance", {}).get("settings", {})
        key = {"tasks": tuple(sorted(settings.get("tasks", []))), "samples": settings.get("num_samples"),
               "seed": settings.get("seed"), "sizing": settings.get("sizing", "exact")}  # fmt: skip
        if info.settings and info.settings != key:
            raise UserError(f"run {info.run}: its checkpoints were evaluated with different settings; re-run them alike")
        info.settings = key
        for skip in summary.get("skipped", []):
            info.skipped[(skip["task"], int(skip["length"]))] = skip["reason"]
    for info in infos.values():
        info.steps.sort()
    return infos


def _label(length: int) -> str:
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)


@dataclass
class Cell:
    mean: float
    std: float
    checkpoints: int
    tasks: int


def ruler_cells(rows: list[dict]) -> dict[tuple[str, int], Cell]:
    """(run, length) -> mean ± std over checkpoints of the per-checkpoint task average."""
    per_run: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
    for (run, _step, length), (mean, tasks) in per_checkpoint_length_means(rows).items():
        per_run[(run, length)].append((mean, len(tasks)))
    return {
        key: Cell(statistics.fmean(m for m, _ in values), statistics.pstdev(m for m, _ in values), len(values),
                  max(t for _, t in values))
        for key, values in per_run.items()
    }  # fmt: skip


def _best(values: dict[str, float]) -> set[str]:
    if not values:
        return set()
    top = max(round(v, 2) for v in values.values())
    return {run for run, v in values.items() if round(v, 2) == top}


def ruler_table(rows: list[dict], infos: dict[str, RunInfo]) -> str:
    cells = ruler_cells(rows)
    runs = sorted(infos)
    lengths = sorted({length for _, length in cells})
    averages = {run: statistics.fmean(cells[(run, n)].mean for n in lengths if (run, n) in cells)
                for run in runs if any((run, n) in cells for n in lengths)}  # fmt: skip
    best = {n: _best({run: cells[(run, n)].mean for run in runs if (run, n) in cells}) for n in lengths}
    best_avg = _best(averages)
    differs = _differing_settings(infos)
    header = "| run | paradigm | model | data | steps | " + " | ".join(_label(n) for n in lengths) + " | avg | behind each value |"
    lines = [header, "|" + "---|" * (6 + len(lengths) + 1)]
    for run in runs:
        info = infos[run]
        text = []
        for n in lengths:
            cell = cells.get((run, n))
            if cell is None:
                text.append("–")
                continue
            value = f"{cell.mean:.2f} ± {cell.std:.2f}"
            text.append(f"**{value}**" if run in best[n] else value)
        avg = f"{averages[run]:.2f}" if run in averages else "–"
        avg = f"**{avg}**" if run in best_avg else avg
        behind = _behind(cells, run, lengths, info.settings.get("samples"))
        mark = " †" if run in differs else ""
        lines.append(f"| {run}{mark} | {info.paradigm} | {info.model} | {info.data} | {', '.join(map(str, info.steps))} | "
                     + " | ".join(text) + f" | {avg} | {behind} |")  # fmt: skip
    return "\n".join(lines)


def _behind(cells: dict, run: str, lengths: list[int], samples) -> str:
    """Checkpoints, tasks and samples behind a run's values; the lengths named when counts differ."""
    by_count: dict[tuple[int, int], list[int]] = defaultdict(list)
    for n in lengths:
        if (run, n) in cells:
            by_count[(cells[(run, n)].checkpoints, cells[(run, n)].tasks)].append(n)
    if len(by_count) == 1:
        (k, t), = by_count
        return f"{k} ckpt × {t} tasks × {samples} samples"
    parts = [f"{k} ckpt × {t} tasks at {', '.join(_label(n) for n in ns)}" for (k, t), ns in sorted(by_count.items(), key=lambda kv: kv[1])]
    return "; ".join(parts) + f"; {samples} samples each"


def _differing_settings(infos: dict[str, RunInfo]) -> set[str]:
    """Runs whose RULER settings differ from the most common ones (marked †)."""
    if not infos:
        return set()
    counts: dict[str, int] = defaultdict(int)
    for info in infos.values():
        counts[json.dumps(info.settings, sort_keys=True, default=list)] += 1
    common = max(counts, key=lambda k: counts[k])
    return {run for run, info in infos.items() if json.dumps(info.settings, sort_keys=True, default=list) != common}


def per_task_table(rows: list[dict]) -> str:
    """(run, task) rows, one column per length: the mean over the run's checkpoints."""
    scores: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for row in rows:
        scores[(row["run"], row["task"], int(row["length"]))].append(float(row["score"]))
    lengths = sorted({n for _, _, n in scores})
    lines = ["| run | task | " + " | ".join(_label(n) for n in lengths) + " |", "|---|---|" + "---|" * len(lengths)]
    for run, task in sorted({(r, t) for r, t, _ in scores}):
        cells = [f"{statistics.fmean(scores[(run, task, n)]):.2f}" if (run, task, n) in scores else "–" for n in lengths]
        lines.append(f"| {run} | {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def skipped_notes(infos: dict[str, RunInfo]) -> str:
    lines = []
    for run in sorted(infos):
        for (task, length), reason in sorted(infos[run].skipped.items()):
            lines.append(f"- {run}: {task} at {_label(length)} skipped: {reason}")
    return "\n".join(lines)


def settings_notes(infos: dict[str, RunInfo]) -> str:
    differs = _differing_settings(infos)
    if not differs:
        return ""
    lines = ["† evaluated with different settings than the other runs (not directly comparable):"]
    for run in sorted(differs):
        s = infos[run].settings
        lines.append(f"- {run}: tasks {', '.join(s.get('tasks', []))}; {s.get('samples')} samples; seed {s.get('seed')}; "
                     f"sizing {s.get('sizing', 'exact')}")
    return "\n".join(lines)


def headline_rows(general: list[dict]) -> list[dict]:
    """The rows of the tasks users asked for (mmlu itself, not its 57 subjects)."""
    return [row for summary in general for row in summary.get("rows", []) if row.get("requested", row["task"]) == row["task"]]


def general_table(general: list[dict]) -> str:
    """One row per run, one column per task/metric: mean over checkpoints ± stderr (mean of stderrs)."""
    values: dict[tuple[str, str], list[tuple[float, float | None]]] = defaultdict(list)
    for row in headline_rows(general):
        column = f"{row['task']} {row['metric']}"
        values[(row["run"], column)].append((float(row["value"]), row.get("stderr")))
    columns = sorted({c for _, c in values})
    runs = sorted({r for r, _ in values})
    lines = ["| run | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for run in runs:
        cells = []
        for column in columns:
            entries = values.get((run, column))
            if not entries:
                cells.append("–")
                continue
            mean = statistics.fmean(v for v, _ in entries)
            errors = [e for _, e in entries if e is not None]
            cells.append(f"{mean:.4f} ± {statistics.fmean(errors):.4f}" if errors else f"{mean:.4f}")
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def provenance_notes(summaries: list[dict]) -> str:
    seen = set()
    lines = []
    for summary in summaries:
        p = summary.get("provenance", {})
        engine = p.get("engine", {})
        key = (summary.get("benchmark", "ruler"), summary["run"], engine.get("engine"), engine.get("dtype"),
               engine.get("batch_size"), p.get("evalkit_version"), p.get("git_hash"))  # fmt: skip
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"- {key[0]} {summary['run']}: engine {key[2]}, dtype {key[3]}, batch size {key[4]}, "
                     f"evalkit {key[5]} ({key[6]}), tokenizer {engine.get('tokenizer_fingerprint', '?')}")  # fmt: skip
    return "\n".join(lines)


def build_markdown(dirs: list[Path]) -> tuple[str, list[dict], list[dict]]:
    ruler = find_summaries(dirs, RULER_SUMMARY)
    general = find_summaries(dirs, GENERAL_SUMMARY)
    if not ruler and not general:
        raise UserError(f"no {RULER_SUMMARY} or {GENERAL_SUMMARY} under {', '.join(map(str, dirs))}; run evalkit ruler/general first")
    parts = ["# Leaderboard", ""]
    if ruler:
        rows = [row for s in ruler for row in s["rows"]]
        infos = run_infos(ruler)
        parts += ["## RULER (mean ± std over each run's checkpoints of the per-length task average; best in bold)", "",
                  ruler_table(rows, infos), ""]  # fmt: skip
        notes = settings_notes(infos)
        if notes:
            parts += [notes, ""]
        skipped = skipped_notes(infos)
        parts += ["Skipped tasks (not scored, not averaged):", "", skipped or "- none", ""]
        parts += ["## RULER per task (mean over checkpoints)", "", per_task_table(rows), ""]
    if general:
        parts += ["## General tasks (mean over checkpoints ± stderr)", "", general_table(general), ""]
    parts += ["## Provenance", "", provenance_notes(ruler + general), "", ""]
    return "\n".join(parts), ruler, general
