"""Rewrite the committed results under results/ to the current schema and keys, once.

    python scripts/migrate_results.py [results]

Summaries written before schema version 2 (13 in results/, RULER's and lm-eval tasks') become
version-2 summaries, and the answers they report are keyed as this evalkit keys them, so a rerun
reuses them without any compatibility path in evalkit:

- a RULER cell's sample log: each record's `data_key` (the data key with the sample count in it,
  made from the data files' locations; for the anchor encoding, that key hashed with the
  encoding's label) becomes `key`, the answer key (evalkit.ruler.runner.answer_key) of the
  summary's settings, the engine facts the summary recorded (dtype, tokenizer) and the cell's
  current data key; every record gets its checksum. The summary's rows are written in version 2's
  shape (they name their metric), its `data_keys` are the current ones, its settings complete;
- an lm-eval task's record: its `key` becomes evalkit.general.runner.task_key of its settings.

Nothing is recomputed and no score changes. Before rewriting a cell, its old key is made again
from today's generator (the formula the older evalkit used): a cell whose key does not come out
the same holds answers to other samples than today's, and the script stops with its name instead
of keying them as today's. A summary already at the current version is left as it is, so a second
run changes nothing. The leaderboard's tables read the same before and after (results/README.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

from evalkit.files import atomic_write_json, atomic_write_text
from evalkit.general.runner import GeneralSettings, task_key
from evalkit.ruler.cache import data_key
from evalkit.ruler.encoding import STANDARD, encoding_label
from evalkit.ruler.kinds import constants_digest, task_kind
from evalkit.ruler.prompt import BASE
from evalkit.ruler.runner import RulerSettings, answer_key
from evalkit.ruler.spec import GENERATOR_VERSION, NIAH_NEEDLE, NOISE_LINE, QA_DOCUMENT, task_spec
from evalkit.store.result_format import SCHEMA_VERSION, read_row, row_record
from evalkit.store.sample_log import CHECKSUM, KEY, record_checksum

MIGRATION = "scripts/migrate_results.py"
# The constants' digests the older keys left out (equal to these, they added nothing to a key).
CONSTANTS_AT_V1 = {
    "niah": "9b9eaabb348075487834",
    "variable_tracking": "3c4f239107f719801d88",
    "common_words_extraction": "ba6be521d78352c1c89f",
    "freq_words_extraction": "423643e8daa21558084d",
    "qa": "fefe1b66693c666a44d0",
}


class Refused(Exception):
    """A stored result this script will not key as today's: its message names it."""


def old_data_key(task: str, length: int, count: int, settings: RulerSettings) -> str:
    """The data key an evalkit before count-free keys recorded for a cell: today's generator
    hashed as it hashed it (the count in, the sizing only when not exact, the constants only when
    not version 1's, data files by location: none of the stored cells reads one)."""
    spec = task_spec(task)
    identity = task_kind(spec).data_identity(spec, settings.essays, settings.qa_dir)
    if identity and identity[0] == "sha256":
        raise Refused(f"{task}: reads a data file, which the older keys named by its location")
    fields = {
        "version": GENERATOR_VERSION,
        "task": spec.name,
        "kind": spec.kind,
        "params": dict(spec.params),
        "templates": [spec.template, spec.answer_prefix, spec.max_new_tokens, NIAH_NEEDLE, NOISE_LINE, QA_DOCUMENT],
        "length": int(length),
        "seed": int(settings.seed),
        "format": BASE.cache_token(),
        "data": identity,
        "exact": False,
        **({"sizing": settings.sizing} if settings.sizing != "exact" else {}),
        **({"constants": digest} if (digest := constants_digest(spec.kind)) != CONSTANTS_AT_V1[spec.kind] else {}),
        "num_samples": int(count),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:20]


def old_log_key(old_key: str, label: str) -> str:
    return old_key if label == STANDARD else hashlib.sha256(f"{old_key}|{label}".encode()).hexdigest()[:20]


def complete(cls: type, record: dict) -> dict:
    """The stored settings with every field of today's settings (a missing one at its default)."""
    names = {field.name for field in dataclasses.fields(cls)}
    return dataclasses.asdict(cls(**{key: value for key, value in record.items() if key in names}))


def migrate_ruler(path: Path, summary: dict) -> str:
    provenance = summary["provenance"]
    settings = RulerSettings(**complete(RulerSettings, provenance["settings"]))
    if settings.prompt_format != "base":
        raise Refused(f"{path}: prompt format {settings.prompt_format!r} (the older keys of chat prompts are not read)")
    engine = provenance["engine"]
    facts = {"dtype": engine["dtype"], "tokenizer_fingerprint": engine["tokenizer_fingerprint"]}
    folder, logs_done, records_done = path.parent / "ruler", 0, 0
    new_keys = {}
    for row in summary["rows"]:
        task, length = row["task"], int(row["length"])
        label = encoding_label(row.get("encoding"), row.get("doc_tokens"))
        cell = f"{task}@{length}" + ("" if label == STANDARD else f"@{label}")
        recorded = provenance["data_keys"][cell]
        if old_data_key(task, length, row["n"], settings) != recorded:
            raise Refused(
                f"{path}: cell {cell}'s data key is not today's generator's: its answers are kept as they are"
            )
        reading = {"window_anchor": "sink"} if label != STANDARD and engine.get("window_anchor") == "sink" else {}
        cell_settings = dataclasses.replace(
            settings, encoding=row.get("encoding") or STANDARD, doc_tokens=row.get("doc_tokens") or settings.doc_tokens
        )
        new_keys[cell] = data_key(task, length, settings.seed, **settings.data_options(), prompt_format=BASE)
        answers = answer_key(cell_settings, new_keys[cell], facts, reading)
        log = folder / task / (f"{length}.jsonl" if label == STANDARD else f"{length}.{label}.jsonl")
        records_done += rekey_log(log, old_log_key(recorded, label), answers)
        logs_done += 1
    summary["schema_version"] = SCHEMA_VERSION
    summary["rows"] = [row_record(read_row("ruler", row, 1)) for row in summary["rows"]]
    provenance["settings"] = dataclasses.asdict(settings)
    provenance["data_keys"] = new_keys
    provenance["migrated_by"] = MIGRATION
    atomic_write_json(path, summary)
    return f"{path}: {len(summary['rows'])} rows, {logs_done} logs, {records_done} records rekeyed"


def rekey_log(log: Path, old_key: str, new_key: str) -> int:
    """Every record of `log` made under `old_key` (all of them, or the log is refused) under `new_key`, checksummed."""
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    others = [record["index"] for record in records if record.get("data_key") != old_key]
    if others:
        raise Refused(f"{log}: samples {others[:5]} were made under another key than its summary's")
    lines = []
    for record in records:
        record = {name: value for name, value in record.items() if name not in ("data_key", CHECKSUM)}
        record[KEY] = new_key
        record[CHECKSUM] = record_checksum(record)
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    atomic_write_text(log, "".join(lines))
    return len(records)


def old_task_key(settings: dict, task: str, shots: int | None) -> str:
    """The key the evalkit before this migration gave a task record: its settings' identity, too_long left out."""
    engine_settings = {
        k: v for k, v in sorted(settings["engine_settings"].items()) if k not in ("batch_size", "device")
    }
    chosen = {"num_fewshot": settings["num_fewshot"], "limit": settings["limit"], "engine": settings["engine"]}
    chosen.update(engine_settings=engine_settings, task=task, num_fewshot=shots)
    return hashlib.sha256(json.dumps(chosen, sort_keys=True, default=str).encode()).hexdigest()[:16]


def migrate_general(path: Path, summary: dict) -> str:
    provenance = summary["provenance"]
    settings_record = complete(GeneralSettings, provenance["settings"])
    settings = GeneralSettings(**settings_record)
    for task, entry in summary["tasks"].items():
        record_path = path.parent / entry["file"]
        record = json.loads(record_path.read_text(encoding="utf-8"))
        shots = record["num_fewshot_asked"]
        if old_task_key(record["provenance"]["settings"], task, shots) != record["key"]:
            raise Refused(f"{record_path}: its key is not the one its settings made")
        record["key"] = task_key(settings, task, shots, record["provenance"]["engine"]["dtype"])
        record["provenance"]["settings"] = settings_record
        atomic_write_json(record_path, record)
    summary["schema_version"] = SCHEMA_VERSION
    summary["rows"] = [row_record(read_row("general", row, 1)) for row in summary["rows"]]
    provenance["settings"] = settings_record
    provenance["migrated_by"] = MIGRATION
    atomic_write_json(path, summary)
    return f"{path}: {len(summary['rows'])} rows, {len(summary['tasks'])} task records rekeyed"


def main(root: Path) -> int:
    summaries = sorted(root.rglob("*-summary.json"))
    for path in summaries:
        summary = json.loads(path.read_text(encoding="utf-8"))
        if summary.get("schema_version", 1) == SCHEMA_VERSION:
            print(f"{path}: current, left as it is")
            continue
        benchmark = summary.get("benchmark") or "ruler"
        migrate = {"ruler": migrate_ruler, "general": migrate_general}.get(benchmark)
        if migrate is None:
            raise Refused(f"{path}: a {benchmark} summary, which this migration does not know")
        print(migrate(path, summary))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "results")))
    except Refused as why:
        print(f"error: {why}", file=sys.stderr)
        sys.exit(1)
