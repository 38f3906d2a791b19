"""`evalkit general`: lm-eval tasks on checkpoints, one task file per (checkpoint, task), resumable.

For each checkpoint, each requested task (a task, group or tag lm-eval knows) either is on disk
already with the same settings (kept, nothing recomputed, the engine not even loaded) or is run
by lm-eval's `simple_evaluate` through EngineLM and stored:

    <out>/<run>/step-<N>/general/<task>.json           evalkit's record: rows, settings key, provenance (written last)
    <out>/<run>/step-<N>/general/<task>.lm_eval.json   lm-eval's full result JSON (without samples)
    <out>/<run>/step-<N>/general/<task>.samples.jsonl  per-sample responses, metrics and hashes, no prompts
    <out>/<run>/step-<N>/general-summary.json          every row of the checkpoint, skipped tasks, provenance
    <out>/general-avg.json, general-avg.md             with avg: mean ± std over each run's checkpoints

A task that cannot run (its dataset cannot be had, a request exceeds the model window, it asks
for sampling) is recorded as skipped with a one-line reason, and the other tasks still run.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evalkit.errors import UserError
from evalkit.general.errors import RequestsExceedWindow, TaskCannotRun
from evalkit.provenance import stamp
from evalkit.results.checkpoints import CheckpointRef, checkpoint_meta
from evalkit.results.store import checkpoint_dir
from evalkit.storage import atomic_write_json, atomic_write_text, check_output_dir, output_lock

DEFAULT_OUT = Path("results/general")
RESULT_DIR = "general"
SUMMARY = "general-summary.json"
AVERAGES = "general-avg"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
TOO_LONG_CHOICES = ("task", "documents")  # what a document longer than the window leaves out: its task, or itself
# Engine settings that change speed, not what is measured: a rerun with another batch size keeps results.
EXECUTION_ONLY_SETTINGS = ("batch_size", "device")
# lm-eval warns once per task when the shots differ from the YAML; evalkit records the shots of every task.
REDUNDANT_LM_EVAL_WARNINGS = ("Overwriting default num_fewshot",)

Progress = Callable[[str, int, int], None]  # (task, requests done, requests total)


@dataclass
class GeneralSettings:
    """What the user asked for; recorded with every result."""

    tasks: list[str]
    num_fewshot: int | None = None
    limit: float | None = None
    engine: str = "hf"
    engine_settings: dict[str, Any] = field(default_factory=dict)
    include_paths: list[str] = field(default_factory=list)
    too_long: str = "task"  # a document over the window skips its task ("task") or only itself ("documents")


@dataclass(frozen=True)
class TaskPlan:
    """One requested task with its effective shots and the key its stored result must match."""

    name: str
    num_fewshot: int | None  # None: the task's own default (lm-eval then records what it used)
    fewshot_source: str  # given | evalkit standard for mmlu | lm-eval default
    key: str


@dataclass
class GeneralRun:
    """What run_general produced: per-checkpoint summaries, all rows, skips, and (avg) the averages."""

    summaries: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    averages: list[dict[str, Any]] | None = None
    files: dict[str, Path] = field(default_factory=dict)


def parse_tasks(text: str) -> list[str]:
    """'mmlu, hellaswag' -> ['mmlu', 'hellaswag'] (order kept, duplicates dropped)."""
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if not names:
        raise UserError("no task given: pass --tasks NAME[,NAME...] (e.g. mmlu,hellaswag)")
    return names


def run_general(
    refs: list[CheckpointRef],
    tasks: list[str],
    *,
    out: Path = DEFAULT_OUT,
    num_fewshot: int | None = None,
    limit: float | None = None,
    engine: str = "hf",
    engine_settings: dict[str, Any] | None = None,
    include_path: list[str | Path] | None = None,
    avg: bool = False,
    too_long: str = "task",
    progress: Progress = lambda _task, _done, _total: None,
    on_checkpoint: Callable[[CheckpointRef], None] = lambda _ref: None,
    log: Callable[[str], None] = lambda _line: None,
) -> GeneralRun:
    """Score every checkpoint on every task (see the module docstring); writes and returns the results."""
    from evalkit.general.catalog import TaskCatalog, default_include_paths

    _check_request(refs, tasks, num_fewshot, limit, engine, engine_settings or {}, Path(out))
    _check_too_long(too_long, limit)
    limit = int(limit) if limit is not None and limit >= 1 else limit  # 10.0 from a CLI float is 10 documents
    include_paths = default_include_paths(include_path)
    settings = GeneralSettings(
        list(tasks), num_fewshot, limit, engine, dict(engine_settings or {}), [str(p) for p in include_paths], too_long
    )
    catalog = TaskCatalog(include_paths, settings.tasks)
    catalog.check(settings.tasks)
    plans = [_plan(catalog, name, settings) for name in settings.tasks]
    summaries = []
    # Taken after the checks above (a refused request leaves no trace in `out`), before any result is written.
    with output_lock(Path(out)):
        with _quiet_lm_eval():
            for ref in refs:
                on_checkpoint(ref)
                summaries.append(_evaluate_checkpoint(ref, plans, catalog, settings, Path(out), progress, log))
        rows = [row for summary in summaries for row in summary["rows"]]
        skipped = [{"run": s["run"], "step": s["step"], **skip} for s in summaries for skip in s["skipped"]]
        result = GeneralRun(summaries, rows, skipped)
        if avg:
            result.averages, result.files = _write_averages(rows, settings, Path(out))
    return result


# ---------------------------------------------------------------------- checks and plans


def _check_request(
    refs: list[CheckpointRef],
    tasks: list[str],
    num_fewshot: int | None,
    limit: float | None,
    engine: str,
    engine_settings: dict[str, Any],
    out: Path,
) -> None:
    """Everything a user can get wrong, before any model or dataset is loaded."""
    from evalkit.engines import ENGINE_NAMES, check_dtype

    if not refs:
        raise UserError("no checkpoint given: pass --ckpts PATH")
    if not tasks:
        raise UserError("no task given: pass --tasks NAME[,NAME...] (e.g. mmlu,hellaswag)")
    if engine not in ENGINE_NAMES:
        raise UserError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINE_NAMES)}")
    if engine_settings.get("dtype") is not None:
        check_dtype(engine_settings["dtype"])
    if num_fewshot is not None and num_fewshot < 0:
        raise UserError(f"--num-fewshot must be 0 or more, got {num_fewshot}")
    _check_limit(limit)
    for option, key in (("--batch-size", "batch_size"), ("--max-length", "max_length")):
        value = engine_settings.get(key)
        if value is not None and value < 1:
            raise UserError(f"{option} must be at least 1, got {value}")
    check_output_dir(out)
    for ref in refs:
        if not any((ref.path / name).is_file() for name in TOKENIZER_FILES):
            raise UserError(
                f"{ref.path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
                "save the tokenizer with the checkpoint"
            )


def _check_too_long(too_long: str, limit: float | None) -> None:
    if too_long not in TOO_LONG_CHOICES:
        raise UserError(f"--too-long must be one of {', '.join(TOO_LONG_CHOICES)}, got {too_long!r}")
    if too_long == "documents" and limit is not None:
        raise UserError(
            "--too-long documents and --limit cannot be combined (lm-eval takes a limit or a list of documents, "
            "not both); drop --limit"
        )


def _check_limit(limit: float | None) -> None:
    """--limit is N documents (a whole number) or a fraction in (0, 1); inf and nan are neither
    (int(inf) would fail after the task catalog loads, and nan compares false with everything)."""
    if limit is None:
        return
    if not (math.isfinite(limit) and limit > 0):
        raise UserError(f"--limit must be a number of documents per task (or a fraction below 1), got {limit}")
    if limit >= 1 and not float(limit).is_integer():
        raise UserError(f"--limit {limit}: give a whole number of documents, or a fraction below 1")


def _plan(catalog, name: str, settings: GeneralSettings) -> TaskPlan:
    shots, source = catalog.fewshot(name, settings.num_fewshot)
    measured = {
        key: value for key, value in sorted(settings.engine_settings.items()) if key not in EXECUTION_ONLY_SETTINGS
    }
    identity = {
        "task": name,
        "num_fewshot": shots,
        "limit": settings.limit,
        "engine": settings.engine,
        "engine_settings": measured,
    }
    if settings.too_long != "task":  # only the other choice keys in: records stored before it existed still hold
        identity["too_long"] = settings.too_long
    key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return TaskPlan(name, shots, source, key)


# ---------------------------------------------------------------------- one checkpoint


def _evaluate_checkpoint(
    ref: CheckpointRef,
    plans: list[TaskPlan],
    catalog,
    settings: GeneralSettings,
    out: Path,
    progress: Progress,
    log: Callable[[str], None],
) -> dict[str, Any]:
    directory = checkpoint_dir(out, ref) / RESULT_DIR
    engine = _LazyEngineLM(ref, settings, progress)
    records, skipped, resumed = [], [], []
    try:  # closed before the next checkpoint's engine starts: two vLLM engines would not fit one GPU
        for plan in plans:
            record = _stored_record(directory, plan)
            if record is not None:
                log(f"{plan.name}: already scored with these settings, kept ({_record_path(directory, plan.name)})")
                records.append(record)
                resumed.append(plan.name)
                continue
            try:
                records.append(_evaluate_task(engine, catalog, plan, settings, ref, directory))
                for task, left in records[-1].get("over_window", {}).items():
                    log(
                        f"{task} ({ref.run} step {ref.step}): {left['documents_over_window']} of {left['documents']} "
                        f"documents need more than the window of {left['window']} tokens; scored on the rest"
                    )
            except TaskCannotRun as why:
                counts = why.counts() if isinstance(why, RequestsExceedWindow) else {}
                skipped.append({"task": plan.name, "reason": why.reason, **counts})
                log(f"skipped {plan.name} ({ref.run} step {ref.step}): {why.reason}")
        engine_info = engine.info() or _stored_engine_info(records)
    finally:
        engine.close()
    summary = {
        "benchmark": "general",
        "run": ref.run,
        "step": ref.step,
        "checkpoint": str(ref.path),
        "rows": [row for record in records for row in record["rows"]],
        "skipped": skipped,
        "tasks": {record["task"]: _task_entry(record, directory, resumed) for record in records},
        "provenance": {
            **stamp(),
            "engine": engine_info,
            "settings": asdict(settings),
            "lm_eval_version": _lm_eval_version(),
            "checkpoint_meta": checkpoint_meta(ref.path),
        },
    }
    atomic_write_json(checkpoint_dir(out, ref) / SUMMARY, summary)
    return summary


class _LazyEngineLM:
    """The checkpoint's EngineLM, built on first use: a checkpoint whose tasks are all on disk
    already (or whose data cannot be had) loads no model."""

    def __init__(self, ref: CheckpointRef, settings: GeneralSettings, progress: Progress) -> None:
        self.ref, self.settings, self.progress = ref, settings, progress
        self.lm = None

    def for_task(self, task: str):
        if self.lm is None:
            self.lm = _engine_lm(self.ref, self.settings)
        self.lm.progress = lambda _request_type, done, total: self.progress(task, done, total)
        return self.lm

    def info(self) -> dict[str, Any] | None:
        return self.lm.engine.engine_info() if self.lm is not None else None

    def close(self) -> None:
        if self.lm is not None:
            self.lm.engine.close()


def _engine_lm(ref: CheckpointRef, settings: GeneralSettings):
    from evalkit.engines import get_engine
    from evalkit.general.adapter import EngineLM

    return EngineLM(get_engine(settings.engine, ref.path, **settings.engine_settings))


def _evaluate_task(
    engine: _LazyEngineLM, catalog, plan: TaskPlan, settings: GeneralSettings, ref: CheckpointRef, directory: Path
) -> dict[str, Any]:
    """Run one requested task through lm-eval, write its three files (the record last), return the record."""
    from evalkit.general.rows import compact_samples, result_rows

    with catalog.loading(plan.name):
        tasks = catalog.load(plan.name)  # before the engine: data that cannot be had costs no model load
        lm = engine.for_task(plan.name)
        results, over_window = _run_lm_eval(lm, tasks, catalog, plan, settings)
    samples = compact_samples(results.pop("samples", None) or {})
    stem = _file_stem(plan.name)
    atomic_write_text(directory / f"{stem}.samples.jsonl", "".join(_json_line(s) for s in samples))
    atomic_write_text(directory / f"{stem}.lm_eval.json", _json_text(results))
    record = {
        "benchmark": "general",
        "run": ref.run,
        "step": ref.step,
        "checkpoint": str(ref.path),
        "task": plan.name,
        "key": plan.key,
        "num_fewshot_asked": plan.num_fewshot,  # None: the task's own default
        "fewshot_source": plan.fewshot_source,
        "num_fewshot": results.get("n-shot", {}).get(plan.name),  # what lm-eval used (None for a tag: see rows)
        "limit": settings.limit,
        "rows": result_rows(results, plan.name, ref.run, ref.step),
        **({"over_window": over_window} if over_window else {}),  # --too-long documents: per task, what was left out
        "files": {"lm_eval": f"{stem}.lm_eval.json", "samples": f"{stem}.samples.jsonl"},
        "provenance": {
            **stamp(),
            "engine": lm.engine.engine_info(),
            "settings": asdict(settings),
            "lm_eval_version": _lm_eval_version(),
            "task_versions": results.get("versions", {}),
        },
    }
    atomic_write_json(_record_path(directory, plan.name), record)
    return record


def _run_lm_eval(
    lm, tasks, catalog, plan: TaskPlan, settings: GeneralSettings
) -> tuple[dict, dict[str, dict[str, int]]]:
    """lm-eval's simple_evaluate. With too_long="documents", a request type that finds documents
    over the window (its check runs before anything is computed) makes it run again on the
    documents that fit, and those left out are counted per task; a task none of whose documents
    fit is skipped whole, as under "task"."""
    from lm_eval import simple_evaluate

    fitting: dict[str, list[int]] = {}
    over_window: dict[str, dict[str, int]] = {}
    while True:
        try:
            results = simple_evaluate(
                model=lm,
                tasks=catalog.load(plan.name) if fitting else tasks,  # a rerun gets fresh task objects
                task_manager=catalog.manager,
                num_fewshot=plan.num_fewshot,
                limit=settings.limit,
                samples=fitting or None,
                log_samples=True,
            )
            return results, over_window
        except RequestsExceedWindow as why:
            if settings.too_long != "documents" or not why.over or set(why.over) & set(fitting):
                raise
            for task, over in why.over.items():
                fitting[task] = sorted(why.documents[task] - over)
                if not fitting[task]:
                    raise
                over_window[task] = {
                    "documents_over_window": len(over),
                    "documents": len(why.documents[task]),
                    "window": why.window,
                }


def _stored_record(directory: Path, plan: TaskPlan) -> dict[str, Any] | None:
    """The record of a finished (checkpoint, task) made with the same settings, else None (recompute)."""
    path = _record_path(directory, plan.name)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return record if record.get("key") == plan.key else None


def _task_entry(record: dict[str, Any], directory: Path, resumed: list[str]) -> dict[str, Any]:
    return {
        **({"over_window": record["over_window"]} if record.get("over_window") else {}),
        "num_fewshot": record["num_fewshot"],
        "fewshot_source": record["fewshot_source"],
        "file": f"{RESULT_DIR}/{_record_path(directory, record['task']).name}",
        "resumed": record["task"] in resumed,
    }


def _stored_engine_info(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    return records[0]["provenance"]["engine"] if records else None


# ---------------------------------------------------------------------- averages


def _write_averages(
    rows: list[dict[str, Any]], settings: GeneralSettings, out: Path
) -> tuple[list[dict], dict[str, Path]]:
    from evalkit.general.tables import average_table, run_averages

    averages = run_averages(rows)
    json_path, markdown_path = out / f"{AVERAGES}.json", out / f"{AVERAGES}.md"
    atomic_write_json(
        json_path,
        {"benchmark": "general", "averages": averages, "provenance": {**stamp(), "settings": asdict(settings)}},
    )
    conditions = (
        f"Tasks {', '.join(settings.tasks)}; "
        f"shots {settings.num_fewshot if settings.num_fewshot is not None else 'standard'}"
        f"{f', limit {settings.limit}' if settings.limit else ''}; engine {settings.engine} "
        f"{json.dumps(settings.engine_settings, sort_keys=True)}. Mean ± population std over the checkpoints listed."
    )
    atomic_write_text(
        markdown_path, f"# General tasks, averaged over checkpoints\n\n{conditions}\n\n{average_table(averages)}\n"
    )
    return averages, {"averages_json": json_path, "averages_markdown": markdown_path}


# ---------------------------------------------------------------------- small helpers


def _record_path(directory: Path, task: str) -> Path:
    return directory / f"{_file_stem(task)}.json"


def _file_stem(task: str) -> str:
    """A task name as a file name: lm-eval names are identifiers, but a stray '/' must not make a folder."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", task)


def _json_text(data: Any) -> str:
    from lm_eval.utils import handle_non_serializable

    # lm-eval's results carry numpy numbers and config callables; its own writer serialises them this way.
    return json.dumps(data, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n"


def _json_line(data: Any) -> str:
    from lm_eval.utils import handle_non_serializable

    return json.dumps(data, default=handle_non_serializable, ensure_ascii=False) + "\n"


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


@contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """Drop lm-eval warnings that evalkit's records make redundant (one per mmlu subject otherwise)."""
    from evalkit.general.catalog import quiet_logger

    with quiet_logger("lm_eval.evaluator", REDUNDANT_LM_EVAL_WARNINGS):
        yield
