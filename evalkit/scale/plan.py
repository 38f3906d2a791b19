"""Which of the pipeline's units this process evaluates: all of them, or one shard's.

A shard is a deterministic 1/N of the (checkpoint, unit) pairs, balanced by each unit's
estimated tokens (a benchmark's `unit_cost`; RULER: length x samples), not by their count:
pairs go, costliest first, to the shard with the least so far (ties to the lowest index), so
every shard of one sweep computes the same assignment from the same request.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from evalkit.checkpoint_refs import CheckpointRef
from evalkit.errors import UserError


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str | None) -> Shard | None:
    """`I/N` (0 <= I < N), as a Slurm array passes it: --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise UserError(f"--shard must be I/N with 0 <= I < N (e.g. 0/4), got {text!r}")
    return Shard(int(match.group(1)), int(match.group(2)))


@dataclass
class Outcome:
    """A unit computed elsewhere (a Ray worker): its UnitResult or its skip record, and who answered."""

    result: Any = None  # evalkit.pipeline.UnitResult
    skip: dict[str, Any] | None = None
    answered_by: dict[str, Any] = field(default_factory=dict)
    engine_info: dict[str, Any] | None = None


@dataclass
class CheckpointWork:
    """One checkpoint's share: the units it evaluates here (in the benchmark's order), their
    index among all its units (for merging shards back into that order), what was computed
    elsewhere, and what its summary records of the plan."""

    units: list  # list[Unit]
    positions: dict  # Unit -> index in benchmark.units()
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

    def engine_info(self) -> dict[str, Any] | None:
        return next((o.engine_info for o in self.outcomes.values() if o.engine_info), None)


@dataclass
class WorkPlan:
    """The checkpoints with any unit here, and each one's work."""

    checkpoints: list[tuple[CheckpointRef, CheckpointWork]]

    def refs(self) -> list[CheckpointRef]:
        return [ref for ref, _ in self.checkpoints]


def unit_cost(benchmark, unit) -> float:
    """Estimated tokens of a unit (1 for a benchmark that does not say)."""
    cost = getattr(benchmark, "unit_cost", None)
    return float(cost(unit)) if cost is not None else 1.0


def plan_work(benchmark, refs: list[CheckpointRef], shard: Shard | None = None) -> WorkPlan:
    units = benchmark.units()
    positions = {unit: i for i, unit in enumerate(units)}
    if shard is None:
        return WorkPlan([(ref, CheckpointWork(list(units), positions)) for ref in refs])
    pairs = [(r, u) for r, ref in enumerate(refs) for u in range(len(units))]
    costs = [unit_cost(benchmark, units[u]) for _, u in pairs]
    owner = assign_shards(costs, shard.count)
    record = {"index": shard.index, "count": shard.count, "plan": _plan_fingerprint(benchmark, refs, costs)}
    record["plan_units"] = len(pairs)
    mine: dict[int, list] = {}
    for (r, u), who in zip(pairs, owner):
        if who == shard.index:
            mine.setdefault(r, []).append(units[u])
    return WorkPlan([(refs[r], CheckpointWork(mine[r], positions, record)) for r in sorted(mine)])


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
            "settings": benchmark.settings_record(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
