"""`evalkit merge` (docs/scaling-out.md): join the outputs of a sweep's shards into one, read as
the unsharded run's. Files at the top of a shard's --out are of its share alone: never copied nor compared.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalkit.errors import UserError
from evalkit.files import atomic_write_json, check_output_dir, move_into_place, new_directory_beside, read_json_object
from evalkit.store.result_format import SUMMARY_SUFFIX, read_summary, summary_name
from evalkit.sweep.plan import empty_shard_name

# Provenance of each shard itself: listed per shard (created), joined (answered_by, data_keys) or checked (weights).
_PER_SHARD = {"created", "command", "shard", "answered_by", "data_keys", "weights"}
# Provenance that may differ between the shards of one sweep (kept under merged_shards): how fast and
# on which host each ran, never what it computed. engine.device: cuda:0 or cuda:1 (the GPU: machine.gpu)
_EXECUTION = {"settings", "machine.cpu", "machine.cores", "machine.torch_threads", "machine.python",
              "engine.model_path", "engine.device", "engine.batch_size", "engine.packed_batch_size",
              "engine.packed_batch_note", "engine.threads"}  # fmt: skip
Redraw = Callable[[list[dict], Path], None]
_CODE = ("evalkit_version", "git_hash", "dirty_files")  # the code every shard ran, empty ones too


def merge_shards(inputs: list[Path], dest: Path, redraw: Redraw | None = None) -> dict[str, Any]:
    """Merge shard outputs `inputs` into `dest` (new or empty); returns the counts and `unscored` (the
    benchmarks whose whole sweep scored nothing). `redraw(summaries, directory)` draws the files derived
    from the merged summaries (the caller's: sweep/ imports no benchmark) before dest is in place."""
    inputs, dest = [Path(p) for p in inputs], Path(dest)
    _check_paths(inputs, dest)
    empty = _read_empty_shards(inputs)
    summaries = _read_shard_summaries(inputs, {directory for directory, _ in empty})
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
        if redraw:
            redraw(list(merged.values()), tmp)
        move_into_place(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    names = {record["benchmark"] for _, record in empty} | {s["benchmark"] for s in merged.values()}
    unscored = sorted(names - {s["benchmark"] for s in merged.values() if s["rows"]})
    shards = {"shards": len(inputs), "empty": len({directory for directory, _ in empty})}
    return shards | {"summaries": len(merged), "files": len(copies), "unscored": unscored}


def _read_empty_shards(inputs: list[Path]) -> list[tuple[Path, dict]]:
    """The records of shards without units (evalkit.sweep.plan.write_empty_shard), each read where its
    --out holds no summary of its benchmark (a record beside one is an earlier run's)."""
    found = []
    for directory in inputs:
        summarized = {path.name for path in _summary_files(directory)}
        for path in sorted(directory.glob(empty_shard_name("*"))):
            record = read_json_object(path)
            if not isinstance(record.get("shard"), dict) or not isinstance(record.get("benchmark"), str):
                raise UserError(f"{path} is not an evalkit empty-shard record; rerun that shard")
            if summary_name(record["benchmark"]) not in summarized:
                found.append((directory, record))
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
    """The per-checkpoint summaries (not --avg's files)."""
    return sorted(p for p in directory.glob(f"*/step-*/*{SUMMARY_SUFFIX}") if p.is_file())


def _read_shard_summaries(inputs: list[Path], empty: set[Path]) -> dict[Path, list[tuple[Path, dict]]]:
    found: dict[Path, list[tuple[Path, dict]]] = {}
    for directory in inputs:
        files = _summary_files(directory)
        if not files and directory not in empty:
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


def _check_one_sweep(summaries: dict[Path, list[tuple[Path, dict]]], empty: list[tuple[Path, dict]]) -> None:
    """One plan (same checkpoints, units, settings, shard count), one code (_CODE) and one output
    per shard index, for each benchmark's sweep."""
    by_benchmark: dict[str, tuple[Path, dict]] = {}
    code: dict[str, tuple[Path, dict]] = {}
    index_from: dict[tuple[str, int], Path] = {}
    records = [item for found in summaries.values() for item in found] + empty
    for directory, summary in records:
        shard, name = _shard(summary), summary["benchmark"]
        stamp = {key: summary["provenance"].get(key) for key in _CODE}
        _agree(code.setdefault(name, (directory, stamp)), (directory, stamp))
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
    # The first shard that built an engine (one whose units were all skipped or read back built none):
    # the others are compared with it, and the merged summary is a deep copy of its.
    first = next(((d, s) for d, s in found if s["provenance"].get("engine")), found[0])
    own = [_agree((first[0], first[1]["provenance"]), (d, s["provenance"])) for d, s in found]
    merged = json.loads(json.dumps(first[1]))
    merged["rows"] = [row for position in sorted(blocks) for row in blocks[position][1]]
    merged["skipped"] = [skips[position][1] for position in sorted(skips)]
    for key, value in first[1].items():  # a benchmark's own per-unit tables (general: "tasks")
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
        | ({"differs": differs} if differs else {})
        for (d, s), differs in zip(found, own)
    ]
    merged["_units_merged"] = len(blocks) + len(skips)
    return merged


def _agree(first: tuple[Path, dict], other: tuple[Path, dict]) -> dict[str, Any]:
    """The other shard's provenance values that differ from the first's only in how it ran (_EXECUTION);
    refused where they decide a score. Engine and machine are compared only where both built an engine."""
    (first_dir, a), (other_dir, b) = first, other
    skipped = _PER_SHARD | ({"engine", "machine"} if not (a.get("engine") and b.get("engine")) else set())
    keys = [key for key in {**a, **b} if key not in skipped]  # in the record's order: the commit first
    differences = _differences({k: a.get(k) for k in keys}, {k: b.get(k) for k in keys})
    for path, (mine, theirs) in differences.items():
        if not any(path == key or path.startswith(f"{key}.") for key in _EXECUTION):
            what = {"git_hash": "evalkit commit", "evalkit_version": "evalkit version"}.get(path, path)
            raise UserError(
                f"conflicting shards: {first_dir} ran with {what} {_short(mine)} and {other_dir} with "
                f"{_short(theirs)}; the shards of one sweep must compute alike: rerun those that differ, then merge"
            )
    return {path: theirs for path, (_, theirs) in differences.items()}


def _differences(a: dict, b: dict, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Dotted path -> (a's value, b's) wherever the two differ."""
    found: dict[str, tuple[Any, Any]] = {}
    for key in {**a, **b}:
        mine, theirs = a.get(key), b.get(key)
        if isinstance(mine, dict) and isinstance(theirs, dict):
            found |= _differences(mine, theirs, f"{prefix}{key}.")
        elif mine != theirs:
            found[f"{prefix}{key}"] = (mine, theirs)
    return found


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _check_same_weights(found: list[tuple[Path, dict]]) -> None:
    """Shards of one run name and step must have evaluated the same weights: the plan knows checkpoints
    by name only (a summary written before the record existed is not checked)."""
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


def _check_complete(summaries: dict, merged: dict[Path, dict], empty: list[tuple[Path, dict]]) -> None:
    """Every unit of the sweep present once (a missing shard, or a shard still running, is refused)."""
    by_benchmark: dict[str, list] = {record["benchmark"]: [] for _, record in empty}
    for summary in merged.values():
        by_benchmark.setdefault(summary["benchmark"], []).append(summary.pop("_units_merged"))
    records = [s for found in summaries.values() for _, s in found] + [record for _, record in empty]
    for name, counts in by_benchmark.items():
        shard = _shard(next(s for s in records if s["benchmark"] == name))
        seen = sorted({_shard(s)["index"] for s in records if s["benchmark"] == name})
        if sum(counts) != shard["plan_units"]:
            raise UserError(
                f"incomplete {name} sweep: {sum(counts)} of its {shard['plan_units']} units are here (shards "
                f"{', '.join(map(str, seen))} of {shard['count']}); pass every shard's --out, each finished"
            )


def _files_to_copy(inputs: list[Path]) -> dict[Path, Path]:
    """Every file under the shards' checkpoint directories but their summaries and temporaries; one
    path held by two shards is refused unless both hold the same bytes."""
    owner: dict[Path, Path] = {}  # relative path -> the shard output it is copied from
    for directory in inputs:
        summaries = set(_summary_files(directory))
        for path in sorted(directory.rglob("*")):
            rel = path.relative_to(directory)
            # a shard's own: a file at the top of its --out (derived from its share, its lock or
            # empty-shard record), or a temporary
            if not path.is_file() or path in summaries or len(rel.parts) == 1 or any(p[0] == "." for p in rel.parts):
                continue
            if rel in owner and (owner[rel] / rel).read_bytes() != path.read_bytes():
                raise UserError(f"overlapping shards: {owner[rel]} and {directory} both hold {rel}, unequal")
            owner.setdefault(rel, directory)
    return owner
