"""`evalkit merge`: join the outputs of a sweep's shards (`--shard I/N`, one --out each) into one.

Every file of every shard is copied to its place in the destination; each checkpoint's summaries
are joined into one, rows and skips back in the benchmark's unit order, so the merged output
reads as the unsharded run's (`evalkit leaderboard`, or a local rerun into it that computes
nothing). Refused with one line, before anything is written: shards of different sweeps (another
plan), the same shard twice or two shards holding one unit or file, an incomplete set, an output
that is not a shard's. The destination is built beside itself and renamed into place.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from evalkit.errors import UserError
from evalkit.files import (
    LOCK_NAME,
    atomic_write_json,
    check_output_dir,
    move_into_place,
    new_directory_beside,
    read_json_object,
)
from evalkit.store.result_format import SUMMARY_SUFFIX, read_summary
from evalkit.sweep.plan import empty_shard_name


def merge_shards(inputs: list[Path], dest: Path) -> dict[str, int]:
    """Merge shard outputs `inputs` into `dest` (new or empty); returns what was merged, counted."""
    inputs, dest = [Path(p) for p in inputs], Path(dest)
    _check_paths(inputs, dest)
    empty = _read_empty_shards(inputs)
    summaries = _read_shard_summaries([path for path in inputs if path not in empty])
    _check_one_sweep(summaries, empty)
    merged = {rel: _merge_checkpoint(rel, found) for rel, found in summaries.items()}
    _check_complete(summaries, merged, empty)
    copies = _files_to_copy(inputs)
    tmp = new_directory_beside(dest)
    try:
        for rel, directory in copies.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(directory / rel, tmp / rel)
        for rel, summary in merged.items():
            atomic_write_json(tmp / rel, summary)
        move_into_place(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"shards": len(inputs), "empty": len(empty), "summaries": len(merged), "files": len(copies)}


def _read_empty_shards(inputs: list[Path]) -> dict[Path, dict]:
    """The inputs that are shards without units (evalkit.sweep.plan.write_empty_shard): their records,
    read where the directory holds no summary (a record beside summaries is an earlier run's)."""
    found = {}
    for directory in inputs:
        records = sorted(directory.glob(empty_shard_name("*")))
        if not records or _summary_files(directory):
            continue
        record = read_json_object(records[0])
        if not isinstance(record.get("shard"), dict):
            raise UserError(f"{records[0]} is not an evalkit empty-shard record; rerun that shard")
        found[directory] = record
    return found


def _check_paths(inputs: list[Path], dest: Path) -> None:
    if not inputs:
        raise UserError("no shard output given: evalkit merge OUT0 OUT1 ... --out DEST")
    for path in inputs:
        if not path.is_dir():
            raise UserError(f"{path} is not a directory; give the --out directories of the shard runs")
        if dest.resolve().is_relative_to(path.resolve()):  # the shard output itself, or a folder in it
            raise UserError(f"--out {dest} is (inside) the shard output {path}; give a new directory")
    check_output_dir(dest)
    if dest.is_dir() and any(dest.iterdir()):
        raise UserError(f"--out {dest} is not empty; give a new or empty directory for the merged results")
    if len({p.resolve() for p in inputs}) < len(inputs):
        raise UserError("a shard output is given twice; give each shard's --out once")


def _summary_files(directory: Path) -> list[Path]:
    """<run>/step-<N>/<benchmark>-summary.json: the per-checkpoint summaries (not --avg's files)."""
    return sorted(p for p in directory.glob(f"*/step-*/*{SUMMARY_SUFFIX}") if p.is_file())


def _read_shard_summaries(inputs: list[Path]) -> dict[Path, list[tuple[Path, dict]]]:
    found: dict[Path, list[tuple[Path, dict]]] = {}
    for directory in inputs:
        files = _summary_files(directory)
        if not files:
            raise UserError(f"{directory} holds no evalkit summary (<run>/step-<N>/*{SUMMARY_SUFFIX})")
        for path in files:
            summary = read_summary(path)
            if summary is None or not isinstance((summary.get("provenance") or {}).get("shard"), dict):
                raise UserError(f"{path} is not a shard's summary (written without --shard); merge only shard outputs")
            found.setdefault(path.relative_to(directory), []).append((directory, summary))
    return found


def _shard(summary: dict) -> dict[str, Any]:
    """A shard summary's record of its shard, or an empty shard's (which holds it at the top)."""
    return summary["shard"] if "shard" in summary else summary["provenance"]["shard"]


def _check_one_sweep(summaries: dict[Path, list[tuple[Path, dict]]], empty: dict[Path, dict]) -> None:
    """One plan (same checkpoints, units, settings, shard count) and one output per shard index."""
    by_benchmark: dict[str, tuple[Path, dict]] = {}
    index_from: dict[tuple[str, int], Path] = {}
    records = [item for found in summaries.values() for item in found] + list(empty.items())
    for directory, summary in records:
        shard, name = _shard(summary), summary.get("benchmark") or "ruler"  # as result_format reads it
        first = by_benchmark.setdefault(name, (directory, shard))
        if (shard["plan"], shard["count"]) != (first[1]["plan"], first[1]["count"]):
            raise UserError(
                f"conflicting shards: {directory} and {first[0]} come from different sweeps (other "
                "checkpoints, units, settings or shard count); merge the shards of one sweep"
            )
        owner = index_from.setdefault((name, shard["index"]), directory)
        if owner != directory:
            raise UserError(
                f"overlapping shards: {owner} and {directory} are both shard {shard['index']}/{shard['count']}"
            )


def _position(order: list[dict], entry: dict) -> int:
    """The index of the unit a skip record belongs to (its task, and length where units have one)."""
    for i, fields in enumerate(order):
        if all(entry.get(key) == value for key, value in fields.items()):
            return i
    raise UserError(f"a skip record ({entry.get('task')}) matches none of its shard's units; not an evalkit summary?")


def _merge_checkpoint(rel: Path, found: list[tuple[Path, dict]]) -> dict:
    """One checkpoint's summaries (one per shard that had any of its units) joined into one."""
    found = sorted(found, key=lambda item: _shard(item[1])["index"])
    _check_same_weights(found)
    blocks: dict[int, tuple[Path, list]] = {}
    skips: dict[int, tuple[Path, dict]] = {}
    for directory, summary in found:
        shard, rows = _shard(summary), summary["rows"]
        if sum(count for _, count in shard["units"]) != len(rows):
            raise UserError(
                f"{directory / rel} holds rows beyond its shard's units (an earlier run's cells?); "
                "merge shards run into fresh --out directories"
            )
        start = 0
        for position, count in shard["units"]:
            _claim(blocks, skips, position, directory, rel)
            blocks[position] = (directory, rows[start : start + count])
            start += count
        for skip in summary["skipped"]:
            position = _position(shard["unit_order"], skip)
            _claim(blocks, skips, position, directory, rel)
            skips[position] = (directory, skip)
    merged = json.loads(json.dumps(found[0][1]))  # a deep copy of the first shard's summary
    merged["rows"] = [row for position in sorted(blocks) for row in blocks[position][1]]
    merged["skipped"] = [skips[position][1] for position in sorted(skips)]
    for key, value in found[0][1].items():  # a benchmark's own per-unit tables (general: "tasks")
        if isinstance(value, dict) and key not in ("provenance",):
            merged[key] = {k: v for _, summary in found for k, v in (summary.get(key) or {}).items()}
    provenance = merged["provenance"]
    for key in ("data_keys", "answered_by"):
        joined = {k: v for _, summary in found for k, v in (summary["provenance"].get(key) or {}).items()}
        if joined:
            provenance[key] = joined
    shard = provenance.pop("shard")
    provenance["merged_shards"] = [
        {"shard": f"{_shard(s)['index']}/{shard['count']}", "from": str(d), "created": s["provenance"].get("created")}
        for d, s in found
    ]
    merged["_units_merged"] = len(blocks) + len(skips)
    return merged


def _check_same_weights(found: list[tuple[Path, dict]]) -> None:
    """Shards of one run name and step must have evaluated the same weights: the plan knows checkpoints
    by name only, so shards run over two directories of one name (another run's weights under it)
    would merge into one checkpoint's scores. A summary written before the record existed is not
    checked (it has none)."""
    recorded = [summary for _, summary in found if summary["provenance"].get("weights") is not None]
    for summary in recorded[1:]:
        first = recorded[0]
        if summary["provenance"]["weights"] != first["provenance"]["weights"]:
            raise UserError(
                f"conflicting shards: {first['run']} step {first['step']} is different weights in "
                f"{first['checkpoint']} and {summary['checkpoint']}; evaluate one checkpoint directory in "
                "every shard (or give the runs different names)"
            )


def _claim(blocks: dict, skips: dict, position: int, directory: Path, rel: Path) -> None:
    earlier = blocks.get(position, skips.get(position))
    if earlier is not None:
        raise UserError(f"overlapping shards: {earlier[0]} and {directory} both hold a unit of {rel.parent}")


def _check_complete(summaries: dict, merged: dict[Path, dict], empty: dict[Path, dict]) -> None:
    """Every unit of the sweep present once (a missing shard, or a shard still running, is refused)."""
    by_benchmark: dict[str, list] = {record["benchmark"]: [] for record in empty.values()}
    for summary in merged.values():
        by_benchmark.setdefault(summary["benchmark"], []).append(summary.pop("_units_merged"))
    records = [s for found in summaries.values() for _, s in found] + list(empty.values())
    for name, counts in by_benchmark.items():
        shard = _shard(next(s for s in records if s.get("benchmark") == name))
        seen = sorted({_shard(s)["index"] for s in records})
        if sum(counts) != shard["plan_units"]:
            raise UserError(
                f"incomplete {name} sweep: {sum(counts)} of its {shard['plan_units']} units are here (shards "
                f"{', '.join(map(str, seen))} of {shard['count']}); pass every shard's --out, each finished"
            )


def _files_to_copy(inputs: list[Path]) -> dict[Path, Path]:
    """Every file under the shard outputs but their summaries, lock, --avg files and temporaries;
    one path held by two shards is refused unless both hold the same bytes."""
    owner: dict[Path, Path] = {}  # relative path -> the shard output it is copied from
    for directory in inputs:
        summaries = set(_summary_files(directory))
        for path in sorted(directory.rglob("*")):
            rel = path.relative_to(directory)
            if not path.is_file() or path in summaries or _not_merged(rel):
                continue
            if rel in owner and (owner[rel] / rel).read_bytes() != path.read_bytes():
                raise UserError(f"overlapping shards: {owner[rel]} and {directory} both hold {rel}, unequal")
            owner.setdefault(rel, directory)
    return owner


def _not_merged(rel: Path) -> bool:
    name = rel.name
    top_level_average = len(rel.parts) == 1 and "-avg." in name  # a shard's partial --avg
    hidden = any(part.startswith(".") for part in rel.parts)  # temporaries
    empty_record = len(rel.parts) == 1 and rel.match(empty_shard_name("*"))  # a shard's, not the sweep's
    return name == LOCK_NAME or hidden or top_level_average or empty_record
