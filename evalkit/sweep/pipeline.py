"""One evaluation pipeline, run_benchmark, for every benchmark (docs/architecture.md draws it and
says what it owns); tests/test_pipeline.py runs a toy benchmark through every part.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from evalkit.errors import Skipped, UserError
from evalkit.files import atomic_write_json, atomic_write_text, disk_full_error, output_lock
from evalkit.lengths import check_max_length
from evalkit.models.check import read_config
from evalkit.models.refs import CheckpointRef, checkpoint_meta, weights_fingerprint
from evalkit.store.identity import stored_identity
from evalkit.store.provenance import command_line, stamp, stamp_of
from evalkit.store.result_format import (
    SCHEMA_VERSION,
    STANDARD,
    ResultRow,
    failed_name,
    read_summary,
    row_record,
    summary_rows,
)
from evalkit.store.units import CheckpointFiles, Unit, UnitStore, averages_paths, check_results_dir
from evalkit.sweep.engine_choice import EngineChoice, LazyEngine
from evalkit.sweep.plan import CheckpointWork, Shard, plan_work, write_empty_shard

Detail = TypeVar("Detail")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass
class UnitResult(Generic[Detail]):
    """`detail`: what the benchmark's summary keeps of a unit (RULER's data key, a general task's record)."""

    rows: list[ResultRow]
    detail: Detail | None = None
    computed: bool = True  # False: read back from disk
    stored_engine_info: dict[str, Any] | None = None  # read back: the engine that computed it (none is built)


@dataclass
class Averages:
    """--avg: the records written to <name>-avg.json, the markdown table, and its conditions line."""

    records: list[dict[str, Any]]
    table: str
    conditions: str = ""


@dataclass(frozen=True)
class ProgressEvent:
    """`done` of `total` of a unit on a checkpoint, as the benchmark counts its work (RULER: samples)."""

    ref: CheckpointRef
    unit: Unit
    done: int
    total: int


Progress = Callable[[ProgressEvent], None]
UnitProgress = Callable[[int, int], None]  # what a benchmark reports while evaluating one unit: (done, total)


class Benchmark(ABC):
    """What a benchmark tells the pipeline; everything else is the pipeline's."""

    name: str  # summaries are <name>-summary.json, averages <name>-avg.json/.md
    title: str  # what its tables are headed with in reports and the leaderboard ("RULER")
    engine: EngineChoice
    settings: Any  # a dataclass instance: what the user asked for
    # Where the benchmark's own notes go (a Ray worker's copy: that worker's output).
    log: Callable[[str], None] = staticmethod(lambda _line: None)
    # Attributes each process rebuilds for itself (caches of tokenizers, engines' adapters): a
    # pickled copy (Ray's) carries them empty.
    transient: tuple[str, ...] = ()

    @abstractmethod
    def units(self) -> list[Unit]: ...

    @abstractmethod
    def evaluate(self, engine: LazyEngine, unit: Unit, store: UnitStore, progress: UnitProgress) -> UnitResult:
        """Score the unit on the store's checkpoint (`store.ref`), resuming from what its files in
        `store` hold, or raise Skipped with the reason."""

    @abstractmethod
    def average(self, rows: list[ResultRow]) -> Averages:
        """`--avg`: the rows averaged over checkpoints, with their tables."""

    def check(self, refs: list[CheckpointRef]) -> None:
        """Refuse (UserError) a request this benchmark cannot serve, before any model is loaded."""
        return None

    def stored(self, unit: Unit, store: UnitStore) -> UnitResult | None:
        """The unit's finished result with the same settings, read without an engine; by default
        none (evaluate resumes from the store's files itself)."""
        return None

    def finish_summary(self, summary: dict[str, Any], results: list[UnitResult], earlier: dict | None) -> dict:
        """A new summary with the benchmark's own fields (earlier: the summary on disk, if any)."""
        return summary

    def unit_cost(self, unit: Unit) -> float:
        """The unit's estimated work (tokens, say), for balancing shards and Ray workers."""
        return 1.0

    def __getstate__(self) -> dict[str, Any]:
        return {key: type(value)() if key in self.transient else value for key, value in self.__dict__.items()}


@dataclass
class EvaluationRun:
    summaries: list[dict[str, Any]]
    rows: list[dict[str, Any]]  # the summaries' stored rows (evalkit.store.result_format.row_record)
    skipped: list[dict[str, Any]]
    averages: Averages | None = None
    files: dict[str, Path] = field(default_factory=dict)
    empty_shard: str | None = None  # a shard without units: the line saying so (nothing else was done)

    def result_rows(self) -> list[ResultRow]:
        return [row for summary in self.summaries for row in summary_rows(summary)]


def check_request(benchmark: Benchmark, refs: list[CheckpointRef], out: Path) -> None:
    """Everything a user can get wrong, before any model or data is loaded or anything written."""
    from evalkit.engines import check_engine_settings
    from evalkit.models.precision import check_dtype

    if not refs:
        raise UserError("no checkpoint given: pass --ckpts PATH")
    choice = benchmark.engine
    if choice.settings.get("dtype") is not None:
        check_dtype(choice.settings["dtype"])
    batch_size = choice.settings.get("batch_size")
    if batch_size is not None and batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")
    check_max_length(choice.settings.get("max_length"))
    check_engine_settings(choice.name, choice.settings)  # name and settings, once: not each checkpoint's failure
    check_results_dir(out, benchmark.name, refs)
    for ref in refs:
        check_tokenizer(ref)
    benchmark.check(refs)


def check_tokenizer(ref: CheckpointRef) -> None:
    if not any((ref.path / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(
            f"{ref.path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the tokenizer with the checkpoint"
        )


def check_lengths(refs: list[CheckpointRef], settings: Any) -> None:
    """A benchmark at context lengths (RULER, ppl) calls this from its check(): every length fits each
    checkpoint's window, and an encoding other than standard can be served by the engine."""
    from evalkit.engines import PackedEngine, engine_class

    if settings.encoding != STANDARD and not issubclass(engine_class(settings.engine), PackedEngine):
        raise UserError(f"the {settings.engine} engine cannot run packed requests (--encoding {settings.encoding})")
    for ref in refs:
        too_long = [n for n in settings.lengths if n > window_of(ref, settings.max_length)]
        if too_long:
            raise beyond_window(str(too_long[0]), ref, settings.max_length)
        if settings.encoding != STANDARD:
            check_packed_attention(ref, settings)


ENCODINGS = (STANDARD, "anchor")  # how a benchmark at lengths feeds a document (docs/ruler.md, docs/perplexity.md)


def check_encoding(encoding: str, doc_tokens: int) -> None:
    """A benchmark at lengths checks its --encoding and --doc-tokens as its settings are made."""
    if encoding not in ENCODINGS:
        raise UserError(f"--encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    if doc_tokens < 1:
        raise UserError(f"--doc-tokens must be a positive number of tokens, got {doc_tokens}")


@contextmanager
def encoding_skips(settings: Any) -> Iterator[None]:
    """A unit skipped under an encoding other than standard: the skip belongs to that encoding's cell."""
    try:
        yield
    except Skipped as why:
        if settings.encoding != STANDARD:
            why.details |= {"encoding": settings.encoding, "doc_tokens": settings.doc_tokens}
        raise


def window_of(ref: CheckpointRef, max_length: int | None) -> int:
    """The window lengths must fit: --max-length, else the checkpoint's max_position_embeddings."""
    config = read_config(ref.path)
    config = config.get("text_config", config)
    window = max_length or config.get("max_position_embeddings")
    if window is None:
        raise UserError(f"{ref.path}/config.json has no max_position_embeddings; pass --max-length")
    return int(window)


def beyond_window(length: str, ref: CheckpointRef, max_length: int | None) -> UserError:
    window = window_of(ref, max_length)
    if max_length:
        return UserError(f"length {length} is beyond --max-length {window}; drop it or raise --max-length")
    return UserError(
        f"length {length} is beyond the window of {ref.path} ({window} tokens, its max_position_embeddings); "
        "drop it or pass --max-length to evaluate beyond the trained window (never truncated)"
    )


def check_packed_attention(ref: CheckpointRef, settings: Any) -> None:
    """The anchor encoding runs on evalkit's attention, which must reproduce the model's; vLLM's
    packed backend has no sliding windows."""
    from transformers import AutoConfig

    from evalkit.attention.features import check_attention_supported, windows_shorter_than

    config = AutoConfig.from_pretrained(ref.path, local_files_only=True)
    check_attention_supported(config, f"--encoding {settings.encoding}")
    windows = windows_shorter_than(config, max(settings.lengths))
    if windows and settings.engine == "vllm":
        raise UserError(
            f"--encoding {settings.encoding} on the vllm engine: evalkit's packed backend has no sliding-window "
            f"attention and {ref.path} has {len(windows)} layers with a {min(windows)}-token window; use --engine hf"
        )


def run_benchmark(
    benchmark: Benchmark,
    refs: list[CheckpointRef],
    out: Path,
    *,
    avg: bool = False,
    progress: Progress = lambda _event: None,
    on_checkpoint: Callable[[CheckpointRef], None] = lambda _ref: None,
    log: Callable[[str], None] = lambda _line: None,
    open_engine: Callable[..., Any] | None = None,
    shard: Shard | None = None,
    executor: Any = None,
) -> EvaluationRun:
    """Every checkpoint on every unit of `benchmark`. `shard`: only its units; `executor`: computes
    the units elsewhere first (Ray), this loop then writes; `log`: the pipeline's notes and the benchmark's."""
    out = Path(out)
    benchmark.log = log  # the benchmark's own notes go where the pipeline's do
    check_request(benchmark, refs, out)
    # Taken after the checks (a refused request leaves no trace in `out`), before any result is
    # written; this process is then the one writer under `out` (an executor's workers hand it theirs).
    with output_lock(out):
        work = plan_work(benchmark, refs, shard)
        if work.shard is not None and not work.checkpoints:  # more array tasks than units: a success
            line = write_empty_shard(out, benchmark.name, work.shard)
            log(line)
            return EvaluationRun([], [], [], empty_shard=line)
        if executor is not None:
            executor.run(benchmark, work, out, log=log, open_engine=open_engine)  # progress: its log lines
        summaries, failed = [], []
        for ref, checkpoint_work in work.checkpoints:
            on_checkpoint(ref)
            try:
                summaries.append(evaluate_checkpoint(benchmark, ref, out, progress, log, open_engine, checkpoint_work))
            except Exception as err:  # one broken checkpoint must not end a sweep over the others
                if disk_full_error(err) is not None:
                    raise  # every later checkpoint would fail the same way
                failed.append(record_failure(benchmark, ref, out, err))
                log(f"failed: {ref.run} step {ref.step} ({ref.path}): {failed[-1]['reason']}; going on with the rest")
                if len(refs) == 1:
                    raise  # no sweep to go on with: the error itself, as for any command
        rows = [row for summary in summaries for row in summary["rows"]]
        skipped = [{"run": s["run"], "step": s["step"], **skip} for s in summaries for skip in s["skipped"]]
        run = EvaluationRun(summaries, rows, skipped)
        if avg and rows:
            run.averages, run.files = write_averages(benchmark, run.result_rows(), out)
    if failed:
        first = failed[0]
        raise UserError(
            f"{len(failed)} of {len(refs)} checkpoints failed (each recorded as {failed_name(first['benchmark'])} "
            f"under {out}, the others evaluated); first: {first['run']} step {first['step']}: {first['reason']}"
        )
    return run


def record_failure(benchmark: Benchmark, ref: CheckpointRef, out: Path, err: Exception) -> dict[str, Any]:
    """<out>/<run>/step-<N>/<name>-failed.json: the checkpoint and the one-line reason it failed
    (the leaderboard lists it); removed when the checkpoint is later evaluated in full."""
    from evalkit.models.check import one_line

    reason = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {one_line(err)}"
    record = {"schema_version": SCHEMA_VERSION, "benchmark": benchmark.name, "run": ref.run, "step": ref.step}
    record["checkpoint"] = str(ref.path)
    record.update(reason=reason, provenance=stamp())
    atomic_write_json(CheckpointFiles(out, ref, benchmark.name).failed, record)
    return record


def evaluate_checkpoint(
    benchmark: Benchmark,
    ref: CheckpointRef,
    out: Path,
    progress: Progress = lambda _event: None,
    log: Callable[[str], None] = lambda _line: None,
    open_engine: Callable[..., Any] | None = None,
    work: CheckpointWork | None = None,
) -> dict[str, Any]:
    """Every unit of one checkpoint (`work`: only its units, some computed elsewhere; by default all,
    here); writes and returns its summary."""
    work = work or CheckpointWork(benchmark.units(), {})
    if work.failure is not None:
        raise work.failure  # computed elsewhere and failed there: the sweep records it
    files = CheckpointFiles(out, ref, benchmark.name)
    results, skipped, answered = [], [], []
    with LazyEngine(benchmark.engine, ref.path, open_engine) as engine:
        for unit in work.units:
            elsewhere = work.outcomes.get(unit)
            if elsewhere is not None and elsewhere.skip is not None:
                skipped.append(elsewhere.skip)
                log(f"skipped {unit.label()} ({ref.run} step {ref.step}): {elsewhere.skip['reason']}")
                continue
            store = files.unit(unit)
            result = elsewhere.result if elsewhere is not None else benchmark.stored(unit, store)
            if elsewhere is None and result is not None:
                log(f"{unit.label()}: already scored with these settings, kept")
            elif result is None:
                try:
                    report = lambda done, total, unit=unit: progress(ProgressEvent(ref, unit, done, total))  # noqa: E731
                    result = benchmark.evaluate(engine, unit, store, report)
                except Skipped as why:
                    skipped.append({**unit.fields(), "reason": why.reason, **why.details})
                    log(f"skipped {unit.label()} ({ref.run} step {ref.step}): {why.reason}")
                    continue
            results.append(result)
            answered.append((unit, len(result.rows)))
        engine_info = engine.info() or next((r.stored_engine_info for r in results if r.stored_engine_info), None)
        if engine_info is None:  # computed on a Ray worker
            engine_info = next((o.engine_info for o in work.outcomes.values() if o.engine_info), None)
    earlier = read_summary(files.summary)
    if engine_info is None and earlier is not None:  # all read back: the engine that answered them
        engine_info = (earlier.get("provenance") or {}).get("engine")
    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": benchmark.name,
        "title": benchmark.title,
        "run": ref.run,
        "step": ref.step,
        "checkpoint": str(ref.path),
        "rows": [row_record(row) for result in results for row in result.rows],
        "skipped": skipped,
        "provenance": {
            **_stamp_of_the_scores(earlier, any(result.computed for result in results)),
            "checkpoint_meta": checkpoint_meta(ref.path, ref.hub),
            "weights": weights_fingerprint(ref.path),  # what merge checks shards of one checkpoint by
            "engine": engine_info,
            "settings": asdict(benchmark.settings),
            **work.provenance(answered),
        },
    }
    summary = benchmark.finish_summary(summary, results, earlier)
    atomic_write_json(files.summary, summary)
    files.failed.unlink(missing_ok=True)  # an earlier failure, now mended
    return summary


def _stamp_of_the_scores(earlier: dict[str, Any] | None, computed_any: bool) -> dict[str, Any]:
    """Version, commit, time and machine of the run that computed the scores: a rerun that only
    reads them back keeps the earlier summary's stamp instead of claiming them as its own."""
    kept = stamp_of(earlier.get("provenance")) if not computed_any and earlier is not None else None
    return kept or stamp()  # no whole stamp to keep: this run's


def earlier_cells(
    settings_type: type, summary: dict, earlier: dict, cell: Callable[[dict], str]
) -> tuple[list[dict], list[dict]]:
    """For a benchmark's finish_summary: the earlier summary's rows and skips of the cells (`cell`)
    this run did not touch, when both were evaluated alike (the settings' identity, the engine's
    RESULT_FACTS); none otherwise. `--lengths 1k` then `--lengths 2k` into one --out keeps both."""
    from evalkit.engines.base import RESULT_FACTS

    now, then = summary["provenance"], earlier.get("provenance") or {}
    alike = stored_identity(settings_type, now["settings"]) == stored_identity(settings_type, then.get("settings"))
    if not alike or any((now["engine"] or {}).get(k) != (then.get("engine") or {}).get(k) for k in RESULT_FACTS):
        return [], []
    touched = {cell(entry) for entry in summary["rows"] + summary["skipped"]}
    rows = [row for row in earlier.get("rows", []) if cell(row) not in touched]
    return rows, [skip for skip in earlier.get("skipped", []) if cell(skip) not in touched]


def write_averages(benchmark: Benchmark, rows: list[ResultRow], out: Path) -> tuple[Averages, dict[str, Path]]:
    """--avg, for every benchmark alike: <out>/<name>-avg.json (records) and .md (the table)."""
    averages = benchmark.average(rows)
    json_path, markdown_path = averages_paths(out, benchmark.name)
    provenance = {**stamp(), "settings": asdict(benchmark.settings)}
    averaged = {"schema_version": SCHEMA_VERSION, "benchmark": benchmark.name, "averages": averages.records}
    atomic_write_json(json_path, {**averaged, "provenance": provenance})
    conditions = f"{averages.conditions}\n\n" if averages.conditions else ""
    heading = f"# {benchmark.title}, averaged over checkpoints\n\nCommand: `{command_line()}`"
    atomic_write_text(markdown_path, f"{heading}\n\n{conditions}{averages.table}\n")
    return averages, {"averages_json": json_path, "averages_markdown": markdown_path}
