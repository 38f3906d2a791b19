"""Per-sample scores of stored evaluations, read back for `evalkit compare` (never re-running).

    <out>/<run>/step-<N>/ruler/<task>/<length>[.<encoding>].jsonl   RULER: index, references, prompt_sha, score
    <out>/<run>/step-<N>/general/<task>[/<length>].samples.jsonl   lm-eval: doc_id, doc/target/prompt hashes, metrics
    <out>/<run>/step-<N>/ppl/ppl/<length>.jsonl                    perplexity: doc, text_sha, tokens, nll

Keyed by series (`ResultRow.series`) and cell. Each sample carries its identity and prompt hash,
by which compare checks that two checkpoints answered the same sample (docs/comparing.md). A log
whose mean is not its summary's score is from another evaluation: refused, not compared.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import UserError
from evalkit.results.summaries import GENERAL_SUMMARY, RULER_SUMMARY, summary_files
from evalkit.store.result_format import STANDARD, SUMMARY_SUFFIX, describe_checkpoint, summary_name, summary_rows
from evalkit.store.sample_log import CHECKSUM, KEY, record_checksum

PPL_SUMMARY = summary_name("ppl")


@dataclass(frozen=True)
class Cell:
    """One number of a series: RULER's task at a length, or an lm-eval task's metric under a filter
    (at a length: BABILong's, a LongBench-E bucket)."""

    benchmark: str
    task: str
    length: int | None
    metric: str
    filter: str | None = None

    def __lt__(self, other: Cell) -> bool:
        """In field order, a task's cell without a length before those with one."""
        key = lambda c: (c.benchmark, c.task, c.length is not None, c.length or 0, c.metric, c.filter or "")  # noqa: E731
        return key(self) < key(other)

    def label(self) -> str:
        if self.length is not None and self.benchmark != "general":  # RULER's or ppl's one metric
            return self.task
        return f"{self.task} {self.metric}" + (f" ({self.filter})" if self.filter not in (None, "none") else "")


@dataclass(frozen=True)
class LoggedSample:
    score: float
    identity: str  # what makes it the same sample: its references (RULER), its document and target (lm-eval)
    prompt: str | None  # the prompt's hash, where recorded


def mean_score(samples: dict) -> float:
    """A cell's score at one checkpoint: the plain mean over its samples."""
    return math.fsum(s.score for s in samples.values()) / len(samples)


@dataclass
class Series:
    """One compared thing: its checkpoints' per-sample scores, cell by cell."""

    name: str
    # step -> cell -> (place, index) -> sample; place: which of pooled directories (0 unless pooled)
    checkpoints: dict[int, dict[Cell, dict[tuple[int, int], LoggedSample]]] = field(default_factory=dict)
    paradigm: str = "?"
    # step -> what identifies that checkpoint's weights (checkpoint_identity); absent where not recorded
    identities: dict[int, str] = field(default_factory=dict)
    standard_encoding: bool = True  # False for a RULER run's series under another encoding (anchor)
    runs: list[Series] = field(default_factory=list)  # its training runs (seeds) when several; else empty
    # a run's training stream (training_stream): runs of two series with the same streams pair by seed
    stream: str | None = None

    def members(self) -> list[Series]:
        """Its training runs, each a one-run Series: itself when it is one run."""
        return self.runs or [self]

    def steps(self) -> list[int]:
        return sorted({step for run in self.members() for step in run.checkpoints})

    def cells(self) -> set[Cell]:
        return {cell for run in self.members() for cells in run.checkpoints.values() for cell in cells}


def load_series(arguments: list[str], notes: list[str] | None = None) -> dict[str, Series]:
    """Every series under the given `[LABEL=]PATH` arguments (PATH may be a glob), by name: LABEL, or
    `LABEL: series` where its path holds several. The same LABEL again adds a training run (a seed) or
    pools a run it has (docs/comparing.md): the k-th directory pooled gives sample (k, i)."""
    found: dict[str, Series] = {}
    pooled: dict[int, int] = {}  # id(run) -> directories pooled into it so far
    for argument in arguments:
        named, sep, pattern = argument.partition("=")
        label = named if sep and named and not Path(argument).exists() else None
        pattern = pattern if label else argument
        globbed = not Path(pattern).exists() and any(char in pattern for char in "*?[")
        paths = sorted(Path(match) for match in glob.glob(pattern)) if globbed else [Path(pattern)]
        if not paths:
            raise UserError(f"{pattern}: no directory matches")
        for path in paths:
            here = read_directory(path, notes)
            if not here:
                raise UserError(
                    f"no {RULER_SUMMARY}, {GENERAL_SUMMARY} or {PPL_SUMMARY} under {path}; "
                    "give the --out directory of evalkit ruler/general/ppl"
                )
            for name, one in here.items():
                named = (label if len(here) == 1 else f"{label}: {name}") if label else name
                earlier = found.setdefault(named, one)
                if earlier is not one:  # unlabelled: one run's RULER and lm-eval results, its cells
                    found[named] = _add_run(earlier, one, pooled) if label else merge(earlier, one)
    for named, one in found.items():
        one.name = named  # a series of several runs: their own names stay the runs' names
    return found


def _add_run(series: Series, run: Series, pooled: dict[int, int]) -> Series:
    """`run` pooled into the series' run of the same checkpoints, else added as another training run."""
    same = [mine for mine in series.members() if _run_key(mine) == _run_key(run)]
    if same:
        into, place = same[0], pooled.get(id(same[0]), 0) + 1
        pooled[id(into)] = place
        if set(into.steps()) != set(run.steps()):
            raise UserError(
                f"series {into.name}: the pooled directories hold other checkpoints ({into.steps()} vs {run.steps()})"
            )
        for step, cells in run.checkpoints.items():
            for cell, samples in cells.items():
                into.checkpoints[step].setdefault(cell, {}).update({(place, i): s for (_, i), s in samples.items()})
        return series
    first = series.members()[0]
    if (run.paradigm, run.standard_encoding) != (first.paradigm, first.standard_encoding):
        raise UserError(
            f"{run.name} differs from {first.name} in paradigm or encoding ({run.paradigm}, {first.paradigm}); "
            "the runs of one series are replicates (seeds) of one recipe: give them other labels"
        )
    if not series.runs:
        series = Series(series.name, paradigm=run.paradigm, standard_encoding=run.standard_encoding, runs=[series])
    series.runs.append(run)
    return series


def _run_key(run: Series) -> object:
    """What makes two directories' series the same run: its checkpoints' identities, else its name."""
    if run.identities and set(run.identities) == set(run.checkpoints):
        return tuple(sorted(run.identities.values()))
    return run.name


def merge(into: Series, more: Series) -> Series:
    """One run's cells found in two directories (its RULER and its lm-eval results): one series.
    The same cell twice is refused: two evaluations of one number are never silently picked from."""
    for step, cells in more.checkpoints.items():
        mine = into.checkpoints.setdefault(step, {})
        twice = sorted(set(mine) & set(cells))
        if twice:
            raise UserError(
                f"series {into.name!r} has {twice[0].label()} at step {step} in two of the given directories; "
                "name them apart with LABEL=PATH (for example exact=DIR nvidia=DIR)"
            )
        mine.update(cells)
    into.identities.update(more.identities)
    return into


def read_directory(path: Path, notes: list[str] | None = None) -> dict[str, Series]:
    """The series whose summaries lie under `path`, each sample keyed (0, index): the 0 tells pooled
    directories apart (load_series). What is left out is noted in `notes`."""
    if not path.is_dir():
        raise UserError(f"results directory {path} does not exist")
    found: dict[str, Series] = {}
    if notes is not None:  # only these benchmarks have per-sample scores to compare: the others noted, not dropped
        notes += [
            f"- {other}: not read: compare reads {RULER_SUMMARY}, {GENERAL_SUMMARY} and {PPL_SUMMARY}, "
            f"not {other.name[: -len(SUMMARY_SUFFIX)]!r} summaries"
            for other in sorted(path.rglob(f"*{SUMMARY_SUFFIX}"))
            if other.name not in (RULER_SUMMARY, GENERAL_SUMMARY, PPL_SUMMARY)
        ]
    for name, reader in ((RULER_SUMMARY, _ruler_cells), (GENERAL_SUMMARY, _general_cells), (PPL_SUMMARY, _ppl_cells)):
        for file, summary in summary_files([path], name, notes):
            paradigm = describe_checkpoint(summary)[0]
            for series_name, cell, samples in reader(summary, file.parent):
                standard = series_name == summary["run"]  # ResultRow.series: the run's own name when standard
                one = found.setdefault(
                    series_name,
                    Series(series_name, paradigm=paradigm, standard_encoding=standard, stream=training_stream(summary)),
                )
                keyed = {(0, index): sample for index, sample in samples.items()}
                one.checkpoints.setdefault(int(summary["step"]), {})[cell] = keyed
                identity = checkpoint_identity(summary)
                if identity is not None:
                    one.identities[int(summary["step"])] = identity
    return found


def checkpoint_identity(summary: dict) -> str | None:
    """What identifies the weights a summary scored, so that two series of one checkpoint pair by
    checkpoint in compare: provenance.weights, else (older summaries) its resolved path, step and
    meta.json record. None: no checkpoint."""
    provenance = summary.get("provenance") or {}
    if provenance.get("weights"):
        return f"weights:{provenance['weights']}"
    path = summary.get("checkpoint")
    if not path:
        return None
    meta = provenance.get("checkpoint_meta") or {}
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    return f"{path}@{summary.get('step')}#{digest}"


def training_stream(summary: dict) -> str | None:
    """A trained checkpoint's base (or scratch), seed and data fingerprint from its meta.json (None where
    not recorded): runs of one stream saw the same data (docs/comparing.md, "Seeds as replicates")."""
    meta = (summary.get("provenance") or {}).get("checkpoint_meta") or {}
    config, data = meta.get("config") or {}, meta.get("data_fingerprint")
    base = (config.get("model") or {}).get("path") or "scratch"
    return None if config.get("seed") is None or data is None else f"base {base} · seed {config['seed']} · data {data}"


def _ruler_cells(summary: dict, directory: Path):
    for row in summary_rows(summary):
        label, length = row.encoding_label(), row.length
        log = directory / "ruler" / row.task / (f"{length}.jsonl" if label == STANDARD else f"{length}.{label}.jsonl")
        # a log may hold more samples than the cell averages (its first n)
        records = [r for r in read_log(log) if row.n is None or int(r["index"]) < row.n]
        samples = {int(r["index"]): LoggedSample(float(r["score"]), json.dumps(r["references"]), r.get("prompt_sha"))
                   for r in records}  # fmt: skip
        assert row.value is not None  # RULER rows always carry a score
        mean, n = mean_score(samples) if samples else float("nan"), row.n
        # A RULER summary keeps its scores to 2 digits.
        if not samples or (n is not None and int(n) != len(samples)) or abs(round(mean, 2) - row.value) > 0.011:
            raise UserError(
                f"{log} does not hold the samples its summary scored ({len(samples)} samples, mean {mean:.2f}; "
                f"summary: {n} samples, {row.value}); rerun that evaluation to rewrite both"
            )
        yield row.series(), Cell("ruler", row.task, length, row.metric), samples


def _general_cells(summary: dict, directory: Path):
    """lm-eval tasks scored per document (acc, acc_norm, exact_match ...): the leaf tasks' rows
    whose value is the mean of the per-document values; other metrics (perplexity, a group's
    aggregate) have no per-sample form to compare and are left out."""
    per_task: dict[tuple[str, str, str | None, int | None], dict[int, LoggedSample]] = {}
    for log in sorted((directory / "general").rglob("*.samples.jsonl")):
        for record in read_log(log):
            identity = json.dumps([record.get("doc_hash"), record.get("target_hash")])
            for metric, value in (record.get("metrics") or {}).items():
                if isinstance(value, bool | int | float):
                    sample = LoggedSample(float(value), identity, record.get("prompt_hash"))
                    for length in {None, record.get("length")}:  # a LongBench-E bucket's samples are also its task's
                        per_task.setdefault((record["task"], metric, record.get("filter"), length), {})[
                            int(record["doc_id"])
                        ] = sample
    for row in summary_rows(summary):
        samples = per_task.get((row.task, row.metric, row.filter, row.length))
        if row.value is None or not samples:
            continue
        if not math.isclose(mean_score(samples), row.value, rel_tol=1e-9, abs_tol=1e-9):
            continue  # not a mean over documents (a group's aggregate, a corpus-level metric)
        yield summary["run"], Cell("general", row.task, row.length, row.metric, row.filter), samples


def _ppl_cells(summary: dict, directory: Path):
    """Perplexity at a length as a mean over documents: each document's mean loss (every document
    at L has L-1 tokens, so their plain mean is the token-weighted one), the cell `loss` = log of the
    perplexity the summary reports; the log's records of that evaluation (its key) only."""
    for row in summary_rows(summary):
        if row.metric != "perplexity" or row.value is None or row.length is None:
            continue  # LongPPL's key tokens differ per document: not a mean over documents
        by_key: dict[str, dict[int, LoggedSample]] = {}
        for record in read_log(directory / "ppl" / "ppl" / f"{row.length}.jsonl", latest=False):
            try:
                sample = LoggedSample(record["nll"] / record["tokens"], record["text_sha"], None)
                by_key.setdefault(record["key"], {})[int(record["doc"])] = sample
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                continue  # not a document's record
        for samples in by_key.values():
            if len(samples) == row.n and math.isclose(mean_score(samples), math.log(row.value), rel_tol=1e-9):
                yield row.series(), Cell("ppl", row.task, row.length, "loss"), samples
                break


def read_log(path: Path, latest: bool = True) -> list[dict]:
    """A per-sample log's records (`latest`: each sample once, the first line standing as in the store,
    of its latest key only); a record that fails its checksum, or a missing log, is one line."""
    if not path.is_file():
        raise UserError(f"{path} is missing: compare needs the per-sample logs beside each summary")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a killed run's half-written last line, or a blank one: not a sample
        if not isinstance(record, dict):
            continue
        if CHECKSUM in record and record[CHECKSUM] != record_checksum(record):
            raise UserError(f"{path}:{number} does not match its checksum (edited or damaged); rerun that evaluation")
        records.append(record)
    if not latest:
        return records
    if records and KEY in records[-1]:  # a log resumed under another key keeps only the latest key's lines
        records = [r for r in records if r.get(KEY) == records[-1][KEY]]
    first: dict = {}
    for record in records:
        first.setdefault(record.get("index", record.get("doc_id")), record)
    return list(first.values())
