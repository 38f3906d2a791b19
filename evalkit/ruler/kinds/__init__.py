"""RULER's task kinds: one module per kind (its generator and what only it knows), their registry and base.

A task (spec.py) names its kind; the kind names the module and the KindTask class that generates
its samples. The module's DATA_CONSTANTS (every module-level value its samples depend on) are part
of the cache key (cache.py): change one and that kind's cached samples are regenerated.

What else differs by kind, its module says through optional functions, asked through its
TaskKind (the default, where the module has none, in brackets):
- data_identity(spec, essays, qa_dir) -> list: the identity of the data files its samples read
  (niah's essays, qa's datasets: file_identity) [none];
- prompt_templates(spec) -> list[str]: the templates a sample's text may follow, to find its
  context in (niah's singular rewrite) [the task's template];
- context_documents(context) -> list[str] | None: the context's own documents for --encoding
  anchor (qa's "Document k:" blocks) [None: cut into pieces of about --doc-tokens].
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Generic, TypeVar

from evalkit.files import file_sha256
from evalkit.ruler.counting import Item, compose_count
from evalkit.ruler.fitting import Coarse

if TYPE_CHECKING:
    from evalkit.ruler.context import Context
    from evalkit.ruler.spec import TaskSpec


@dataclass(frozen=True)
class TaskKind:
    name: str
    module: str  # imported on first use
    generator: str  # the class in `module` that makes samples from a Context

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    # The optional functions of this module's docstring, with their defaults.
    def data_identity(self, spec: TaskSpec, essays, qa_dir) -> list:
        return getattr(self.load(), "data_identity", lambda *_: [])(spec, essays, qa_dir)

    def prompt_templates(self, spec: TaskSpec) -> list[str]:
        return getattr(self.load(), "prompt_templates", lambda spec: [spec.template])(spec)

    def context_documents(self, context: str) -> list[str] | None:
        return getattr(self.load(), "context_documents", lambda _: None)(context)


KINDS = {
    kind.name: kind
    for kind in (
        TaskKind("niah", "evalkit.ruler.kinds.niah", "NiahTask"),
        TaskKind("variable_tracking", "evalkit.ruler.kinds.vt", "VariableTrackingTask"),
        TaskKind("common_words_extraction", "evalkit.ruler.kinds.cwe", "CommonWordsTask"),
        TaskKind("freq_words_extraction", "evalkit.ruler.kinds.fwe", "FrequentWordsTask"),
        TaskKind("qa", "evalkit.ruler.kinds.qa", "QaTask"),
        TaskKind("json_kv", "evalkit.ruler.kinds.json_kv", "JsonKvTask"),
    )
}


TaskT = TypeVar("TaskT", bound="KindTask")


class KindPlan(ABC, Generic[TaskT]):
    """One sample's fixed random choices, its haystack size still open (fitting sizes it): a kind's
    plan sets min_size, prefix, outputs and items(); estimate and guess (per_unit()'s slope) are shared."""

    max_size: int | None = None
    min_size: int
    prefix: str  # the answer prefix (what ends the prompt, after the format's `between`)
    outputs: list[str]

    def __init__(self, task: TaskT, index: int):
        self.task, self.ctx = task, task.ctx
        self.position_seed = task.ctx.seed_for(index, "positions")

    @abstractmethod
    def items(self, size: int) -> list[Item]:
        """The prompt's pieces at `size` units, as each kind lays them out."""

    def per_unit(self) -> float:
        """What one more unit costs in tokens: the shared guess's slope (fwe guesses its own way)."""
        raise NotImplementedError

    def estimate(self, size: int) -> int:
        return compose_count(self.ctx.counter, self.items(size), rough=True)

    def guess(self, budget: int) -> int:
        fixed = self.estimate(self.min_size)
        return self.min_size + max(0, int((budget - fixed) / max(self.per_unit(), 1e-9)))

    def check_fit(self, size: int, tokens: int) -> None:
        """A kind whose fitted size can still be no valid sample raises TaskSkipped here."""

    def answer_depths(self, size: int) -> list[float] | None:
        """For each of `outputs`, the depth (percent, 0-100) in the context of the needle carrying it
        at `size`; None: the kind places no needles."""
        return None


class KindTask:
    """A kind's generator: what all samples of one task at one length share; plan(i) is sample i's."""

    Plan: type[KindPlan]

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def plan(self, index: int) -> KindPlan:
        return self.Plan(self, index)

    def coarse(self) -> Coarse:
        """NVIDIA's step: 10 units (cwe's distinct words, qa's documents); other kinds say theirs."""
        return Coarse(10)


def task_kind(spec: TaskSpec) -> TaskKind:
    return KINDS[spec.kind]


def file_identity(path: Path) -> list:
    """The sha256 of a data file's content, so a copy elsewhere (or staged anew on each node of a
    cluster) is the same data; hashed once per process while its size and mtime stay the same."""
    if not path.is_file():
        return [str(path), None]
    stat = path.stat()
    return ["sha256", _content_sha256(path.resolve(), stat.st_size, stat.st_mtime_ns)]


@functools.lru_cache(maxsize=64)
def _content_sha256(path: Path, _size: int, _mtime_ns: int) -> str:
    return file_sha256(path)


def generator_class(kind: str) -> type[KindTask]:
    return getattr(KINDS[kind].load(), KINDS[kind].generator)


def constants_digest(kind: str) -> str:
    """A hash of the kind's DATA_CONSTANTS."""
    constants = KINDS[kind].load().DATA_CONSTANTS
    return hashlib.sha256(json.dumps(constants, sort_keys=True, default=repr).encode()).hexdigest()[:20]
