"""Question answering (qa_1: SQuAD v2 dev, qa_2: HotpotQA dev distractor) over many documents.

From qa.py: documents are the datasets' paragraphs (deduplicated, sorted); sample i asks the
i-th answerable question; its gold paragraph(s) go among distractors (for SQuAD, first the
other paragraphs of the same article, then random ones), shuffled, as `Document {i}:\\n{text}`
joined by blank lines. The number of documents is the size fitted to the length. The data is
read from local files only (a missing one: TaskDataMissing).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from evalkit.ruler.context import Context
from evalkit.ruler.counting import LEFT_CONTEXT_CHARS, Block, Item
from evalkit.ruler.errors import TaskDataMissing
from evalkit.ruler.kinds import KindPlan, KindTask, file_identity
from evalkit.ruler.layout import NumberedLabels
from evalkit.ruler.spec import QA_PREFIX, QA_TEMPLATE

if TYPE_CHECKING:
    from evalkit.ruler.spec import TaskSpec

# Per dataset: its name and accepted file names (the official release name first, then NVIDIA's).
DATASETS = {
    "squad": ("SQuAD v2 dev", ("dev-v2.0.json", "squad.json")),
    "hotpotqa": ("HotpotQA dev distractor", ("hotpot_dev_distractor_v1.json", "hotpotqa.json")),
}
# A document starts with `\n\nDocument` (counted after the previous document: a blank line after
# trailing whitespace tokenises differently), then ` {k}:`, then `\n` and the text after the colon.
DOCUMENT_START = "\n\nDocument"
DATA_CONSTANTS = {"DOCUMENT_START": DOCUMENT_START}  # keyed into the cache (evalkit.ruler.kinds)
DOCUMENT_BREAK = "\n\nDocument "  # a context joins its "Document k:\n..." blocks with a blank line


@dataclass(frozen=True)
class Question:
    query: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]  # document ids that must be in the prompt
    related: tuple[int, ...]  # distractors preferred first (SQuAD: same article)


@dataclass(frozen=True)
class QaData:
    documents: tuple[str, ...]
    questions: tuple[Question, ...]
    source: str = ""  # which file version: keys the per-tokenizer document counts


def dataset_path(dataset: str, qa_dir: str | Path | None) -> Path | None:
    """The dataset's file in qa_dir (None when qa_dir is not given)."""
    if qa_dir is None:
        return None
    paths = [Path(qa_dir) / name for name in DATASETS[dataset][1]]
    return next((path for path in paths if path.is_file()), paths[0])


def data_identity(spec: TaskSpec, essays, qa_dir) -> list:
    """The task's dataset file in qa_dir ([None] when no qa_dir is given)."""
    path = dataset_path(spec.params["dataset"], qa_dir)
    return file_identity(path) if path is not None else [None]


def context_documents(context: str) -> list[str]:
    """A context's documents for --encoding anchor: the text before the first, then each "Document k:" block."""
    parts = context.split(DOCUMENT_BREAK)
    return [parts[0]] + [DOCUMENT_BREAK + part for part in parts[1:]]


def _missing(ctx: Context, why: str) -> TaskDataMissing:
    return TaskDataMissing(ctx.spec.name, ctx.length, why)


def load_dataset(ctx: Context) -> QaData:
    dataset = ctx.spec.params["dataset"]
    name, file_name = DATASETS[dataset][0], DATASETS[dataset][1][0]
    path = dataset_path(dataset, ctx.qa_dir)
    if path is None:
        raise _missing(ctx, f"needs the {name} file: pass --qa-dir (qa_dir=) a folder holding {file_name}")
    if not path.is_file():
        raise _missing(ctx, f"{name} file not found: put {file_name} in {path.parent}")
    stat = path.stat()
    try:
        data = _read(str(path.resolve()), stat.st_size, stat.st_mtime_ns, dataset)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        raise _missing(ctx, f"{path} is not in the {name} format ({type(error).__name__}: {error})") from error
    if not data.questions:
        raise _missing(ctx, f"{path} holds no answerable questions")
    return data


@lru_cache(maxsize=4)
def _read(path: str, size: int, mtime_ns: int, dataset: str) -> QaData:
    """Parsed once per process per file version (size and mtime are part of the cache key)."""
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    data = _parse_squad(raw) if dataset == "squad" else _parse_hotpotqa(raw)
    return QaData(data.documents, data.questions, f"{path}:{size}:{mtime_ns}")


def _parse_squad(raw: dict) -> QaData:
    documents = tuple(sorted({p["context"] for article in raw["data"] for p in article["paragraphs"]}))
    ids = {text: i for i, text in enumerate(documents)}
    questions = []
    for article in raw["data"]:
        in_article = [ids[p["context"]] for p in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            gold = ids[paragraph["context"]]
            for qa in paragraph["qas"]:
                if qa.get("is_impossible", False):
                    continue  # only answerable questions
                answers = tuple(a["text"] for a in qa["answers"])
                if answers:
                    related = tuple(i for i in in_article if i != gold)
                    questions.append(Question(qa["question"], answers, (gold,), related))
    return QaData(documents, tuple(questions))


def _hotpot_document(title: str, sentences: list[str]) -> str:
    return f"{title}\n{''.join(sentences)}"


def _parse_hotpotqa(raw: list) -> QaData:
    documents = tuple(sorted({_hotpot_document(t, s) for item in raw for t, s in item["context"]}))
    ids = {text: i for i, text in enumerate(documents)}
    questions = []
    for item in raw:
        # All ten paragraphs of the distractor setting go in (gold and HotpotQA's own distractors).
        gold = tuple(dict.fromkeys(ids[_hotpot_document(t, s)] for t, s in item["context"]))
        questions.append(Question(item["question"], (item["answer"],), gold, ()))
    return QaData(documents, tuple(questions))


class QaPlan(KindPlan["QaTask"]):
    def __init__(self, task: QaTask, index: int):
        super().__init__(task, index)
        ctx = task.ctx
        question = task.data.questions[index % len(task.data.questions)]
        self.outputs = list(question.answers)
        self.prefix = QA_PREFIX
        self.head = ctx.head(task.head)
        self.tail = ctx.tail(task.tail_template.format(query=question.query), self.prefix)
        self.gold = list(question.gold)
        self.rng = random.Random(ctx.seed_for(index, "distractors"))
        related = list(question.related)
        self.rng.shuffle(related)
        self.candidates = self.gold + related  # then random other documents, drawn as needed
        self.excluded = set(self.candidates)
        self.min_size = len(self.gold)
        self._cumulative = np.zeros(1, dtype=np.int64)

    def _grow(self, size: int) -> None:
        """Extend the candidates to `size` documents and their prefix sums of body tokens."""
        documents = len(self.task.data.documents)
        while len(self.candidates) < size:
            if len(self.excluded) >= documents:
                # Every document is in: repeat distractors (qa.py repeats the documents too).
                pool = [i for i in range(documents) if i not in self.gold] or list(self.gold)
                self.candidates.append(pool[self.rng.randrange(len(pool))])
                continue
            pick = self.rng.randrange(documents)
            if pick not in self.excluded:
                self.excluded.add(pick)
                self.candidates.append(pick)
        if len(self._cumulative) <= size:
            fresh = self.task.bodies(self.candidates[len(self._cumulative) - 1 : size])
            self._cumulative = np.concatenate([self._cumulative, self._cumulative[-1] + np.cumsum(fresh)])

    def items(self, size: int) -> list[Item]:
        self._grow(size)
        chosen = self.candidates[:size]
        random.Random(self.position_seed ^ size).shuffle(chosen)
        counter, documents = self.ctx.counter, self.task.data.documents
        labels = counter.after_many(("Document", f" {k}:") for k in range(1, len(chosen) + 1))
        bodies = self.task.bodies(chosen)
        items: list[Item] = [self.head]
        for k, (doc, label, body) in enumerate(zip(chosen, labels, bodies), 1):
            text = f"Document {k}:\n{documents[doc]}"
            sep = "" if k == 1 else "\n\n"  # the template's blank line precedes the first document
            render = lambda rendered=sep + text: rendered  # noqa: E731  (bound now, not at the loop's end)
            items.append(Block(sep + "Document", label + body, text[-LEFT_CONTEXT_CHARS:], render))
        items.append(self.tail)
        return items

    def estimate(self, size: int) -> int:
        """Rough count from prefix sums: every piece counted as if it began the text."""
        self._grow(size)
        counter = self.ctx.counter
        head, first, start, tail = counter.after_many(
            [("", self.head), ("", "Document"), ("", DOCUMENT_START), ("", self.tail)]
        )
        labels = self.task.labels.upto(size)
        return counter.specials + head + first + (size - 1) * start + labels + int(self._cumulative[size]) + tail

    def per_unit(self) -> float:
        self._grow(self.min_size + 8)
        return float(self._cumulative[-1]) / len(self._cumulative[1:]) + 6


class QaTask(KindTask):
    Plan = QaPlan

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.data = load_dataset(ctx)
        self.head, self.tail_template = QA_TEMPLATE.split("{context}")
        self.labels = ctx.counter.tables.setdefault("qa labels", NumberedLabels(ctx.counter, "Document", " {}:", 1))
        # Tokens of "\n" + document after "Document i:", per tokenizer and file version.
        self.body_tokens: dict[int, int] = ctx.counter.tables.setdefault(("qa", self.data.source), {})

    def bodies(self, ids: list[int]) -> list[int]:
        missing = [i for i in dict.fromkeys(ids) if i not in self.body_tokens]
        if missing:
            counts = self.ctx.counter.after_many((":", "\n" + self.data.documents[i]) for i in missing)
            self.body_tokens.update(zip(missing, counts))
        return [self.body_tokens[i] for i in ids]
