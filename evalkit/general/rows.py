"""lm-eval's result JSON as evalkit's long-form rows (ResultRow), and its per-sample log in compact form.
`requested` is the name the user asked for (mmlu), `task` the lm-eval task or group the number
belongs to (mmlu_anatomy, ...): a group's row is lm-eval's own aggregate of its members, never recomputed here.
A row's length: docs/general.md, "A length axis".
"""

from __future__ import annotations

import math
import numbers
import statistics
from dataclasses import replace
from typing import Any

from evalkit.store.result_format import LONGBENCH_E, LONGBENCH_E_BUCKETS, ResultRow

STDERR_MARK = "_stderr"


def result_rows(results: dict[str, Any], requested: str, run: str, step: int) -> list[ResultRow]:
    rows = []
    for task, entry in results["results"].items():
        for key, value in entry.items():
            # "acc,none" is a score; "acc_stderr,none" its error; alias, sample_len have no filter.
            metric, comma, filter_name = key.partition(",")
            if not comma or metric.endswith(STDERR_MARK) or not _is_number(value):  # lists, strings: not a score
                continue
            rows.append(
                ResultRow(
                    "general",
                    run,
                    step,
                    task,
                    metric,
                    _finite_or_none(value),
                    _finite_or_none(entry.get(f"{metric}{STDERR_MARK},{filter_name}")),
                    _sample_count(results, task),
                    requested=requested,
                    filter=filter_name,
                    num_fewshot=results.get("n-shot", {}).get(task),
                )
            )
    # The number the user asked for first, then its members in lm-eval's order.
    return sorted(rows, key=lambda row: row.task != requested)


def compact_samples(samples: dict[str, list[dict[str, Any]]], length: int | None = None) -> list[dict[str, Any]]:
    """lm-eval's logged samples without the prompts (mmlu's 5-shot prompts would be ~100 MB):
    the document, its target, the model's responses, the per-sample metrics and lm-eval's hashes;
    its length where it has one (the call's `length`, else its LongBench-E bucket), so that
    compare finds each length's samples."""
    kept = []
    for task, task_samples in samples.items():
        for sample in task_samples:
            metrics = {name: sample[name] for name in sample.get("metrics", []) if name in sample}
            kept.append(
                {
                    "task": task,
                    "doc_id": sample["doc_id"],
                    "filter": sample.get("filter"),
                    "target": sample.get("target"),
                    "responses": sample.get("filtered_resps"),
                    "metrics": metrics,
                    **{key: sample.get(key) for key in ("doc", "doc_hash", "prompt_hash", "target_hash")},
                }
            )
            doc = sample.get("doc")  # a LongBench-E document's bucket: the lower bound of its words
            words = doc.get("length") if LONGBENCH_E.fullmatch(task) and isinstance(doc, dict) else None
            if length is not None:
                kept[-1]["length"] = length
            elif isinstance(words, int | float):
                kept[-1]["length"] = max(bucket for bucket in LONGBENCH_E_BUCKETS if bucket <= words)
    return kept


def bucket_rows(rows: list[ResultRow], samples: list[dict[str, Any]]) -> list[ResultRow]:
    """A LongBench-E task's rows per bucket: the mean over the bucket's documents of each metric
    whose task row is the mean over all of them (lm-eval's; a corpus-level metric has no buckets),
    its stderr as lm-eval's for a mean (sample std / sqrt n)."""
    values: dict[tuple, dict[int, list[float]]] = {}
    for sample in samples:
        if "length" in sample and LONGBENCH_E.fullmatch(sample["task"]):
            for metric, value in sample["metrics"].items():
                key = (sample["task"], metric, sample["filter"])
                values.setdefault(key, {}).setdefault(sample["length"], []).append(float(value))
    bucketed = []
    for row in rows:
        by_bucket = values.get((row.task, row.metric, row.filter), {})
        every = [value for found in by_bucket.values() for value in found]
        if row.length is not None or row.value is None or not every:
            continue
        if not math.isclose(math.fsum(every) / len(every), row.value, rel_tol=1e-9, abs_tol=1e-12):
            continue
        for bucket, found in sorted(by_bucket.items()):
            stderr = statistics.stdev(found) / math.sqrt(len(found)) if len(found) > 1 else None
            mean = math.fsum(found) / len(found)
            bucketed.append(replace(row, value=mean, stderr=stderr, n=len(found), length=bucket))
    return bucketed


def _sample_count(results: dict[str, Any], task: str) -> int | None:
    """Documents scored: lm-eval's effective count for a task, the sum over members for a group."""
    counted = results.get("n-samples", {}).get(task)
    if counted is not None:
        return int(counted["effective"])
    sample_len = results["results"].get(task, {}).get("sample_len")
    return int(sample_len) if sample_len is not None else None


def _is_number(value: Any) -> bool:
    """Python and numpy numbers alike (lm-eval's aggregates are either); not True/False."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _finite_or_none(value: Any) -> float | None:
    """A float, or None where JSON could not hold it (NaN) or lm-eval has none ("N/A" stderr)."""
    return float(value) if _is_number(value) and math.isfinite(value) else None
