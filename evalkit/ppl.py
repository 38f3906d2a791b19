"""Perplexity across context lengths and checkpoints (`evalkit ppl`, cli/ppl.py), a benchmark of the one pipeline.

What is measured and stored: docs/perplexity.md. A unit is one length, each document logged as
it finishes, so a killed run resumes.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evalkit.errors import Skipped, UserError
from evalkit.figures import new_figure, write_figure
from evalkit.files import jsonl_texts, read_text
from evalkit.lengths import length_label
from evalkit.markdown import markdown_table
from evalkit.models.refs import CheckpointRef, weights_fingerprint
from evalkit.store.identity import COUNT, EXECUTION, LOCATION, SELECTION, identity_key, setting
from evalkit.store.result_format import NO_KEY_TOKENS, STANDARD, ResultRow, encoding_label, row_encoding
from evalkit.store.sample_log import SampleLog
from evalkit.store.units import Unit, UnitStore
from evalkit.sweep.engine_choice import EngineChoice, LazyEngine
from evalkit.sweep.pipeline import (
    Averages,
    Benchmark,
    UnitProgress,
    UnitResult,
    check_encoding,
    check_lengths,
    earlier_cells,
    encoding_skips,
)

TASK = "ppl"
FIRST_BUCKET = 128  # positions [1, 128), then doubling: [128, 256), [256, 512), ...
KEY_ALPHA, KEY_BETA = 2.0, -2.0  # LongPPL's thresholds on LSD and LCL (the reference's defaults)
KEY_CONTEXT, KEY_STRIDE = 4096, 1024  # the reference's short context (trunc_len) and stride (sliding_window)
PREFIX_SLACK = 16  # tokens dropped before a prefix's cut: the cut may change how the last ones tokenize
PREFIX_CHARS = 4  # characters per token wanted in a document's first prefix (most text has fewer per token)
BUILTIN_DOC_CHARS = 48_000  # the built-in prose joined and cut into documents of about 12K tokens


@dataclass
class PplSettings:
    """What the user asked for (evalkit.store.identity: which lengths, how many documents and where
    the data lies do not decide a document's score; its text is keyed in its record instead)."""

    lengths: list[int] = setting(default_factory=lambda: [4096], role=SELECTION)
    data: str = setting("builtin", role=LOCATION)
    docs: int = setting(50, role=COUNT)
    key_tokens: bool = False
    engine: str = "hf"
    dtype: str | None = None
    batch_size: int = setting(8, role=EXECUTION)
    max_length: int | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    # A cell of its own, as in ruler (SELECTION): each row names its encoding, a log record's key too.
    encoding: str = setting(STANDARD, role=SELECTION)
    doc_tokens: int = setting(512, role=SELECTION)

    def __post_init__(self) -> None:
        check_encoding(self.encoding, self.doc_tokens)
        if self.docs < 1 or self.batch_size < 1:
            raise UserError(f"--docs and --batch-size must be at least 1, got {self.docs} and {self.batch_size}")


def load_documents(data: str) -> list[str]:
    """--data's documents (docs/perplexity.md); of a DatasetDict, its test split or its only one."""
    if data == "builtin":
        return builtin_documents()
    path = Path(data)
    if not path.exists():
        raise UserError(f"--data {data}: no such file or directory (give a .jsonl, a .txt, a datasets dir or builtin)")
    if path.is_dir():
        return _dataset_documents(path)
    return jsonl_texts(path, "--data") if path.suffix == ".jsonl" else [read_text(path, "--data")]


def builtin_documents() -> list[str]:
    """The built-in prose (evalkit.corpus.prose) joined into documents (docs/perplexity.md)."""
    from evalkit.corpus.prose import prose_documents

    documents, current = [], ""
    for piece in prose_documents():
        current = f"{current}\n\n{piece}" if current else piece
        if len(current) >= BUILTIN_DOC_CHARS:
            documents.append(current)
            current = ""
    return documents


def _dataset_documents(path: Path) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise UserError(f"--data {path} is a directory: reading a saved dataset needs `pip install datasets`") from None

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises several kinds for a folder it did not write
        raise UserError(f"--data {path} is not a dataset saved by `datasets` ({type(err).__name__})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "test" not in loaded and len(loaded) != 1:
            raise UserError(f"--data {path} has splits {', '.join(loaded)}: save the one to use alone, or a test split")
        loaded = loaded["test"] if "test" in loaded else next(iter(loaded.values()))
    if "text" not in loaded.column_names:
        raise UserError(f"--data {path} has no `text` column (columns: {', '.join(loaded.column_names)})")
    texts = loaded["text"]
    for row, text in enumerate(texts):
        if not isinstance(text, str):  # a null is no document "None"
            raise UserError(f"--data {path} row {row}: its `text` is {text!r}, not a string")
    return list(texts)


def document_tokens(tokenizer, text: str, limit: int) -> list[int]:
    """The document's first `limit` token ids (all, when it has fewer), BOS first when the tokenizer
    has one: those of the whole text, from a prefix of it only (memory follows `limit`, not the
    document). A prefix's last PREFIX_SLACK tokens are dropped (the cut may split what the whole
    text tokenizes as one); a prefix that leaves too few is doubled."""
    ids: list[int] = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    need, chars = limit - len(ids), PREFIX_CHARS * (limit + PREFIX_SLACK)
    while True:
        prefix = tokenizer(text[:chars], add_special_tokens=False)["input_ids"]
        whole = chars >= len(text)
        stable = prefix if whole else prefix[: max(0, len(prefix) - PREFIX_SLACK)]
        if whole or len(stable) >= need:
            return ids + stable[:need]
        chars *= 2


def bucket_of(position: int) -> int:
    """The doubling bucket of a predicted position (>= 1): 0 for [1, 128), b for [128*2^(b-1), 128*2^b)."""
    return 0 if position < FIRST_BUCKET else (position // FIRST_BUCKET).bit_length()


def bucket_label(bucket: int) -> str:
    low = 1 if bucket == 0 else FIRST_BUCKET << (bucket - 1)
    return f"{low}-{(FIRST_BUCKET << bucket) - 1}"


def anchor_layout(tokenizer, ids: list[int], doc_tokens: int) -> tuple[list[int], list[int], list[int]]:
    """(fed ids, doc ids, the fed index of each scored token) of one document's first L tokens under
    --encoding anchor (docs/perplexity.md): packed_layout's document part, its question dropped."""
    from evalkit.engines.tokens import packed_layout

    content = ids[1:] if tokenizer.bos_token_id is not None else ids  # the BOS is the anchor packed_layout puts
    pieces = [content[start : start + doc_tokens] for start in range(0, len(content), doc_tokens)]
    layout = packed_layout(tokenizer, pieces, [tokenizer.eos_token_id])  # a question is required there
    size, docs = layout.num_document_tokens, layout.doc_ids
    # a piece's own tokens: all of its document id but the last (the EOS closing it), never the anchor's
    own = [i for i in range(1, size - 1) if docs[i + 1] == docs[i]]
    return layout.input_ids[:size], docs, own[len(own) - (len(ids) - 1) :]  # document positions 1..L-1


def anchor_logprobs(engine, rows: list[list[int]], doc_tokens: int) -> list[list[float]]:
    """The rows' log-probabilities at document positions 1..L-1 under --encoding anchor (a PackedEngine's)."""
    layouts = [anchor_layout(engine.tokenizer, row, doc_tokens) for row in rows]
    _fits(engine, len(layouts[0][0]), f"anchor encoding adds one EOS per {doc_tokens}-token piece: ")
    fed = engine.token_logprobs([fed for fed, _, _ in layouts], [docs for _, docs, _ in layouts])
    return [[logprobs[i - 1] for i in own] for logprobs, (_, _, own) in zip(fed, layouts)]


def _fits(engine, tokens: int, why: str = "") -> None:
    if tokens > engine.max_length:
        raise Skipped(f"{why}{tokens} tokens exceed the engine's window of {engine.max_length}")


def short_logprobs(score, rows: list[list[int]], context: int, stride: int) -> list[list[float]]:
    """log P(token p) for p = context..L-1 from the reference's short context: for start = 0,
    stride, 2 * stride, ... below L - context, one sequence of tokens start..start+context+stride-1
    (scored by `score`) gives the tokens from start + context on; none at L <= context."""
    result: list[list[float]] = [[] for _ in rows]
    for start in range(0, len(rows[0]) - context, stride):
        for out, values in zip(result, score([row[start : start + context + stride] for row in rows])):
            out.extend(values[context - 1 :])  # values[j - 1] is the piece's position j
    return result


def key_token_mask(long: list[float], short: list[float]) -> list[bool]:
    """The reference's key tokens among positions 1..L-1 (`long`): of the last len(short), which
    have a short-context score, those with LCL = long > beta and LSD = long - short > alpha."""
    skip = len(long) - len(short)
    return [False] * skip + [lcl > KEY_BETA and lcl - sl > KEY_ALPHA for lcl, sl in zip(long[skip:], short)]


def longppl(records: list[dict[str, Any]]) -> float | None:
    """Each document's exp(mean key-token NLL), weighted by its key tokens (the paper's perplexity.py);
    None without a key token."""
    keyed = [r for r in records if r["key_tokens"]]
    count = sum(r["key_tokens"] for r in keyed)
    return sum(r["key_tokens"] * math.exp(r["key_nll"] / r["key_tokens"]) for r in keyed) / count if count else None


def document_record(doc: int, sha: str, logprobs: list[float], key: list[bool] | None) -> dict[str, Any]:
    """One document's log record: its NLL per position bucket (sum, tokens) and, with key tokens,
    their NLL sum and count."""
    buckets: dict[int, list[float]] = {}
    for position, logprob in enumerate(logprobs, start=1):
        cell = buckets.setdefault(bucket_of(position), [0.0, 0])
        cell[0] -= logprob
        cell[1] += 1
    record: dict[str, Any] = {"doc": doc, "text_sha": sha, "tokens": len(logprobs)}
    record["nll"] = sum(cell[0] for cell in buckets.values())
    record["buckets"] = [buckets[b] for b in sorted(buckets)]
    if key is not None:
        chosen = [-lp for lp, is_key in zip(logprobs, key) if is_key]
        record["key_nll"], record["key_tokens"] = sum(chosen), len(chosen)
    return record


def perplexity(records: list[dict[str, Any]]) -> float:
    return math.exp(sum(r["nll"] for r in records) / sum(r["tokens"] for r in records))


def position_losses(records: list[dict[str, Any]]) -> dict[str, float]:
    """Bucket label -> the token-weighted mean loss of the documents' positions in it."""
    sums: dict[int, list[float]] = {}
    for record in records:
        for bucket, (nll, tokens) in enumerate(record["buckets"]):
            cell = sums.setdefault(bucket, [0.0, 0])
            cell[0] += nll
            cell[1] += tokens
    return {bucket_label(b): nll / tokens for b, (nll, tokens) in sorted(sums.items())}


class PplBenchmark(Benchmark):
    """Perplexity as a benchmark of the one pipeline: a unit is one length."""

    name = "ppl"
    title = "Perplexity (lower is better)"
    transient = ("_documents", "_tokens")  # each process reads the data and tokenizes it itself

    def __init__(self, settings: PplSettings) -> None:
        self.settings = settings
        self.engine = EngineChoice.of(settings)
        self._documents: list[str] = []
        self._tokens: dict[Path, tuple[str, list[list[int]]]] = {}

    def documents(self) -> list[str]:
        """The first --docs documents of --data, read once."""
        if not self._documents:
            self._documents = load_documents(self.settings.data)[: self.settings.docs]
            if not self._documents:
                raise UserError(f"--data {self.settings.data} holds no document")
        return self._documents

    def _tokenized(self, ref: CheckpointRef) -> tuple[str, list[list[int]]]:
        """(the checkpoint tokenizer's fingerprint, the documents' token ids by it), tokenized once."""
        if ref.path not in self._tokens:
            from evalkit.corpus.tokenizer import tokenizer_fingerprint
            from evalkit.models.check import load_tokenizer

            tokenizer, limit = load_tokenizer(ref.path), max(self.settings.lengths)
            ids = [document_tokens(tokenizer, text, limit) for text in self.documents()]
            self._tokens[ref.path] = (tokenizer_fingerprint(tokenizer), ids)
        return self._tokens[ref.path]

    def check(self, refs: list[CheckpointRef]) -> None:
        self.documents()  # a bad --data is one line before any model loads
        check_lengths(refs, self.settings)

    def units(self) -> list[Unit]:
        return [Unit(TASK, length) for length in self.settings.lengths]

    def unit_cost(self, unit: Unit) -> float:
        return float(unit.length or 0) * self.settings.docs * (2 if self.settings.key_tokens else 1)

    def _key(self, ref: CheckpointRef) -> str:
        """What a logged document's score depends on besides its text (its record's text_sha): the
        settings' identity, the weights and the tokenizer; not --docs, so a count reuses the others'."""
        fingerprint = self._tokenized(ref)[0]
        label = encoding_label(self.settings.encoding, self.settings.doc_tokens)
        more = {} if label == STANDARD else {"encoding": label}  # standard keys as before the option
        more.update(self.engine.served(ref.path).key_facts())  # a serving unlike a stock one
        if self.settings.key_tokens:  # records of an earlier key-token rule are never reused
            more["key_rule"] = f"longppl {KEY_CONTEXT}/{KEY_STRIDE} {KEY_ALPHA}/{KEY_BETA}"
        return identity_key(
            self.settings, with_count=False, weights=weights_fingerprint(ref.path), tokenizer=fingerprint, **more
        )

    def evaluate(self, engine: LazyEngine, unit: Unit, store: UnitStore, progress: UnitProgress) -> UnitResult:
        with encoding_skips(self.settings):
            return self._evaluate(engine, int(unit.length or 0), store, progress)

    def _evaluate(self, engine: LazyEngine, length: int, store: UnitStore, progress: UnitProgress) -> UnitResult:
        tokens = self._tokenized(store.ref)[1]
        chosen = [i for i, ids in enumerate(tokens) if len(ids) >= length]
        if not chosen:
            raise Skipped(
                f"no document of the {len(tokens)} reaches {length} tokens (longest: {max(map(len, tokens))})",
                documents=len(tokens),
            )
        documents = [(i, hashlib.sha256(self.documents()[i].encode()).hexdigest()[:16]) for i in chosen]
        # one file per length, every encoding and setting under its own key (SampleLog's shared log)
        log = SampleLog(store.file(".jsonl"), self._key(store.ref), store.writer, identify=_document, shared=True)
        todo = [document for document in documents if document not in log.records]
        progress(len(chosen) - len(todo), len(chosen))
        for start in range(0, len(todo), self.settings.batch_size):
            batch = todo[start : start + self.settings.batch_size]
            log.append(self._score(engine.get(), [tokens[i][:length] for i, _ in batch], batch))
            progress(len(chosen) - len(todo) + start + len(batch), len(chosen))
        records = [log.records[document] for document in documents]
        rows = self._rows(store.ref, length, records)
        encoding = {"encoding": rows[0].encoding, "doc_tokens": rows[0].doc_tokens}
        return UnitResult(rows, _detail(length, records, len(tokens)) | encoding, bool(todo))

    def _score(self, engine, rows: list[list[int]], docs: list[tuple[int, str]]) -> list[dict[str, Any]]:
        _fits(engine, len(rows[0]))
        anchor, key_tokens = self.settings.encoding != STANDARD, self.settings.key_tokens
        # the evaluator of key tokens reads the document in standard whatever the encoding (docs/perplexity.md)
        standard = engine.token_logprobs(rows) if key_tokens or not anchor else []
        long = anchor_logprobs(engine, rows, self.settings.doc_tokens) if anchor else standard
        if not key_tokens:
            return [document_record(doc, sha, lp, None) for (doc, sha), lp in zip(docs, long)]
        short = short_logprobs(engine.token_logprobs, rows, KEY_CONTEXT, KEY_STRIDE)
        return [
            document_record(doc, sha, lp, key_token_mask(ev, sl))
            for (doc, sha), lp, ev, sl in zip(docs, long, standard, short)
        ]

    def _rows(self, ref: CheckpointRef, length: int, records: list[dict[str, Any]]) -> list[ResultRow]:
        values: dict[str, float | None] = {"perplexity": perplexity(records)}
        if self.settings.key_tokens:
            values["longppl"] = longppl(records)
        doc_tokens = None if self.settings.encoding == STANDARD else self.settings.doc_tokens
        cell: dict[str, Any] = {"n": len(records), "length": length, "encoding": self.settings.encoding}
        return [
            ResultRow(self.name, ref.run, ref.step, TASK, m, v, doc_tokens=doc_tokens, **cell)
            for m, v in values.items()
        ]

    def finish_summary(self, summary: dict[str, Any], results: list[UnitResult], earlier: dict | None) -> dict:
        """Per length and encoding: documents used of those read, and the loss per position bucket;
        the earlier summary's cells this run did not touch, when it was scored alike (the pipeline's
        earlier_cells): standard, then anchor, into one --out is one summary."""
        # what was scored: --data's name (builtin, a file's or folder's) and a hash of the documents read,
        # so that the leaderboard never tables perplexities of two data sets as one
        data = self.settings.data
        name = data if data == "builtin" else Path(data).name
        digest = hashlib.sha256(json.dumps(self.documents()).encode()).hexdigest()[:16]
        # in the provenance, so that merge refuses shards that scored other documents
        summary = {**summary, "provenance": summary["provenance"] | {"eval_data": {"name": name, "sha256": digest}}}
        summary["lengths"] = {_cell_name(r.detail): r.detail for r in results if r.detail}
        if not earlier or earlier["provenance"].get("eval_data") != summary["provenance"]["eval_data"]:
            return summary  # other documents: not one table
        rows, skipped = earlier_cells(PplSettings, summary, earlier, _cell_name)
        kept = {_cell_name(entry) for entry in rows + skipped}
        lengths = {name: detail for name, detail in (earlier.get("lengths") or {}).items() if name in kept}
        return summary | {
            "rows": rows + summary["rows"],
            "skipped": skipped + summary["skipped"],
            "lengths": lengths | summary["lengths"],
        }

    def average(self, rows: list[ResultRow]) -> Averages:
        cells: dict[tuple[str, str, int], list[float]] = {}
        for row in rows:  # the encodings of a run as two series (ResultRow.series), never averaged together
            if row.value is not None and row.length is not None:
                cells.setdefault((row.series(), row.metric, row.length), []).append(row.value)
        records: list[dict[str, Any]] = []
        lines: list[list[Any]] = []
        for (run, metric, length), values in sorted(cells.items()):
            mean, std, count = statistics.fmean(values), statistics.pstdev(values), len(values)
            records.append(
                {"run": run, "metric": metric, "length": length, "mean": mean, "std": std, "checkpoints": count}
            )
            lines.append([run, metric, length_label(length), f"{mean:.3f} ± {std:.3f}", count])
        table = markdown_table(["run", "metric", "length", "mean ± std", "checkpoints"], lines)
        return Averages(records, table, "Mean ± population std over each run's checkpoints (lower is better).")


def _detail(length: int, records: list[dict[str, Any]], read: int) -> dict[str, Any]:
    detail: dict[str, Any] = {"length": length, "documents_used": len(records), "documents_read": read}
    detail["position_loss"] = position_losses(records)
    if records and "key_tokens" in records[0]:
        detail["key_tokens"] = sum(r["key_tokens"] for r in records)
        detail["key_context"], detail["key_stride"] = KEY_CONTEXT, KEY_STRIDE
    return detail


def _cell_name(entry: dict[str, Any]) -> str:
    """A row's, skip's or detail's cell, its key in the summary's "lengths": "4096", or "4096@anchor-512"."""
    label = row_encoding(entry)
    return str(entry["length"]) if label == STANDARD else f"{entry['length']}@{label}"


def _document(record: dict[str, Any]) -> tuple[int, str] | None:
    """A log record's document: its index in --data and its text's hash (None: not a document's record)."""
    doc, sha = record.get("doc"), record.get("text_sha")
    return (doc, sha) if isinstance(doc, int) and isinstance(sha, str) else None


def checkpoint_table(rows: list[ResultRow]) -> str:
    """One line per checkpoint and metric: its value at each length; LongPPL over no key token says so, and why."""
    lengths = sorted({row.length for row in rows if row.length is not None})
    rows = [replace(row, run=row.series()) for row in rows]  # an encoding other than standard: a series of its own
    cells = {(row.run, row.step, row.metric, row.length): row for row in rows}
    lines = []
    for run, step, metric in sorted({(row.run, row.step, row.metric) for row in rows}):
        found = [cells.get((run, step, metric, n)) for n in lengths]
        lines.append([run, step, metric, *(_value_cell(r) for r in found)])
    table = markdown_table(["run", "step", "metric", *(f"{length_label(n)} (docs)" for n in lengths)], lines)
    return f"{table}\n\n{NO_KEY_TOKENS}." if any(row.value is None for row in rows) else table


def _value_cell(row: ResultRow | None) -> str:
    if row is None:
        return "–"
    return f"{row.value:.3f} ({row.n})" if row.value is not None else f"0 key tokens ({row.n})"  # LongPPL's only None


def draw(summaries: list[dict[str, Any]], out: Path) -> Path:
    """Loss against position into --out (by the command, or evalkit merge for a sharded sweep): one
    line per checkpoint at its longest length, at each bucket's middle."""
    figure, axes = new_figure()
    for summary in summaries:
        details = sorted((summary.get("lengths") or {}).values(), key=lambda d: d["length"])
        for encoding, longest in {row_encoding(d): d for d in details}.items():
            spans = [tuple(map(int, label.split("-"))) for label in longest["position_loss"]]
            middles = [math.sqrt(low * high) for low, high in spans]
            name = summary["run"] if encoding == STANDARD else f"{summary['run']} [{encoding}]"
            label = f"{name} step {summary['step']} ({length_label(longest['length'])})"
            axes.plot(middles, list(longest["position_loss"].values()), marker="o", label=label)
    axes.set_xscale("log", base=2)
    axes.set(xlabel="token position", ylabel="mean loss (nats)", title="Loss against position")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    return write_figure(figure, out / "ppl-positions")[0]
