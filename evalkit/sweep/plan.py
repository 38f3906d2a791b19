"""Which of the pipeline's units this process evaluates: all of them, or one shard's (docs/scaling-out.md),
balanced by a benchmark's `unit_cost` and the same in every shard of one sweep (assign_shards).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalkit.arglists import environ_int
from evalkit.errors import UserError
from evalkit.files import atomic_write_json
from evalkit.models.refs import CheckpointRef
from evalkit.store.identity import identity
from evalkit.store.provenance import stamp
from evalkit.store.result_format import SCHEMA_VERSION


@dataclass(frozen=True)
class Shard:
    index: int
    count: int


# Job-array schedulers whose task's place in its array is read from the environment (--shard slurm):
# (task id, first id, step, count or None, last id or None). Slurm gives the count; SGE the last id.
SCHEDULERS = {
    "slurm": ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP", "SLURM_ARRAY_TASK_COUNT", None),
    "sge": ("SGE_TASK_ID", "SGE_TASK_FIRST", "SGE_TASK_STEPSIZE", None, "SGE_TASK_LAST"),
}


def parse_shard(text: str | None, environ: Mapping[str, str] = os.environ) -> Shard | None:
    """`I/N` (0 <= I < N), or a scheduler's name (slurm, sge): this array task's shard, from the
    scheduler's variables, so an array numbered from 1 or with a step (--array=1-16, 0-15:2) fits."""
    if text is None:
        return None
    if text.strip().lower() in SCHEDULERS:
        return array_shard(text.strip().lower(), environ)
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text, re.ASCII)
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise UserError(
            f"--shard must be I/N with 0 <= I < N (e.g. 0/4) or one of {', '.join(SCHEDULERS)}, got {text!r}"
        )
    return Shard(int(match.group(1)), int(match.group(2)))


def array_shard(scheduler: str, environ: Mapping[str, str]) -> Shard:
    """The shard of this job-array task: index (ID - first) / step, count from the scheduler's count
    (Slurm) or (last - first) / step + 1 (SGE). A variable missing or not a number is one line naming it."""
    id_name, first_name, step_name, count_name, last_name = SCHEDULERS[scheduler]
    task, first, step = (_array_variable(environ, name, scheduler) for name in (id_name, first_name, step_name))
    if count_name is not None:
        count = _array_variable(environ, count_name, scheduler)
    else:
        assert last_name is not None  # each scheduler names its count or its last id
        count = (_array_variable(environ, last_name, scheduler) - first) // step + 1
    index, off_step = divmod(task - first, step) if step > 0 else (-1, 0)
    if off_step or not 0 <= index < count:
        raise UserError(
            f"--shard {scheduler}: task {task} is not in an array of {count} tasks from {first} in steps of {step} "
            f"({id_name}, {first_name}, {step_name}); run it as an array task, or give --shard I/N"
        )
    return Shard(index, count)


def _array_variable(environ: Mapping[str, str], name: str, scheduler: str) -> int:
    try:
        return environ_int(name, environ=environ, fix=f"run inside a {scheduler} job array, or give --shard I/N")
    except UserError as err:
        raise UserError(f"--shard {scheduler}: {err}") from None


@dataclass
class Outcome:
    """A unit computed elsewhere (a Ray worker): its UnitResult or its skip record, and who answered."""

    result: Any = None  # evalkit.sweep.pipeline.UnitResult
    skip: dict[str, Any] | None = None
    answered_by: dict[str, Any] = field(default_factory=dict)
    engine_info: dict[str, Any] | None = None


@dataclass
class CheckpointWork:
    units: list  # list[Unit]: those evaluated here, in the benchmark's order
    positions: dict  # Unit -> index in benchmark.units(), to merge shards back into that order
    shard: dict[str, Any] | None = None
    outcomes: dict = field(default_factory=dict)  # Unit -> Outcome
    # An error that ended this checkpoint's units elsewhere (a broken checkpoint on a Ray worker):
    # raised by the pipeline for this checkpoint alone, which records it and goes on with the rest.
    failure: BaseException | None = None

    def provenance(self, answered: list) -> dict[str, Any]:
        """What the summary records: the shard and, per result row block, its unit's position
        (`answered`: (unit, rows) in the summary's order); who answered each remote unit."""
        record: dict[str, Any] = {}
        if self.shard is not None:
            record["shard"] = {
                **self.shard,
                "units": [[self.positions[unit], rows] for unit, rows in answered],
                "unit_order": [unit.fields() for unit in sorted(self.positions, key=lambda unit: self.positions[unit])],
            }
        workers = {unit.label(): o.answered_by for unit, o in self.outcomes.items() if o.answered_by}
        if workers:
            record["answered_by"] = workers
        return record


@dataclass
class WorkPlan:
    checkpoints: list[tuple[CheckpointRef, CheckpointWork]]  # those with any unit here
    shard: dict[str, Any] | None = None  # the shard's record (None unsharded)


def plan_work(benchmark, refs: list[CheckpointRef], shard: Shard | None = None) -> WorkPlan:
    units = benchmark.units()
    positions = {unit: i for i, unit in enumerate(units)}
    if shard is None:
        return WorkPlan([(ref, CheckpointWork(list(units), positions)) for ref in refs])
    pairs = [(r, u) for r, ref in enumerate(refs) for u in range(len(units))]
    costs = [float(benchmark.unit_cost(units[u])) for _, u in pairs]
    owner = assign_shards(costs, shard.count)
    record = {"index": shard.index, "count": shard.count, "plan": _plan_fingerprint(benchmark, refs, costs)}
    record["plan_units"] = len(pairs)
    mine: dict[int, list] = {}
    for (r, u), who in zip(pairs, owner):
        if who == shard.index:
            mine.setdefault(r, []).append(units[u])
    return WorkPlan([(refs[r], CheckpointWork(mine[r], positions, record)) for r in sorted(mine)], record)


def empty_shard_name(benchmark_name: str) -> str:
    return f"{benchmark_name}-empty-shard.json"


def write_empty_shard(out: Path, benchmark_name: str, shard: dict[str, Any]) -> str:
    """Record that this shard of the sweep has no units (more array tasks than units), so that the
    array task succeeds and merge counts the shard as present; returns the line to tell the user."""
    record = {"schema_version": SCHEMA_VERSION, "benchmark": benchmark_name, "shard": shard, "provenance": stamp()}
    path = out / empty_shard_name(benchmark_name)
    atomic_write_json(path, record)
    return (
        f"shard {shard['index']}/{shard['count']} has no units (the sweep has {shard['plan_units']} for "
        f"{shard['count']} shards): nothing to evaluate; recorded in {path} for evalkit merge"
    )


def assign_shards(costs: list[float], count: int) -> list[int]:
    """The shard of each item: costliest first to the least-loaded shard (longest-processing-time
    first, a schedule within 4/3 of the best), ties broken by position, so it is deterministic."""
    loads = [0.0] * count
    owner = [0] * len(costs)
    for item in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        shard = min(range(count), key=lambda s: (loads[s], s))
        owner[item] = shard
        loads[shard] += costs[item]
    return owner


def _plan_fingerprint(benchmark, refs: list[CheckpointRef], costs: list[float]) -> str:
    """The same for every shard of one sweep (same checkpoints, units, settings), different otherwise:
    merging shards of two different sweeps is refused on it."""
    text = json.dumps(
        {
            "benchmark": benchmark.name,
            "checkpoints": [[ref.run, ref.step] for ref in refs],
            "units": [unit.fields() for unit in benchmark.units()],
            "costs": costs,
            # What decides the results, not how fast they come (a shard rerun at another --batch-size
            # after an OOM) nor where the data files lie (their content is keyed per cell).
            "settings": identity(benchmark.settings, with_selection=True),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
