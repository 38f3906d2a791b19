"""The format of every result file evalkit writes, and the one typed row every benchmark produces.

A benchmark constructs a `ResultRow` for each number it computes; the pipeline stores it in the
checkpoint's summary with `row_record` (the shapes below), and every reader (the leaderboard, its
plots, compare, scripts) reads it back through `summary_rows`, one typed row per number. No
dimension is packed into a string: a RULER length and encoding, an lm-eval filter and the shots
are fields.

Stored rows, the number always as `value` (a summary of another schema_version is not read):
- RULER: run, step, task, metric, length, value, stderr, n; an anchor-encoded cell adds
  encoding, doc_tokens and documents.
- every other benchmark: run, step, requested, task, metric, filter, value, stderr, n,
  num_fewshot (and length, encoding and doc_tokens where it has them: ppl).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.files import read_json_object
from evalkit.lengths import length_label

# The format of every file the pipeline writes (summaries, failure records, averages). Raised when
# a reader of the old format would misread the new one; readers skip, with a note, any other one.
# Version 3: RULER rows store their number as `value`, as every benchmark's rows do (2: as `score`).
SCHEMA_VERSION = 3

STANDARD = "standard"  # the encoding of a RULER cell evaluated as one causal prompt
# What a LongPPL row without a value (ppl --key-tokens) means, said under every table that shows one.
NO_KEY_TOKENS = (
    "0 key tokens: no token's log-probability gained enough from the long context "
    "(LongPPL's key tokens lie past its short context of 4096 tokens: none at L <= 4096)"
)


@dataclass(frozen=True)
class ResultRow:
    benchmark: str
    run: str
    step: int
    task: str
    metric: str
    value: float | None  # None: the benchmark produced no number (lm-eval's NaN)
    stderr: float | None = None
    n: int | None = None  # samples or documents behind the value
    length: int | None = None  # RULER: the context length in tokens
    encoding: str | None = None  # RULER: "standard", or "anchor" (documents encoded apart; ruler.encoding)
    requested: str | None = None  # lm-eval: the name asked for (mmlu, for the row of mmlu_anatomy)
    filter: str | None = None  # lm-eval: the answer filter ("none")
    num_fewshot: int | None = None
    paradigm: str = "?"  # from the checkpoint's meta.json, as the summary recorded it
    model: str = "?"
    data: str = "?"
    doc_tokens: int | None = None  # RULER, anchor encoding: about this many tokens per document
    documents: float | None = None  # RULER, anchor encoding: documents per sample, on average

    def encoding_label(self) -> str | None:
        """ "standard", "anchor-512" (documents of about 512 tokens), or None for a row without encodings."""
        return None if self.encoding is None else encoding_label(self.encoding, self.doc_tokens)

    def series(self) -> str:
        return series_name(self.run, self.encoding, self.doc_tokens)


# The columns of `evalkit leaderboard --format csv|json`, in this order.
EXPORT_FIELDS = (
    "benchmark", "run", "step", "task", "metric", "value", "stderr", "n", "length", "encoding",
    "requested", "filter", "num_fewshot", "paradigm", "model", "data",
)  # fmt: skip


def encoding_label(encoding: str | None, doc_tokens: int | None) -> str:
    """ "standard", or "anchor-512" (documents of about 512 tokens): what a row was encoded as."""
    if encoding in (None, STANDARD):
        return STANDARD
    return f"{encoding}-{doc_tokens}"


def row_encoding(record: dict[str, Any]) -> str:
    """A stored row's, skip's or detail's encoding label (one without an encoding is standard)."""
    return encoding_label(record.get("encoding"), record.get("doc_tokens"))


def series_name(run: str, encoding: str | None, doc_tokens: int | None) -> str:
    """The name a RULER row (or skip) is tabled and averaged under: its run, or its run and its
    encoding, so the two encodings of one checkpoint stand side by side and never average together."""
    if encoding in (None, STANDARD):
        return run
    return f"{run} [{encoding}, {doc_tokens}-token docs]"


def export_record(row: ResultRow) -> dict[str, Any]:
    """A row as `--format csv|json` writes it: EXPORT_FIELDS, the encoding as its label."""
    return {name: row.encoding_label() if name == "encoding" else getattr(row, name) for name in EXPORT_FIELDS}


def row_record(row: ResultRow) -> dict[str, Any]:
    """The row as a summary stores it (the module docstring's shapes, of this version)."""
    if row.benchmark == "ruler":
        record = {"run": row.run, "step": row.step, "task": row.task, "metric": row.metric, "length": row.length}
        record.update(value=row.value, stderr=row.stderr, n=row.n)
        if row.encoding not in (None, STANDARD):
            record.update(encoding=row.encoding, doc_tokens=row.doc_tokens, documents=row.documents)
        return record
    record = {"run": row.run, "step": row.step, "requested": row.requested, "task": row.task, "metric": row.metric}
    record.update(filter=row.filter, value=row.value, stderr=row.stderr, n=row.n, num_fewshot=row.num_fewshot)
    record.update(
        {name: getattr(row, name) for name in ("length", "encoding", "doc_tokens") if getattr(row, name) is not None}
    )
    return record


def summary_rows(summary: dict[str, Any]) -> list[ResultRow]:
    """Every number of a stored summary as a ResultRow (a summary of this version: readers leave
    out any other, not_understood)."""
    paradigm, model, data = describe_checkpoint(summary)
    described = {"paradigm": paradigm, "model": model, "data": data}
    return [read_row(summary["benchmark"], record, described) for record in summary.get("rows", [])]


def read_row(benchmark: str, record: dict[str, Any], described: dict[str, str] | None = None) -> ResultRow:
    """One stored row as a ResultRow (`described`: the checkpoint's paradigm, model and data)."""
    return ResultRow(
        benchmark=benchmark,
        run=record["run"],
        step=int(record["step"]),
        task=record["task"],
        metric=record["metric"],
        value=_float(record.get("value")),
        stderr=_float(record.get("stderr")),
        n=record.get("n"),
        length=record.get("length"),
        # RULER rows store an encoding only for anchor cells; ppl's say "standard" or "anchor", others none
        encoding=record.get("encoding") or (STANDARD if benchmark == "ruler" else None),
        doc_tokens=record.get("doc_tokens"),
        documents=record.get("documents"),
        requested=record.get("requested"),
        filter=record.get("filter"),
        num_fewshot=record.get("num_fewshot"),
        **(described or {}),
    )


SUMMARY_SUFFIX = "-summary.json"  # any benchmark's summary file ends so


def summary_name(benchmark: str) -> str:
    return f"{benchmark}-summary.json"


def failed_name(benchmark: str) -> str:
    return f"{benchmark}-failed.json"


def not_understood(path: Path, record: Any, suffix: str = SUMMARY_SUFFIX) -> str | None:
    """Why this evalkit cannot read the stored record at `path` (<benchmark><suffix>) as its own
    format, or None: a schema_version other than SCHEMA_VERSION (none: written before versions
    were recorded), or a benchmark other than its file name's."""
    if not isinstance(record, dict):
        return f"it holds a JSON {type(record).__name__}, not an evalkit record"
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        return (
            f"its schema_version is {version!r} and this evalkit reads version {SCHEMA_VERSION} only "
            "(written by another evalkit version: read it with that one)"
        )
    expected = path.name[: -len(suffix)] if path.name.endswith(suffix) else None
    if "benchmark" in record and expected is not None and record["benchmark"] != expected:
        return f"its benchmark is {record['benchmark']!r}, but its file name says {expected!r}"
    return None


def read_summary(path: Path) -> dict[str, Any] | None:
    """The summary stored at `path`, or None when there is none (or it is not one)."""
    earlier = read_json_object(path)
    if not_understood(path, earlier) is not None:  # another format: neither its stamp nor its engine is reused
        return None
    return earlier if isinstance(earlier.get("rows"), list) else None


def describe_checkpoint(summary: dict[str, Any]) -> tuple[str, str, str]:
    """(paradigm, model, data) from the checkpoint's meta.json as recorded in the summary."""
    meta = (summary.get("provenance") or {}).get("checkpoint_meta") or {}
    if isinstance(meta.get("source"), dict):  # an `evalkit import`: a pretrained model, not trained here
        return "pretrained", str(meta.get("model", "?")), f"{meta['source'].get('file_type') or 'GGUF'} import"
    if isinstance(meta.get("hub"), dict) and not meta.get("config"):  # a hub model (or its export) as published
        return "pretrained", hub_label(meta["hub"]), "hub"
    config = meta.get("config") or {}
    model = config.get("model") or {}
    if isinstance(meta.get("base_model"), dict):  # trained from a hub model: the commit it started from
        model_text = hub_label(meta["base_model"])
    elif model.get("path"):
        model_text = Path(model["path"]).name
    elif model:
        model_text = f"{model.get('arch', '?')} {model.get('num_layers', '?')}x{model.get('hidden_size', '?')}"
    else:
        model_text = "?"
    precision = training_precision(meta)
    if precision:  # a bf16 run: which serving (models.precision.SERVINGS) its scores are of
        serving = ((summary.get("provenance") or {}).get("engine") or {}).get("serving")
        model_text = f"{model_text} ({precision}; served {'as trained' if serving == 'trained' else serving})"
    data = (config.get("data") or {}).get("source", "?")
    return meta.get("paradigm", "?"), model_text, data


def hub_label(record: dict[str, Any]) -> str:
    """A hub model as the leaderboard names it: the repo's name part at its short commit
    (SmolLM2-135M@abc1234), the commit being what a branch name cannot pin."""
    return f"{str(record.get('repo', '?')).rsplit('/', 1)[-1]}@{str(record.get('commit', '?'))[:7]}"


def training_precision(meta: dict[str, Any]) -> str:
    """ "bf16, RoPE fp32" for a run trained under bf16 autocast, "bf16 full, RoPE bf16" for one in
    the released regime (bf16 weights, buffers and residual: evalkit.train.regime), "" for an fp32
    run (the model text as before). A bf16 run from before the rope_precision setting rotated in
    fp32: transformers' fp32 cos/sin promoted q and k (docs/training.md)."""
    dtype = (meta.get("config") or {}).get("dtype")
    if dtype not in ("bf16", "bf16_full"):
        return ""
    rope = (meta.get("precision") or {}).get("rope") or (meta.get("config") or {}).get("rope_precision") or "fp32"
    return f"{'bf16 full' if dtype == 'bf16_full' else 'bf16'}, RoPE {rope}"


def window_start(meta: dict[str, Any]) -> str:
    """How the run's training windows began (data.window_start): `bos` (the BOS, or the anchor, at
    position 0 in every paradigm) or `document` (the rest of a cut document); runs recorded before
    the setting existed packed as `document`."""
    data = (meta.get("config") or {}).get("data") or {}
    return str(data.get("window_start") or "document")


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


# LongBench-E (THUDM/LongBench eval.py, scorer_e): a task's score in three buckets of each document's
# `length` field, a count of words, not tokens: 0-4k (< 4000), 4-8k (< 8000), 8k+. A bucket is stored
# as its lower bound in words. Tasks so reported: lm-eval's longbench_<task>_e, evalkit's fixture.
LONGBENCH_E_BUCKETS = {0: "0-4k words", 4000: "4-8k words", 8000: "8k+ words"}
LONGBENCH_E = re.compile(r"\w*longbench\w*_e")


def is_babilong(task: str) -> bool:
    """lm-eval's BABILong tasks and groups (babilong_qa1, babilong_longctx) and evalkit's fixture of them."""
    return "babilong" in task


def length_text(task: str, length: int | None) -> str:
    """A general row's length as tables show it: a LongBench-E bucket in words, else tokens (4K)."""
    if length is None:
        return "–"
    return LONGBENCH_E_BUCKETS[length] if LONGBENCH_E.fullmatch(task) else length_label(length)
