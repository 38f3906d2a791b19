"""The RULER benchmark definition: the 13 tasks, their prompt templates, budgets and metrics;
and HELMET's JSON-KV, run by the same pipeline (not one of RULER's 13, nor in its average).

RULER's is reproduced from NVIDIA/RULER (scripts/synthetic.yaml,
scripts/data/synthetic/constants.py, scripts/eval/synthetic/constants.py), JSON-KV's from
princeton-nlp/HELMET (data.py load_json_kv, configs/recall_short.yaml). The template strings are
benchmark definitions and must stay byte-exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from evalkit.store.averages import HELMET_RECALL, RULER

# Bump whenever generated data changes for the same inputs: it is part of the cache key.
GENERATOR_VERSION = 1

# In NVIDIA's order (scripts/synthetic.yaml); named in store/averages.py, which averages by them.
TASKS: tuple[str, ...] = RULER.tasks

NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE_LINE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)

CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\n"
    "Question: What are the 10 most common words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"

FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words. {context}\n"
    "Question: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"

QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\n"
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nQuestion: {query}"
)
QA_PREFIX = " Answer:"
QA_DOCUMENT = "Document {i}:\n{document}"

# HELMET's user template; the answer prefix is its system template after the "\n" its prompt_template adds.
JSON_KV_TEMPLATE = (
    "{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n"
    "{demos}Key: {question}"
)
JSON_KV_PREFIX = "\nCorresponding value:"
JSON_KV_DEMO = "Key: {key}\nCorresponding value:{value}"

# generator kind -> (template, answer prefix, max new tokens)
TEMPLATES: Mapping[str, tuple[str, str, int]] = MappingProxyType(
    {
        "niah": (NIAH_TEMPLATE, NIAH_PREFIX, 128),
        "variable_tracking": (VT_TEMPLATE, VT_PREFIX, 30),
        "common_words_extraction": (CWE_TEMPLATE, CWE_PREFIX, 120),
        "freq_words_extraction": (FWE_TEMPLATE, FWE_PREFIX, 50),
        "qa": (QA_TEMPLATE, QA_PREFIX, 32),
        "json_kv": (JSON_KV_TEMPLATE, JSON_KV_PREFIX, 100),
    }
)

DEFAULT_LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_NUM_SAMPLES = 500
DEFAULT_SEED = 42


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str  # the generator (kinds.KINDS)
    metric: str  # "all", "part" or "subem" (METRIC_NAMES)
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def template(self) -> str:
        return TEMPLATES[self.kind][0]

    @property
    def answer_prefix(self) -> str:
        return TEMPLATES[self.kind][1]

    @property
    def max_new_tokens(self) -> int:
        return TEMPLATES[self.kind][2]

    @property
    def metric_name(self) -> str:
        """The metric a result row names, as NVIDIA's (or HELMET's) scorer calls it."""
        return METRIC_NAMES[self.metric]


METRIC_NAMES = {"all": "string_match_all", "part": "string_match_part", "subem": "substring_exact_match"}


def _niah(name: str, haystack: str, key: str, value: str, keys: int = 1, values: int = 1, queries: int = 1):
    params: dict[str, str | int] = {"haystack": haystack, "key_type": key, "value_type": value}
    # niah.py: the number of keys is raised to the number of queries.
    params.update(num_keys=max(keys, queries), num_values=values, num_queries=queries)
    return TaskSpec(name, "niah", "all", MappingProxyType(params))


SPECS: Mapping[str, TaskSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            _niah("niah_single_1", "noise", "words", "numbers"),
            _niah("niah_single_2", "essay", "words", "numbers"),
            _niah("niah_single_3", "essay", "words", "uuids"),
            _niah("niah_multikey_1", "essay", "words", "numbers", keys=4),
            _niah("niah_multikey_2", "needle", "words", "numbers"),
            _niah("niah_multikey_3", "needle", "uuids", "uuids"),
            _niah("niah_multivalue", "essay", "words", "numbers", values=4),
            _niah("niah_multiquery", "essay", "words", "numbers", queries=4),
            TaskSpec("vt", "variable_tracking", "all", MappingProxyType({"num_chains": 1, "num_hops": 4})),
            TaskSpec(
                "cwe", "common_words_extraction", "all", MappingProxyType({"freq_cw": 30, "freq_ucw": 3, "num_cw": 10})
            ),
            TaskSpec("fwe", "freq_words_extraction", "all", MappingProxyType({"alpha": 2.0, "coded_wordlen": 6})),
            TaskSpec("qa_1", "qa", "part", MappingProxyType({"dataset": "squad"})),
            TaskSpec("qa_2", "qa", "part", MappingProxyType({"dataset": "hotpotqa"})),
            TaskSpec("json_kv", "json_kv", "subem", MappingProxyType({"shots": 2})),  # HELMET's configs/recall*.yaml
        )
    }
)
OTHER_TASKS = ("json_kv",)  # run like RULER's tasks, never in RULER's average (--tasks all is RULER's 13)
assert tuple(SPECS) == TASKS + OTHER_TASKS
# --tasks groups: HELMET's Recall category (configs/recall.yaml), averaged per length where all four are scored.
GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType({"helmet_recall": HELMET_RECALL.tasks})


def task_spec(task: str) -> TaskSpec:
    from evalkit.errors import UserError

    if task not in SPECS:
        raise UserError(f"unknown RULER task {task!r}: choose from {', '.join(SPECS)}")
    return SPECS[task]


def as_spec(task: str | TaskSpec) -> TaskSpec:
    """A task's spec from its name, or the spec itself: resolved once where a unit starts, then passed down."""
    return task if isinstance(task, TaskSpec) else task_spec(task)
