"""RULER's data layer: the 13 synthetic long-context tasks (and HELMET's json_kv), sized per tokenizer, scored, cached.

from evalkit.ruler import TASKS, generate, score, load_or_generate
samples = load_or_generate("niah_single_1", tokenizer, 4096, 500)
score("niah_single_1", predictions, [s.outputs for s in samples])
"""

from evalkit.ruler.cache import cache_path, load_or_generate
from evalkit.ruler.errors import TaskDataMissing, TaskDoesNotFit, TaskSkipped
from evalkit.ruler.generation import generate
from evalkit.ruler.metrics import postprocess, sample_score, score
from evalkit.ruler.prompt import PromptFormat
from evalkit.ruler.sample import Sample, dumps_jsonl, loads_jsonl
from evalkit.ruler.spec import SPECS, TASKS

__all__ = [
    "SPECS",
    "TASKS",
    "PromptFormat",
    "Sample",
    "TaskDataMissing",
    "TaskDoesNotFit",
    "TaskSkipped",
    "cache_path",
    "dumps_jsonl",
    "generate",
    "load_or_generate",
    "loads_jsonl",
    "postprocess",
    "sample_score",
    "score",
]
