"""`evalkit general`: lm-eval tasks as one benchmark of the pipeline (evalkit.sweep.pipeline), a unit
per requested task (a task, group or tag lm-eval knows; what it stores: docs/general.md). A task on
disk with the same settings is kept (the engine not even loaded); else lm-eval's `simple_evaluate`
runs it through EngineLM, and evalkit's record (<task>.json) is written last.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from evalkit.errors import UserError
from evalkit.files import read_json_object, refuse_foreign
from evalkit.general.errors import RequestsExceedWindow
from evalkit.models.refs import CheckpointRef
from evalkit.store.identity import EXECUTION, SELECTION, identity_key, setting
from evalkit.store.provenance import stamp
from evalkit.store.result_format import ResultRow, is_babilong, read_row, row_record
from evalkit.store.units import UnitStore
from evalkit.sweep.engine_choice import EngineChoice, LazyEngine
from evalkit.sweep.pipeline import Averages, Benchmark, Unit, UnitProgress, UnitResult

# What a document longer than the window costs: its task, itself (left out, counted), or its
# middle (LongBench's own truncation of generation prompts, counted).
TOO_LONG_CHOICES = ("task", "documents", "middle")
# lm-eval warns once per task when the shots differ from the YAML; evalkit records the shots of every task.
REDUNDANT_LM_EVAL_WARNINGS = ("Overwriting default num_fewshot",)


@dataclass
class GeneralSettings:
    """What the user asked for; recorded with every result. A stored task result is reused when
    its key (evalkit.store.identity: every field but those marked otherwise) matches."""

    tasks: list[str] = setting(role=SELECTION)
    num_fewshot: int | None = None  # keyed as the shots in effect (the task's standard when None)
    limit: float | None = None
    engine: str = "hf"
    # The engine's keyword settings; batch size and device change speed, not what is measured.
    engine_settings: dict[str, Any] = setting(default_factory=dict, execution_keys=("batch_size", "device"))
    # Where lm-eval finds task files: paths of this checkout, not keyed (a task is keyed by its name).
    include_paths: list[str] = setting(default_factory=list, role=EXECUTION)
    too_long: str = "task"  # TOO_LONG_CHOICES
    # BABILong's lengths (0k, 1k, ... 128k; lm-eval's metadata max_seq_lengths): its tasks once per length, a unit each
    babilong_lengths: list[str] = setting(default_factory=list, role=SELECTION)

    def __post_init__(self) -> None:
        """Validated once, here, before anything is loaded; a bad value is one line naming its option."""
        if not self.tasks:
            raise UserError("no task given: pass --tasks NAME[,NAME...] (e.g. mmlu,hellaswag)")
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise UserError(f"--num-fewshot must be 0 or more, got {self.num_fewshot}")
        # --limit is N documents or a fraction in (0, 1); inf and nan are neither (int(inf) would fail
        # after the task catalog loads, and nan compares false with everything).
        limit = self.limit
        if limit is not None and not (math.isfinite(limit) and limit > 0):
            raise UserError(f"--limit must be a number of documents per task (or a fraction below 1), got {limit}")
        if limit is not None and limit >= 1 and not float(limit).is_integer():
            raise UserError(f"--limit {limit}: give a whole number of documents, or a fraction below 1")
        if self.too_long not in TOO_LONG_CHOICES:
            raise UserError(f"--too-long must be one of {', '.join(TOO_LONG_CHOICES)}, got {self.too_long!r}")
        if self.too_long == "documents" and limit is not None:
            raise UserError(
                "--too-long documents and --limit cannot be combined (lm-eval takes a limit or a list of documents, "
                "not both); drop --limit"
            )
        if limit is not None and limit >= 1:
            self.limit = int(limit)  # 10.0 from a CLI float is 10 documents
        self.babilong_lengths = [text.strip().lower() for text in self.babilong_lengths]
        if len({babilong_length(text) for text in self.babilong_lengths}) < len(self.babilong_lengths):
            raise UserError(f"--babilong-lengths {','.join(self.babilong_lengths)} names a length twice")
        if self.babilong_lengths and not any(map(is_babilong, self.tasks)):
            raise UserError("--babilong-lengths applies to BABILong tasks (babilong_qa1, ...): none is in --tasks")


def babilong_length(text: str) -> int:
    """A BABILong length (its dataset config) as the rows' length in tokens: '4k' -> 4096, '0k' -> 0."""
    match = re.fullmatch(r"([0-9]{1,4})k", text)
    if match is None:
        raise UserError(f"--babilong-lengths: could not read {text!r}; give BABILong's lengths, such as 0k,1k,4k")
    return int(match.group(1)) * 1024


@dataclass(frozen=True)
class TaskPlan:
    """One requested task with its effective shots and the key its stored result must match."""

    name: str
    max_seq_length: str | None  # lm-eval's metadata max_seq_lengths for this unit, as given
    num_fewshot: int | None  # None: the task's own default (lm-eval then records what it used)
    fewshot_source: str  # given | evalkit standard for mmlu | lm-eval default
    key: str


class GeneralBenchmark(Benchmark):
    """lm-eval tasks as a benchmark of the one pipeline (evalkit.sweep.pipeline): a unit is a requested task."""

    name = "general"
    title = "General tasks"
    transient = ("_lms",)  # adapters of the engine this process built

    def __init__(self, settings: GeneralSettings) -> None:
        from evalkit.general.catalog import default_include_paths

        # evalkit's tasks/ first, each path resolved: a folder, or one line (not kept in the settings'
        # __post_init__, since a stored record's paths need not exist where it is read)
        resolved = [str(path) for path in default_include_paths(settings.include_paths)]
        self.settings = replace(settings, include_paths=resolved)
        self.engine = EngineChoice(settings.engine, settings.engine_settings)
        self._plans: dict[tuple[Unit, Path], TaskPlan] = {}
        self._lengths = {babilong_length(text): text for text in self.settings.babilong_lengths}
        self._lms: dict[int, Any] = {}  # the EngineLM of the engine built last

    @cached_property
    def catalog(self):
        """lm-eval's tasks under the settings' include paths, made on first use: after the pipeline's
        checks, so a request refused there costs no lm-eval start."""
        from evalkit.general.catalog import TaskCatalog

        return TaskCatalog([Path(p) for p in self.settings.include_paths], self.settings.tasks)

    def check(self, refs: list[CheckpointRef]) -> None:
        """Every task is one lm-eval knows; whether a task fits the window is known once it runs."""
        self.catalog.check(self.settings.tasks)

    def units(self) -> list[Unit]:
        """A task; with --babilong-lengths a BABILong task at each length, the shorter lengths first."""
        tasks = self.settings.tasks
        once = [Unit(name) for name in tasks if not (self._lengths and is_babilong(name))]
        return once + [Unit(name, length) for length in sorted(self._lengths) for name in tasks if is_babilong(name)]

    def unit_cost(self, unit: Unit) -> float:
        """Estimated work, for balancing shards and workers: the tasks a unit scores (a 57-task group
        weighs 57 single tasks). Documents per task would need every dataset loaded; not counted."""
        return float(self.catalog.leaf_tasks(unit.task))

    def plan(self, unit: Unit, path: Path) -> TaskPlan:
        if (unit, path) not in self._plans:
            seq = None if unit.length is None else self._lengths[unit.length]
            self._plans[unit, path] = _plan(self.catalog, unit.task, self.settings, path, seq)
        return self._plans[unit, path]

    def stored(self, unit: Unit, store: UnitStore) -> UnitResult | None:
        """The record of a finished (checkpoint, task) made with the same settings, else None (recompute)."""
        key, path = self.plan(unit, store.ref.path).key, store.file(".json")
        refuse_foreign([path])  # a stale record is replaced: never a file of the user's
        record = read_json_object(path)
        return _result(record, store, resumed=True) if record.get("key") == key else None

    def evaluate(
        self, engine: LazyEngine, unit: Unit, store: UnitStore, progress: UnitProgress
    ) -> UnitResult[tuple[str, dict]]:
        ref = store.ref
        record = _evaluate_task(
            lambda: self._engine_lm(engine, progress), self.catalog, self.plan(unit, ref.path), self.settings, store
        )
        for task, left in record.get("over_window", {}).items():
            self.log(
                f"{task} ({ref.run} step {ref.step}): {left['documents_over_window']} of {left['documents']} "
                f"documents need more than the window of {left['window']} tokens; scored on the rest"
            )
        for task, cut in record.get("truncated_middle", {}).items():
            self.log(
                f"{task} ({ref.run} step {ref.step}): {cut['documents_truncated']} of {cut['documents']} "
                f"documents cut in the middle to the window of {cut['window']} tokens (--too-long middle)"
            )
        return _result(record, store, resumed=False)

    def _engine_lm(self, engine: LazyEngine, progress: UnitProgress):
        """The engine as lm-eval's LM, made once per built engine and only when asked for: a
        checkpoint whose tasks are all on disk already, or whose data cannot be had, builds no engine."""
        from evalkit.general.adapter import EngineLM

        built = engine.get()
        if id(built) not in self._lms:
            self._lms.clear()  # the previous checkpoint's engine is closed: drop its LM
            self._lms[id(built)] = EngineLM(built, truncate_middle=self.settings.too_long == "middle")
        lm = self._lms[id(built)]
        lm.progress = lambda _request_type, done, total: progress(done, total)
        lm.cut, lm.seen = {}, {}  # counted per requested task
        return lm

    def finish_summary(self, summary: dict[str, Any], results: list[UnitResult], earlier: dict | None) -> dict:
        import lm_eval

        kept = {key: value for key, value in summary.items() if key != "provenance"}  # the tasks before it
        return {
            **kept,
            "tasks": dict(result.detail for result in results if result.detail is not None),
            "provenance": {**summary["provenance"], "lm_eval_version": lm_eval.__version__},
        }

    def average(self, rows: list[ResultRow]) -> Averages:
        from evalkit.general.tables import general_average_table, run_averages

        averages = run_averages(rows)
        settings = self.settings
        conditions = (
            f"Tasks {', '.join(settings.tasks)}; "
            f"shots {settings.num_fewshot if settings.num_fewshot is not None else 'standard'}"
            f"{f', limit {settings.limit}' if settings.limit else ''}"
            f"{f', BABILong lengths {lengths}' if (lengths := ','.join(settings.babilong_lengths)) else ''}; "
            f"engine {settings.engine} "
            f"{json.dumps(settings.engine_settings, sort_keys=True)}. "
            "Mean ± population std over the checkpoints listed."
        )
        return Averages(averages, general_average_table(averages), conditions)


def _result(record: dict[str, Any], store: UnitStore, resumed: bool) -> UnitResult[tuple[str, dict]]:
    """A task record as the unit's result: its rows, and (the detail) what the checkpoint's summary
    says of the task: its shots, its record file (relative to the checkpoint's folder of results,
    as the summary names it), whether it was read back rather than computed."""
    at = record.get("max_seq_lengths")  # a BABILong length
    entry = {
        **{key: record[key] for key in ("over_window", "truncated_middle") if record.get(key)},
        "num_fewshot": record["num_fewshot"],
        "fewshot_source": record["fewshot_source"],
        "file": store.file(".json").relative_to(store.folder.parent).as_posix(),
        "resumed": resumed,
    }
    rows = [read_row("general", row) for row in record["rows"]]
    engine_info = record.get("provenance", {}).get("engine") if resumed else None  # no engine was built for it
    return UnitResult(rows, (record["task"] + (f" @ {at}" if at else ""), entry), not resumed, engine_info)


def _plan(catalog, name: str, settings: GeneralSettings, path: Path, seq: str | None = None) -> TaskPlan:
    """The plan's key, what a stored task result must match to be reused: the settings' identity
    (evalkit.store.identity), the task with the shots in effect, and the dtype the engine computes in
    (an engine result fact, engines.base.RESULT_FACTS: its default where none is asked for, so
    asking for the default is the same key as asking for none), with a serving unlike a stock one,
    and the max_seq_lengths metadata where given."""
    shots, source = catalog.fewshot(name, settings.num_fewshot)
    served = EngineChoice(settings.engine, settings.engine_settings).served(path)
    asked = {key: value for key, value in settings.engine_settings.items() if key != "dtype"}
    key = identity_key(
        replace(settings, engine_settings=asked),
        with_count=True,
        task=name,
        num_fewshot=shots,
        dtype=served.dtype,
        **served.key_facts(),
        **({"max_seq_lengths": seq} if seq is not None else {}),
    )
    return TaskPlan(name, seq, shots, source, key)


def _evaluate_task(
    engine_lm: Callable[[], Any], catalog, plan: TaskPlan, settings: GeneralSettings, store: UnitStore
) -> dict[str, Any]:
    """Run one requested task through lm-eval, write its three files (the record last), return the record."""
    import lm_eval

    from evalkit.general.rows import bucket_rows, compact_samples, result_rows

    with catalog.loading(plan.name):
        # before the engine: data that cannot be had costs no model load
        tasks = catalog.load(plan.name, plan.max_seq_length)
        lm = engine_lm()
        results, over_window = _run_lm_eval(lm, tasks, catalog, plan, settings)
    length = None if plan.max_seq_length is None else babilong_length(plan.max_seq_length)
    samples = compact_samples(results.pop("samples", None) or {}, length)
    rows = [replace(row, length=length) for row in result_rows(results, plan.name, store.ref.run, store.ref.step)]
    ref, samples_file, lm_eval_file = store.ref, store.file(".samples.jsonl"), store.file(".lm_eval.json")
    cut = {  # --too-long middle: per lm-eval task, how many documents had their generation prompt cut
        task: {"documents_truncated": len(d), "documents": len(lm.seen.get(task, d)), "window": lm.engine.max_length}
        for task, d in sorted(lm.cut.items())
    }
    store.writer.text(samples_file, "".join(_json(s) for s in samples))
    store.writer.text(lm_eval_file, _json(results, indent=2))
    record = {
        "benchmark": "general",
        "run": ref.run,
        "step": ref.step,
        "checkpoint": str(ref.path),
        "task": plan.name,
        **({"length": length, "max_seq_lengths": plan.max_seq_length} if length is not None else {}),
        "key": plan.key,
        "num_fewshot_asked": plan.num_fewshot,  # None: the task's own default
        "fewshot_source": plan.fewshot_source,
        "num_fewshot": results.get("n-shot", {}).get(plan.name),  # what lm-eval used (None for a tag: see rows)
        "limit": settings.limit,
        "rows": [row_record(row) for row in [*rows, *bucket_rows(rows, samples)]],
        **({"over_window": over_window} if over_window else {}),  # --too-long documents: per task, what was left out
        **({"truncated_middle": cut} if cut else {}),
        "files": {"lm_eval": lm_eval_file.name, "samples": samples_file.name},
        "provenance": {
            **stamp(),
            "engine": lm.engine.engine_info(),
            "settings": asdict(settings),
            "lm_eval_version": lm_eval.__version__,
            "task_versions": results.get("versions", {}),
        },
    }
    store.writer.text(store.file(".json"), json.dumps(record, indent=2) + "\n")
    return record


def _run_lm_eval(
    lm, tasks, catalog, plan: TaskPlan, settings: GeneralSettings
) -> tuple[dict, dict[str, dict[str, int]]]:
    """lm-eval's simple_evaluate. With too_long="documents", a request type that finds documents
    over the window (its check runs before anything is computed) makes it run again on the
    documents that fit, and those left out are counted per task; a task none of whose documents
    fit is skipped whole, as under "task"."""
    from lm_eval import simple_evaluate

    from evalkit.general.catalog import quiet_logger

    fitting: dict[str, list[int]] = {}
    over_window: dict[str, dict[str, int]] = {}
    while True:
        try:
            with quiet_logger("lm_eval.evaluator", REDUNDANT_LM_EVAL_WARNINGS):
                results = simple_evaluate(  # a rerun gets fresh task objects
                    model=lm,
                    tasks=catalog.load(plan.name, plan.max_seq_length) if fitting else tasks,
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


def _json(data: Any, indent: int | None = None) -> str:
    from lm_eval.utils import handle_non_serializable

    # lm-eval's results carry numpy numbers and config callables; its own writer serialises them this way.
    return json.dumps(data, indent=indent, default=handle_non_serializable, ensure_ascii=False) + "\n"
