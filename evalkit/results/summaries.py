"""The stored summaries under results directories, read once each and at most one per checkpoint
(docs/leaderboards.md): merging two summaries of one checkpoint could only pick one file's scores
or average the two, silently.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from evalkit.errors import UserError
from evalkit.store.result_format import STANDARD, ResultRow, failed_name, not_understood, summary_name, summary_rows

RULER_SUMMARY = summary_name("ruler")
GENERAL_SUMMARY = summary_name("general")
FAILED_SUFFIX = failed_name("")  # "-failed.json": a checkpoint a sweep could not evaluate


def not_read_note(unread: list[str]) -> str:
    """The one note on summaries left out (summary_files' `notes`): the same heading and lines in
    the markdown leaderboard, on stderr for its csv/json export and for compare, and in compare.md."""
    return "Not read (not in any table; each line says why):\n\n" + "\n".join(unread)


def summary_files(dirs: list[Path], name: str, notes: list[str] | None = None) -> list[tuple[Path, dict]]:
    """Every summary file `name` under `dirs` with its contents, each read once, at most one per (run, step).
    A file of another format is left out, with a line saying why added to `notes`."""
    paths: dict[Path, Path] = {}  # resolved -> as found first: a file under two given directories is read once
    for directory in dirs:
        for path in sorted(Path(directory).rglob(name)):
            paths.setdefault(path.resolve(), path)
    found: dict[tuple[str, int], tuple[Path, dict]] = {}
    for path in paths.values():
        try:
            summary = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UserError(f"cannot read {path}: {err}") from None
        reason = not_understood(path, summary)
        if reason is not None:
            if notes is not None:
                notes.append(f"- {path}: not read: {reason}")
            continue
        _check_summary(path, summary)
        key = (summary["run"], summary["step"])
        if key in found:  # one line naming both files, and the evalkit versions when they differ
            provenances = [s.get("provenance") or {} for s in (found[key][1], summary)]
            versions = {f"{p.get('evalkit_version', '?')} ({p.get('git_hash', '?')})" for p in provenances}
            differ = f" (written by evalkit {' and '.join(sorted(versions))})" if len(versions) > 1 else ""
            raise UserError(
                f"{key[0]} step {key[1]} is in two summaries, {found[key][0]} and {path}{differ}; they are never "
                "merged: pass only one of the directories, or move one file away"
            )
        found[key] = (path, summary)
    return list(found.values())


def _check_summary(path: Path, summary: dict) -> None:
    """Refuse a summary without run, step and rows that all belong to that checkpoint, once per cell
    (its step read as an int)."""
    shaped = isinstance(summary, dict) and isinstance(summary.get("run"), str) and isinstance(summary.get("rows"), list)
    if not shaped:
        raise UserError(f"{path} is not an evalkit summary (no run or rows); remove it or rerun that checkpoint")
    try:
        summary["step"] = int(summary["step"])
        cells = [_row_cell(row, summary) for row in summary_rows(summary)]
    except (AttributeError, KeyError, TypeError, ValueError):  # AttributeError: a provenance that is no record
        raise UserError(f"{path} has a malformed step or row; remove it or rerun that checkpoint") from None
    if None in cells:
        raise UserError(
            f"{path} holds rows of another checkpoint than {summary['run']} step {summary['step']}; "
            "remove it or rerun that checkpoint"
        )
    twice = sorted((cell for cell, count in Counter(cells).items() if count > 1 and cell is not None), key=str)
    if twice:
        raise UserError(f"{path} holds {' '.join(map(str, twice[0]))} twice; remove it or rerun that checkpoint")


def _row_cell(row: ResultRow, summary: dict) -> tuple | None:
    """The cell a row scores (None: the row names another checkpoint than its file); an lm-eval
    group's member is scored once under each requested group that holds it."""
    if row.run != summary["run"] or row.step != summary["step"]:
        return None
    label = row.encoding_label()  # an encoding other than standard (RULER's, ppl's) is a cell of its own
    encoding = () if label in (None, STANDARD) else (label,)
    if row.benchmark == "ruler":
        return (row.task, row.length) + encoding
    return (row.requested, row.task, row.metric, row.filter, row.length) + encoding
