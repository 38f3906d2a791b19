"""`evalkit ruler`: RULER as one benchmark of the pipeline (evalkit.sweep.pipeline), a unit per task
and length. A task whose data is missing or that cannot fit a length is recorded as skipped with
the reason, never dropped or scored 0.
"""

from __future__ import annotations

import copy
import hashlib
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evalkit.arglists import parse_list
from evalkit.attention.anchor import anchor_note, anchor_record
from evalkit.attention.features import trained_window_anchor
from evalkit.errors import Skipped, UserError
from evalkit.models.check import load_tokenizer
from evalkit.models.refs import CheckpointRef
from evalkit.ruler.cache import cache_key, load_or_generate
from evalkit.ruler.encoding import DEFAULT_DOC_TOKENS, split_sample
from evalkit.ruler.fitting import DEFAULT_SIZING, check_sizing
from evalkit.ruler.metrics import sample_score, score, standard_error
from evalkit.ruler.prompt import BASE, PromptFormat
from evalkit.ruler.spec import DEFAULT_NUM_SAMPLES, DEFAULT_SEED, GROUPS, SPECS, TASKS, TaskSpec, task_spec
from evalkit.store.identity import COUNT, EXECUTION, LOCATION, SELECTION, identity_key, setting
from evalkit.store.provenance import stamp
from evalkit.store.result_format import STANDARD, ResultRow, encoding_label, row_encoding, row_record
from evalkit.store.sample_log import SampleLog
from evalkit.store.units import UnitStore
from evalkit.sweep.engine_choice import EngineChoice, LazyEngine
from evalkit.sweep.pipeline import (
    Averages,
    Benchmark,
    Unit,
    UnitProgress,
    UnitResult,
    check_encoding,
    check_lengths,
    earlier_cells,
    encoding_skips,
)

PROMPT_FORMATS = ("base", "chat")
SAMPLES_PER_APPEND = 32  # samples generated between durable appends: a kill loses at most one chunk's work


@dataclass
class RulerSettings:
    """What the user asked for. Every field decides a result's identity unless its role says
    otherwise (evalkit.store.identity): no sample's answer depends on num_samples, so stored
    answers are reused at any count."""

    tasks: list[str] = setting(default_factory=lambda: list(TASKS), role=SELECTION)
    lengths: list[int] = setting(default_factory=lambda: [4096], role=SELECTION)
    num_samples: int = setting(DEFAULT_NUM_SAMPLES, role=COUNT)
    seed: int = DEFAULT_SEED
    # Where the data files are read from; their content is keyed (the data key), not their place.
    essays: str | None = setting(None, role=LOCATION)
    qa_dir: str | None = setting(None, role=LOCATION)
    engine: str = "hf"
    dtype: str | None = None
    batch_size: int = setting(8, role=EXECUTION)
    max_length: int | None = None
    sizing: str = DEFAULT_SIZING  # "exact" or "nvidia" (evalkit.ruler.fitting); keyed into data and sample logs
    prompt_format: str = "base"  # "base": the task text as is; "chat": inside the tokenizer's chat template
    # "standard": one causal prompt; "anchor": documents apart (evalkit.ruler.encoding), of about
    # doc_tokens tokens each. A cell of its own: each row names its encoding.
    encoding: str = setting(STANDARD, role=SELECTION)
    doc_tokens: int = setting(DEFAULT_DOC_TOKENS, role=SELECTION)
    engine_args: dict[str, Any] = field(default_factory=dict)  # --engine-arg: more engine settings, checked

    def __post_init__(self) -> None:
        check_sizing(self.sizing)
        check_encoding(self.encoding, self.doc_tokens)
        if self.encoding != STANDARD and self.prompt_format != "base":
            raise UserError(f"--encoding {self.encoding} reads the base prompt: drop --prompt-format chat")
        if self.prompt_format not in PROMPT_FORMATS:
            raise UserError(f"--prompt-format must be one of {', '.join(PROMPT_FORMATS)}, got {self.prompt_format!r}")
        if self.num_samples < 1 or self.batch_size < 1:
            raise UserError(
                f"--samples and --batch-size must be at least 1, got {self.num_samples} and {self.batch_size}"
            )

    def data_options(self) -> dict:
        return {"essays": self.essays, "qa_dir": self.qa_dir, "sizing": self.sizing}


def parse_ruler_tasks(text: str) -> list[str]:
    """--tasks: all (RULER's 13), task names and groups (GROUPS), each task once in the order given."""
    if text.strip().lower() == "all":
        return list(TASKS)
    names = list(dict.fromkeys(task for name in parse_list(text) for task in GROUPS.get(name, (name,))))
    unknown = [name for name in names if name not in SPECS]
    if unknown or not names:
        choices = ", ".join([*GROUPS, *SPECS])
        raise UserError(f"unknown RULER task {unknown[0] if unknown else text!r}; use all or any of: {choices}")
    return names


def _prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def answer_key(settings: RulerSettings, data_key: str, facts: dict[str, str], reading: dict[str, str]) -> str:
    """What a stored answer must match to be reused: the data key, the engine's result facts, the
    window reading and every setting that changes an answer (identity_key without the count). The
    resolved dtype stands for --dtype, so asking for the default is asking for none."""
    label = encoding_label(settings.encoding, settings.doc_tokens)
    return identity_key(settings, with_count=False, data=data_key, encoding=label, **facts, **reading)


def _evaluate_task(
    engine: LazyEngine,
    tokenizer,
    spec: TaskSpec,
    settings: RulerSettings,
    store: UnitStore,
    progress: Callable[[int, int], None],
) -> tuple[ResultRow, str, int]:
    """One unit's row, its data key and how many samples were answered now, resuming from its
    sample log. The engine is built only when a sample is left to answer."""
    ref, length = store.ref, store.unit.length
    assert length is not None  # every RULER unit is a task at a length (RulerBenchmark.units)
    fmt = PromptFormat.from_chat_template(tokenizer) if settings.prompt_format == "chat" else BASE
    data = {**settings.data_options(), "prompt_format": fmt}
    fingerprint, data_key = cache_key(spec, tokenizer, length, settings.seed, **data)
    samples = load_or_generate(
        spec, tokenizer, length, settings.num_samples, settings.seed, key=(fingerprint, data_key), **data
    )
    label = encoding_label(settings.encoding, settings.doc_tokens)
    # Under --encoding anchor, a checkpoint trained with the sink window reading is served that reading
    # by the hf engine: its answers are keyed apart. The engine's result facts (engines.base.RESULT_FACTS)
    # beyond the settings, as they will be once it is built; the checkpoint's own (path, window): the log's place.
    sink = label != STANDARD and trained_window_anchor(ref.path) == "sink"
    served = engine.choice.served(ref.path)
    facts = {"dtype": served.dtype, **served.key_facts(), "tokenizer_fingerprint": fingerprint}
    key = answer_key(settings, data_key, facts, {"window_anchor": "sink"} if sink else {})
    log_file = store.file(".jsonl" if label == STANDARD else f".{label}.jsonl")  # encodings never share a log
    log = SampleLog(log_file, key, writer=store.writer)
    todo = [s for s in samples if s.index not in log.records]
    progress(len(samples) - len(todo), len(samples))
    if todo:
        if label == STANDARD:
            answer = _standard_answers(engine.get(), fmt, spec, length)
        else:
            answer = _anchor_answers(engine.get(), spec, length, samples, settings.doc_tokens)
    for start in range(0, len(todo), SAMPLES_PER_APPEND):
        chunk = todo[start : start + SAMPLES_PER_APPEND]
        prompts = [fmt.render(s.input, s.answer_prefix) for s in chunk]  # rendered once: fed and hashed
        predictions, extras = answer(chunk, prompts)
        log.append(
            [
                {
                    "index": s.index,
                    "length": s.length,
                    "prediction": p,
                    "references": s.outputs,
                    "score": sample_score(spec, p, s.outputs),
                    "prompt_sha": _prompt_hash(prompt),
                    **({"depths": s.depths} if s.depths is not None else {}),
                    **extra,
                }
                for s, p, prompt, extra in zip(chunk, predictions, prompts, extras)
            ]
        )
        progress(len(samples) - len(todo) + start + len(chunk), len(samples))
    records = [log.records[s.index] for s in samples]  # the first num_samples: a log may hold more
    answers = ([r["prediction"] for r in records], [r["references"] for r in records])
    cell: dict[str, Any] = {"n": len(records), "length": length, "encoding": settings.encoding}
    if label != STANDARD:  # documents of what size, and how many a sample became on average
        documents = round(sum(r["documents"] for r in records) / len(records), 2)
        cell |= {"doc_tokens": settings.doc_tokens, "documents": documents}
    value, stderr = score(spec, *answers), standard_error(spec, *answers)
    row = ResultRow("ruler", ref.run, ref.step, spec.name, spec.metric_name, value, stderr, **cell)
    return row, data_key, len(todo)


# (samples, their rendered prompts) -> (predictions, extra record fields)
Answers = Callable[[list, list[str]], tuple[list[str], list[dict]]]


def _standard_answers(engine, fmt: PromptFormat, spec: TaskSpec, length: int) -> Answers:
    def answer(chunk: list, prompts: list[str]) -> tuple[list[str], list[dict]]:
        # Base prompts as text (the engine adds the specials); chat prompts as token ids, since a
        # template that writes the BOS itself must not get a second.
        fed_prompts: list[str] | list[list[int]] = prompts
        if fmt is not BASE:
            fed_prompts = [engine.tokenizer(p, add_special_tokens=fmt.add_special_tokens)["input_ids"] for p in prompts]
        for sample, prompt in zip(chunk, fed_prompts):
            fed = engine.count_tokens(prompt)
            if fed + spec.max_new_tokens > length:  # the sizing promise; a violation is a bug, not data
                raise RuntimeError(
                    f"{spec.name} sample {sample.index}: {fed} + {spec.max_new_tokens} tokens exceed {length}"
                )
        return engine.generate(fed_prompts, spec.max_new_tokens), [{} for _ in chunk]

    return answer


def _anchor_answers(engine, spec: TaskSpec, length: int, samples: list, doc_tokens: int) -> Answers:
    """Greedy answers to each sample read as packed documents behind one anchor (ruler.encoding).
    Every sample is laid out first: one that does not fit the window skips the unit, not half of it."""
    from evalkit.engines import PackedRequest
    from evalkit.engines.tokens import packed_layout

    requests, sizes = {}, {}
    for sample in samples:
        split = split_sample(sample, spec, engine.tokenizer, doc_tokens)
        requests[sample.index] = PackedRequest(split.documents, split.question)
        layout = packed_layout(engine.tokenizer, split.documents, split.question)
        sizes[sample.index] = (len(split.documents), len(layout.input_ids))
    longest = max(tokens for _, tokens in sizes.values())
    if longest + spec.max_new_tokens > engine.max_length:
        raise Skipped(
            f"anchor encoding adds one EOS per document: {longest} + {spec.max_new_tokens} tokens exceed the "
            f"window of {engine.max_length} (evaluate a shorter length, larger --doc-tokens, or pass --max-length)"
        )

    def answer(chunk: list, _prompts: list[str]) -> tuple[list[str], list[dict]]:
        predictions = engine.generate_packed([requests[s.index] for s in chunk], spec.max_new_tokens)
        extras = [{"documents": sizes[s.index][0], "packed_tokens": sizes[s.index][1]} for s in chunk]
        return predictions, extras

    return answer


class RulerBenchmark(Benchmark):
    """A unit's data key depends on the checkpoint's tokenizer, so every unit is "evaluated";
    one whose sample log is complete computes nothing and builds no engine."""

    name = "ruler"
    title = "RULER"
    transient = ("_tokenizers",)  # each worker loads its own

    def __init__(self, settings: RulerSettings) -> None:
        self.settings = settings
        self.engine = EngineChoice.of(settings)
        self._specs = {task: task_spec(task) for task in settings.tasks}  # each task resolved once
        self._tokenizers: dict[Path, object] = {}

    def _tokenizer_at(self, path: Path):
        """Loaded once, as the engines load theirs (the same fingerprint)."""
        if path not in self._tokenizers:
            self._tokenizers[path] = load_tokenizer(path)
            if self.settings.encoding != STANDARD:
                print(f"{anchor_note(self._tokenizers[path])} for {path}", file=sys.stderr)
        return self._tokenizers[path]

    def check(self, refs: list[CheckpointRef]) -> None:
        check_lengths(refs, self.settings)

    def units(self) -> list[Unit]:
        return [Unit(task, length) for length in self.settings.lengths for task in self.settings.tasks]

    def unit_cost(self, unit: Unit) -> float:
        """Every sample is about `length` tokens long."""
        return unit.length * self.settings.num_samples

    def evaluate(self, engine: LazyEngine, unit: Unit, store: UnitStore, progress: UnitProgress) -> UnitResult[str]:
        with encoding_skips(self.settings):
            row, data_key, generated = _evaluate_task(
                engine, self._tokenizer_at(store.ref.path), self._specs[unit.task], self.settings, store, progress
            )
        return UnitResult([row], data_key, computed=bool(generated))

    def finish_summary(self, summary: dict, results: list[UnitResult], earlier: dict | None) -> dict:
        summary = copy.deepcopy(summary)  # the pipeline's stays as it made it
        summary["provenance"]["data_keys"] = {
            _cell_name(row_record(row)): result.detail for result in results for row in result.rows
        }
        if self.settings.encoding != STANDARD:  # which token the documents shared, and why
            summary["provenance"]["anchor"] = anchor_record(self._tokenizer_at(Path(summary["checkpoint"])))
        return _with_earlier_cells(summary, earlier)

    def average(self, rows: list[ResultRow]) -> Averages:
        from evalkit.store.averages import average_table, category_averages

        conditions = "Mean ± population std over each run's checkpoints of the per-length task average."
        return Averages([asdict(average) for average in category_averages(rows)], average_table(rows), conditions)


def _cell_name(row: dict) -> str:
    label = row_encoding(row)
    return f"{row['task']}@{row['length']}" + ("" if label == STANDARD else f"@{label}")


def _with_earlier_cells(summary: dict, earlier: dict | None) -> dict:
    if earlier is None:
        return summary
    kept_rows, kept_skips = earlier_cells(RulerSettings, summary, earlier, _cell_name)
    if not (kept_rows or kept_skips):
        return summary
    now, then = summary["provenance"], earlier["provenance"]
    order = {task: i for i, task in enumerate(TASKS)}
    cell = lambda entry: (int(entry["length"]), order.get(entry["task"], len(order)), row_encoding(entry) != STANDARD)  # noqa: E731
    settings = now["settings"]
    settings["tasks"] = sorted(
        {*settings["tasks"], *(then["settings"].get("tasks") or [])}, key=lambda task: order.get(task, len(order))
    )
    settings["lengths"] = sorted({*settings["lengths"], *(then["settings"].get("lengths") or [])})
    now["data_keys"] = {**then.get("data_keys", {}), **now["data_keys"]}
    # Who scored the cells kept: every earlier piece's stamp, oldest first (a summary built length
    # by length, or task by task, keeps each piece's).
    now["earlier_cells_stamps"] = [*then.get("earlier_cells_stamps", []), {key: then.get(key) for key in stamp()}]
    summary["rows"] = sorted([*kept_rows, *summary["rows"]], key=cell)
    summary["skipped"] = sorted([*kept_skips, *summary["skipped"]], key=cell)
    return summary
