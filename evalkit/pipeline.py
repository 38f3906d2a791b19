"""One evaluation pipeline: every benchmark (RULER, lm-eval tasks, any later one) runs through here.

    refs ──checks──▶ for each checkpoint, one engine (built on first use, closed before the next):
        for each unit of the benchmark (a task, a task at a length):
            stored with the same settings? keep it : evaluate it ──▶ rows, or Skipped(reason)
        ──▶ <out>/<run>/step-<N>/<name>-summary.json   rows, skips, provenance, the checkpoint's meta
    --avg ──▶ <out>/<name>-avg.json, <out>/<name>-avg.md     mean ± std over each run's checkpoints

What the pipeline owns, once for every benchmark: the request checks (engine, its settings, the
output directory, a tokenizer beside every checkpoint) before anything is loaded, the output
lock, the engine's lifecycle, skip records, the summary file and its provenance (the stamp of
the run that computed the scores, not of a rerun that read them back), --avg and progress.

A benchmark is a small protocol (Benchmark below): its units, how a unit is found on disk, how
it is evaluated, how its rows are averaged over checkpoints, and what else its summary keeps.
Adding one is a module implementing it plus an entry in BENCHMARKS (tests/test_pipeline.py
runs a toy benchmark through every part of the pipeline).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from evalkit.errors import Skipped, UserError
from evalkit.provenance import command_line, stamp, stamp_of
from evalkit.results.checkpoints import CheckpointRef, checkpoint_meta
from evalkit.results.store import checkpoint_dir
from evalkit.storage import (
    atomic_write_json,
    atomic_write_text,
    check_output_dir,
    disk_full_error,
    output_lock,
    refuse_foreign,
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

# The registry: every benchmark's name (its files are <name>-summary.json, <name>-avg.*) and the
# title its tables carry in reports and the leaderboard. A benchmark missing here is titled by its name.
BENCHMARKS = {"ruler": "RULER", "general": "General tasks"}


# The format of every file the pipeline writes (summaries, failure records, averages). Raised when
# a reader of the old format would misread the new one; readers skip, with a note, a higher one.
SCHEMA_VERSION = 1


def summary_name(benchmark: str) -> str:
    return f"{benchmark}-summary.json"


def not_understood(path: Path, record: Any, suffix: str = "-summary.json") -> str | None:
    """Why this evalkit cannot read the stored record at `path` (<benchmark><suffix>) as its own
    format, or None: a schema_version it does not know, or a benchmark other than its file name's.
    A record without schema_version is of version 1 (written before versions were recorded)."""
    if not isinstance(record, dict):
        return f"it holds a JSON {type(record).__name__}, not an evalkit record"
    version = record.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        return (
            f"its schema_version is {version!r} and this evalkit reads versions 1 to {SCHEMA_VERSION} "
            "(written by another evalkit version: read it with that one)"
        )
    expected = path.name[: -len(suffix)] if path.name.endswith(suffix) else None
    if "benchmark" in record and expected is not None and record["benchmark"] != expected:
        return f"its benchmark is {record['benchmark']!r}, but its file name says {expected!r}"
    return None


@dataclass(frozen=True)
class Unit:
    """One thing a benchmark scores on a checkpoint: a task, at a length where lengths apply."""

    task: str
    length: int | None = None

    def label(self) -> str:
        return self.task if self.length is None else f"{self.task} @ {self.length}"

    def fields(self) -> dict[str, Any]:
        return {"task": self.task, **({"length": self.length} if self.length is not None else {})}


@dataclass
class UnitResult:
    """What scoring one unit produced: its long-form rows, whatever the benchmark's summary keeps
    of it (`extra`), whether anything was computed now, and the engine that computed it when
    the result was read back from disk (no engine is built for a stored result)."""

    rows: list[dict[str, Any]]
    extra: dict[str, Any] = field(default_factory=dict)
    computed: bool = True
    stored_engine_info: dict[str, Any] | None = None


@dataclass(frozen=True)
class EngineChoice:
    """The engine every checkpoint is evaluated with: its registry name and keyword settings."""

    name: str = "hf"
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Averages:
    """--avg: the records written to <name>-avg.json, the markdown table, and its conditions line."""

    records: list[dict[str, Any]]
    table: str
    conditions: str = ""


Progress = Callable[[Unit, int, int], None]  # (unit, done, total) in the benchmark's own counting


class Benchmark(Protocol):
    """What a benchmark tells the pipeline; everything else is the pipeline's."""

    name: str  # summaries are <name>-summary.json, averages <name>-avg.json/.md
    engine: EngineChoice

    def settings_record(self) -> dict[str, Any]:
        """What the user asked for, recorded in every summary."""

    def check(self, ref: CheckpointRef) -> None:
        """Refuse (UserError) a checkpoint this benchmark cannot evaluate, before any work."""

    def units(self) -> list[Unit]: ...

    def stored(self, ref: CheckpointRef, unit: Unit, out: Path) -> UnitResult | None:
        """The unit's finished result with the same settings, read without an engine, or None."""

    def evaluate(self, engine: LazyEngine, ref: CheckpointRef, unit: Unit, out: Path, progress) -> UnitResult:
        """Score the unit (resuming from what is on disk), or raise Skipped with the reason."""

    def finish_summary(self, summary: dict[str, Any], results: list[UnitResult], earlier: dict | None) -> dict:
        """The summary with the benchmark's own fields added (earlier: the summary on disk, if any)."""

    def average(self, rows: list[dict[str, Any]]) -> Averages: ...


class LazyEngine:
    """The checkpoint's engine, built on first `get()`: a checkpoint whose units are all on disk
    already loads no model. Closed (if built) when the block ends, before the next checkpoint's
    engine starts: two vLLM engines would not fit one GPU."""

    def __init__(self, choice: EngineChoice, path: Path, open_engine: Callable[..., Any] | None = None) -> None:
        self.choice, self.path = choice, path
        self._open = open_engine
        self._engine = None

    def get(self):
        if self._engine is None:
            if self._open is None:
                from evalkit.engines import get_engine

                self._open = get_engine
            self._engine = self._open(self.choice.name, self.path, **self.choice.settings)
        return self._engine

    def info(self) -> dict[str, Any] | None:
        return self._engine.engine_info() if self._engine is not None else None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()

    def __enter__(self) -> LazyEngine:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


@dataclass
class EvaluationRun:
    """What run_benchmark produced: per-checkpoint summaries, all rows, all skips, and (--avg) averages."""

    summaries: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    averages: Averages | None = None
    files: dict[str, Path] = field(default_factory=dict)


def check_request(benchmark: Benchmark, refs: list[CheckpointRef], out: Path) -> None:
    """Everything a user can get wrong, before any model or data is loaded or anything written."""
    from evalkit.engines import ENGINE_NAMES
    from evalkit.precision import check_dtype

    if not refs:
        raise UserError("no checkpoint given: pass --ckpts PATH")
    choice = benchmark.engine
    if choice.name not in ENGINE_NAMES:
        raise UserError(f"unknown engine {choice.name!r}; choose one of: {', '.join(ENGINE_NAMES)}")
    if choice.settings.get("dtype") is not None:
        check_dtype(choice.settings["dtype"])
    for option, key in (("--batch-size", "batch_size"), ("--max-length", "max_length")):
        value = choice.settings.get(key)
        if value is not None and value < 1:
            raise UserError(f"{option} must be at least 1, got {value}")
    check_output_dir(out)
    averages = [out / f"{benchmark.name}-avg.json", out / f"{benchmark.name}-avg.md"]
    refuse_foreign(averages)  # what this request may replace: never a file of the user's
    for ref in refs:
        check_tokenizer(ref)
        benchmark.check(ref)
        folder = checkpoint_dir(out, ref)
        refuse_foreign([folder / summary_name(benchmark.name), folder / failed_name(benchmark.name)])
        _refuse_other_format(folder / summary_name(benchmark.name))


def _refuse_other_format(path: Path) -> None:
    """A summary of another format would be replaced (its cells lost) by this version's: refused."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return
    reason = not_understood(path, stored)
    if reason is not None:
        raise UserError(f"{path} is of another format ({reason}); it is not replaced: choose another --out")


def check_tokenizer(ref: CheckpointRef) -> None:
    if not any((ref.path / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(
            f"{ref.path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the tokenizer with the checkpoint"
        )


def run_benchmark(
    benchmark: Benchmark,
    refs: list[CheckpointRef],
    out: Path,
    *,
    avg: bool = False,
    progress: Progress = lambda _unit, _done, _total: None,
    on_checkpoint: Callable[[CheckpointRef], None] = lambda _ref: None,
    log: Callable[[str], None] = lambda _line: None,
    open_engine: Callable[..., Any] | None = None,
    shard: Any = None,
    executor: Any = None,
) -> EvaluationRun:
    """Evaluate every checkpoint on every unit of `benchmark` (see the module docstring).

    `shard` (evalkit.scale.plan.Shard): only that shard's units; `executor` (evalkit.scale):
    computes the units elsewhere first (a Ray cluster), this loop then writes the summaries."""
    from evalkit.scale.lease import driver_lease
    from evalkit.scale.plan import plan_work

    out = Path(out)
    check_request(benchmark, refs, out)
    # Taken after the checks (a refused request leaves no trace in `out`), before any result is
    # written. The flock holds on one host; the lease across hosts of a shared file system.
    with output_lock(out), driver_lease(out, log) as lease:
        work = plan_work(benchmark, refs, shard)
        if executor is not None:
            executor.run(benchmark, work, out, progress=progress, log=log, open_engine=open_engine, lease=lease)
        summaries, failed, first_error = [], [], None
        for ref, checkpoint_work in work.checkpoints:
            on_checkpoint(ref)
            try:
                summaries.append(evaluate_checkpoint(benchmark, ref, out, progress, log, open_engine, checkpoint_work))
            except Exception as err:  # one broken checkpoint must not end a sweep over the others
                if disk_full_error(err) is not None:
                    raise  # every later checkpoint would fail the same way
                failed.append(record_failure(benchmark, ref, out, err))
                first_error = first_error or err
                log(f"failed: {ref.run} step {ref.step} ({ref.path}): {failed[-1]['reason']}; going on with the rest")
        rows = [row for summary in summaries for row in summary["rows"]]
        skipped = [{"run": s["run"], "step": s["step"], **skip} for s in summaries for skip in s["skipped"]]
        run = EvaluationRun(summaries, rows, skipped)
        if avg and rows:
            run.averages, run.files = write_averages(benchmark, rows, out)
    if failed and len(refs) == 1:
        raise first_error  # no sweep to go on with: the error itself, as for any command
    if failed:
        raise UserError(_failures_message(failed, len(refs), out))
    return run


def failed_name(benchmark: str) -> str:
    return f"{benchmark}-failed.json"


def record_failure(benchmark: Benchmark, ref: CheckpointRef, out: Path, err: Exception) -> dict[str, Any]:
    """<out>/<run>/step-<N>/<name>-failed.json: the checkpoint and the one-line reason it failed
    (the leaderboard lists it); removed when the checkpoint is later evaluated in full."""
    from evalkit.checkpoint_check import one_line

    reason = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {one_line(err)}"
    record = {"schema_version": SCHEMA_VERSION, "benchmark": benchmark.name, "run": ref.run, "step": ref.step}
    record["checkpoint"] = str(ref.path)
    record.update(reason=reason, provenance={**stamp(), "command": command_line()})
    atomic_write_json(checkpoint_dir(out, ref) / failed_name(benchmark.name), record)
    return record


def _failures_message(failed: list[dict[str, Any]], total: int, out: Path) -> str:
    first = failed[0]
    return (
        f"{len(failed)} of {total} checkpoints failed (each recorded as {failed_name(first['benchmark'])} under "
        f"{out}, the others evaluated); first: {first['run']} step {first['step']}: {first['reason']}"
    )


def evaluate_checkpoint(
    benchmark: Benchmark,
    ref: CheckpointRef,
    out: Path,
    progress: Progress = lambda _unit, _done, _total: None,
    log: Callable[[str], None] = lambda _line: None,
    open_engine: Callable[..., Any] | None = None,
    work: Any = None,
) -> dict[str, Any]:
    """Every unit of one checkpoint (`work`, evalkit.scale.plan.CheckpointWork: only its units,
    some computed elsewhere); writes and returns its summary."""
    if work is not None and work.failure is not None:
        raise work.failure  # computed elsewhere and failed there: the sweep records it
    results, skipped, answered = [], [], []
    with LazyEngine(benchmark.engine, ref.path, open_engine) as engine:
        for unit in benchmark.units() if work is None else work.units:
            elsewhere = work.outcomes.get(unit) if work is not None else None
            if elsewhere is not None and elsewhere.skip is not None:
                skipped.append(elsewhere.skip)
                log(f"skipped {unit.label()} ({ref.run} step {ref.step}): {elsewhere.skip['reason']}")
                continue
            if elsewhere is not None:
                results.append(elsewhere.result)
                answered.append((unit, len(elsewhere.result.rows)))
                continue
            stored = benchmark.stored(ref, unit, out)
            if stored is not None:
                log(f"{unit.label()}: already scored with these settings, kept")
                results.append(stored)
                answered.append((unit, len(stored.rows)))
                continue
            try:
                results.append(benchmark.evaluate(engine, ref, unit, out, progress))
                answered.append((unit, len(results[-1].rows)))
            except Skipped as why:
                skipped.append({**unit.fields(), "reason": why.reason, **why.details})
                log(f"skipped {unit.label()} ({ref.run} step {ref.step}): {why.reason}")
        engine_info = engine.info() or next((r.stored_engine_info for r in results if r.stored_engine_info), None)
        if engine_info is None and work is not None:  # computed on a Ray worker
            engine_info = work.engine_info()
    path = checkpoint_dir(out, ref) / summary_name(benchmark.name)
    earlier = read_summary(path)
    if engine_info is None and earlier is not None:  # all read back: the engine that answered them
        engine_info = (earlier.get("provenance") or {}).get("engine")
    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": benchmark.name,
        "run": ref.run,
        "step": ref.step,
        "checkpoint": str(ref.path),
        "rows": [row for result in results for row in result.rows],
        "skipped": skipped,
        "provenance": {
            **_stamp_of_the_scores(earlier, any(result.computed for result in results)),
            "checkpoint_meta": checkpoint_meta(ref.path),
            "engine": engine_info,
            "settings": benchmark.settings_record(),
            **(work.provenance(answered) if work is not None else {}),
        },
    }
    summary = benchmark.finish_summary(summary, results, earlier)
    atomic_write_json(path, summary)
    (path.parent / failed_name(benchmark.name)).unlink(missing_ok=True)  # an earlier failure, now mended
    return summary


def read_summary(path: Path) -> dict[str, Any] | None:
    """The summary stored at `path`, or None when there is none (or it is not one)."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not_understood(path, earlier) is not None:  # another format: neither its stamp nor its engine is reused
        return None
    return earlier if isinstance(earlier.get("rows"), list) else None


def _stamp_of_the_scores(earlier: dict[str, Any] | None, computed_any: bool) -> dict[str, Any]:
    """Version, commit, time and machine of the run that computed the scores: a rerun that only
    reads them back keeps the earlier summary's stamp instead of claiming them as its own."""
    kept = stamp_of(earlier.get("provenance")) if not computed_any and earlier is not None else None
    return kept or stamp()  # no whole stamp to keep: this run's


def write_averages(benchmark: Benchmark, rows: list[dict[str, Any]], out: Path) -> tuple[Averages, dict[str, Path]]:
    """--avg, for every benchmark alike: <out>/<name>-avg.json (records) and .md (the table)."""
    averages = benchmark.average(rows)
    json_path, markdown_path = out / f"{benchmark.name}-avg.json", out / f"{benchmark.name}-avg.md"
    provenance = {**stamp(), "command": command_line(), "settings": benchmark.settings_record()}
    averaged = {"schema_version": SCHEMA_VERSION, "benchmark": benchmark.name, "averages": averages.records}
    atomic_write_json(json_path, {**averaged, "provenance": provenance})
    title = BENCHMARKS.get(benchmark.name, benchmark.name)
    conditions = f"{averages.conditions}\n\n" if averages.conditions else ""
    atomic_write_text(
        markdown_path,
        f"# {title}, averaged over checkpoints\n\nCommand: `{command_line()}`\n\n{conditions}{averages.table}\n",
    )
    return averages, {"averages_json": json_path, "averages_markdown": markdown_path}
