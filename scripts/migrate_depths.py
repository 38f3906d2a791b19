"""Give every committed niah sample log under results/ its needles' depths, once.

    python scripts/migrate_depths.py TOKENIZER_DIR... [--root results]

Each record of a niah task's log (<step>/ruler/<task>/<length>[.<encoding>].jsonl) gets `depths`,
where the runner writes it (after `prompt_sha`), and its `sha` recomputed; no other byte changes.
The depths come from regenerating the record's sample with its summary's settings (seed, sizing,
essays, prompt format) and the tokenizer its summary names (a TOKENIZER_DIR whose fingerprint is
that one), and are written only when the regenerated prompt's hash is the record's `prompt_sha`
and its references the record's: any other record stops the script with its file and line,
before any file is written. A record that has its depths already is checked the same way and left.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from evalkit.corpus import tokenizer_fingerprint
from evalkit.files import atomic_write_text
from evalkit.models.check import load_tokenizer
from evalkit.ruler.generation import generate
from evalkit.ruler.prompt import BASE
from evalkit.ruler.runner import _prompt_hash
from evalkit.ruler.spec import SPECS
from evalkit.store.sample_log import CHECKSUM, record_checksum


class Refused(Exception):
    """A record this script will not give depths: its message names it."""


def niah_logs(root: Path) -> list[Path]:
    return sorted(
        log for log in root.rglob("*.jsonl")
        if log.parent.parent.name == "ruler" and SPECS.get(log.parent.name, None) is not None
        and SPECS[log.parent.name].kind == "niah" and (log.parent.parent.parent / "ruler-summary.json").is_file()
    )  # fmt: skip


def plan(log: Path) -> tuple[tuple, list[dict]]:
    """(What decides the log's samples, its records)."""
    summary = json.loads((log.parent.parent.parent / "ruler-summary.json").read_text(encoding="utf-8"))
    provenance = summary["provenance"]
    settings = provenance["settings"]
    if settings.get("prompt_format", "base") != "base":
        raise Refused(f"{log}: prompt format {settings['prompt_format']!r}: not handled here")
    length = int(log.name.split(".")[0])
    key = (provenance["engine"]["tokenizer_fingerprint"], log.parent.name, length, settings["seed"],
           settings.get("sizing", "exact"), settings.get("essays"), settings.get("qa_dir"))  # fmt: skip
    lines = log.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        record = json.loads(line)
        if json.dumps(record, ensure_ascii=False) != line or record[CHECKSUM] != record_checksum(record):
            raise Refused(f"{log}:{number}: not a line as evalkit writes it, or not matching its checksum")
        records.append(record)
    return key, records


def with_depths(record: dict, depths: list[float]) -> dict:
    """The record with `depths` after `prompt_sha`, where the runner puts it, and its checksum renewed."""
    out: dict = {}
    for name, value in record.items():
        if name not in ("depths", CHECKSUM):
            out[name] = value
        if name == "prompt_sha":
            out["depths"] = depths
    out[CHECKSUM] = record_checksum(out)
    return out


def main(tokenizer_dirs: list[str], root: Path) -> int:
    tokenizers = {}
    for directory in tokenizer_dirs:
        tokenizer = load_tokenizer(Path(directory))
        tokenizers[tokenizer_fingerprint(tokenizer)] = tokenizer
    planned = {log: plan(log) for log in niah_logs(root)}
    wanted: dict[tuple, int] = defaultdict(int)
    for key, records in planned.values():
        wanted[key] = max(wanted[key], 1 + max(record["index"] for record in records))
    samples = {}
    for key, count in sorted(wanted.items()):
        fingerprint, task, length, seed, sizing, essays, qa_dir = key
        if fingerprint not in tokenizers:
            raise Refused(f"no tokenizer given with fingerprint {fingerprint} ({task} at {length})")
        samples[key] = generate(task, tokenizers[fingerprint], length, count, seed, essays=essays, qa_dir=qa_dir,
                                prompt_format=BASE, sizing=sizing)  # fmt: skip
        print(f"regenerated {task} at {length} (seed {seed}, {sizing}, tokenizer {fingerprint}): {count} samples")
    rewritten: dict[Path, str] = {}
    done = already = 0
    for log, (key, records) in planned.items():
        lines = []
        for number, record in enumerate(records, start=1):
            sample = samples[key][record["index"]]
            prompt = BASE.render(sample.input, sample.answer_prefix)
            if _prompt_hash(prompt) != record["prompt_sha"] or sample.outputs != record["references"]:
                raise Refused(f"{log}:{number}: the regenerated sample's prompt or references are not the record's")
            new = with_depths(record, sample.depths)
            if "depths" in record:
                if new != record:
                    raise Refused(f"{log}:{number}: its depths are not the regenerated sample's")
                already += 1
            lines.append(json.dumps(new, ensure_ascii=False) + "\n")
            done += 1
        rewritten[log] = "".join(lines)
    for log, text in rewritten.items():  # only once every record of every log has been checked
        atomic_write_text(log, text)
    print(f"{len(rewritten)} niah sample logs, {done} records ({already} had their depths already)")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizers", nargs="+", help="checkpoint or model directories whose tokenizers the logs name")
    parser.add_argument("--root", type=Path, default=Path("results"))
    arguments = parser.parse_args()
    try:
        sys.exit(main(arguments.tokenizers, arguments.root))
    except Refused as why:
        print(f"error: {why}", file=sys.stderr)
        sys.exit(1)
