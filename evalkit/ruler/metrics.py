"""RULER's metrics (scripts/eval/synthetic/constants.py and scripts/eval/evaluate.py).

A prediction is stripped and its control characters [\\x00-\\x1f] become newlines before matching;
references match case-insensitively as substrings. string_match_all credits the share of
references found, string_match_part credits 1 when any reference is found (QA).

json_kv is scored as HELMET scores it (utils.py substring_exact_match_score; docs/ruler.md).
"""

from __future__ import annotations

import re
import statistics
import string
from collections.abc import Sequence

from evalkit.ruler.spec import TaskSpec, as_spec

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    return _CONTROL.sub("\n", prediction.strip()).strip()


def match_all(prediction: str, references: Sequence[str]) -> float:
    """Share (0..1) of the references found in the prediction."""
    text = postprocess(prediction).lower()
    return sum(1.0 for ref in references if ref.lower() in text) / len(references)


def match_part(prediction: str, references: Sequence[str]) -> float:
    text = postprocess(prediction).lower()
    return max(1.0 if ref.lower() in text else 0.0 for ref in references)


def normalize_answer(text: str) -> str:
    """Lower-cased, without punctuation nor the articles a/an/the, whitespace collapsed (HELMET, after SQuAD)."""
    kept = "".join(char for char in text.lower() if char not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", kept).split())


def parse_output(output: str, prefix: str) -> str:
    """The rest of the line after `prefix` (case-insensitive), else the first line; stripped, and
    a repeat of the prefix at its start dropped (chat models echo it)."""
    found = re.search(f"{re.escape(prefix)}(.*)", output, re.IGNORECASE) or re.match("(.*)", output)
    assert found is not None  # "(.*)" matches any text
    return re.sub(f"^{re.escape(prefix)}", "", found[1].strip(), flags=re.IGNORECASE).strip()


def substring_exact_match(prediction: str, references: Sequence[str]) -> float:
    """1 when a normalized reference is in the normalized prediction, as is or parsed (parse_output)."""
    texts = [normalize_answer(text) for text in (prediction, parse_output(prediction, "corresponding value:"))]
    return max(1.0 if normalize_answer(ref) in text else 0.0 for ref in references for text in texts)


_METRICS = {"all": match_all, "part": match_part, "subem": substring_exact_match}


def sample_score(task: str | TaskSpec, prediction: str, references: Sequence[str]) -> float:
    """One sample's score on 0..100 (unrounded), with the task's metric (`task`: its name or its TaskSpec)."""
    spec = as_spec(task)
    if not references:
        raise ValueError(f"{spec.name}: a sample has no reference answers")
    return 100.0 * _METRICS[spec.metric](prediction, references)


def score(task: str | TaskSpec, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """The task's score on 0..100, rounded to 2 decimals as NVIDIA rounds it."""
    spec = as_spec(task)
    if len(predictions) != len(references):
        raise ValueError(f"{spec.name}: {len(predictions)} predictions for {len(references)} reference lists")
    if not predictions:
        raise ValueError(f"{spec.name}: no predictions to score")
    if not all(references):
        raise ValueError(f"{spec.name}: a sample has no reference answers")
    metric = _METRICS[spec.metric]
    # Same order of operations as NVIDIA (sum / n * 100, then round) so ties round alike.
    return round(sum(metric(p, r) for p, r in zip(predictions, references)) / len(predictions) * 100, 2)


def standard_error(task: str | TaskSpec, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """The standard error of the task's score (0..100); 0 for a single sample."""
    spec = as_spec(task)
    values = [sample_score(spec, p, r) for p, r in zip(predictions, references)]
    if len(values) < 2:
        return 0.0
    return round((statistics.variance(values) / len(values)) ** 0.5, 2)
