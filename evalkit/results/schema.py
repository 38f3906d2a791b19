"""One result schema for every benchmark: long-form rows of one number each, with what was evaluated.

Summaries store each benchmark's rows in the shape its runner writes (RULER: task, length,
score; lm-eval: requested, task, metric, filter, value). Every reader of stored results (the
leaderboard, its plots, scripts) reads them through `summary_rows`, which gives one typed row
per number, whatever the benchmark and whichever evalkit version wrote the file:

    ResultRow(benchmark="ruler", run="anchor", step=2000, task="niah_single_1", metric="string_match_all",
              value=98.2, stderr=0.6, n=500, length=4096, paradigm="anchor", model="Llama-2-7b-hf", data=...)

No dimension is packed into a string: a RULER length, an lm-eval filter and the shots are fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    encoding: str | None = None  # RULER: "standard", or "anchor-512" (documents encoded apart; ruler.encoding)
    requested: str | None = None  # lm-eval: the name asked for (mmlu, for the row of mmlu_anatomy)
    filter: str | None = None  # lm-eval: the answer filter ("none")
    num_fewshot: int | None = None
    paradigm: str = "?"  # from the checkpoint's meta.json, as the summary recorded it
    model: str = "?"
    data: str = "?"


# RULER's metric per task kind, by the names NVIDIA's scorer gives them.
_RULER_METRICS = {"all": "string_match_all", "part": "string_match_part"}


def describe_checkpoint(summary: dict[str, Any]) -> tuple[str, str, str]:
    """(paradigm, model, data) from the checkpoint's meta.json as recorded in the summary."""
    meta = (summary.get("provenance") or {}).get("checkpoint_meta") or {}
    if isinstance(meta.get("source"), dict):  # an `evalkit import`: a pretrained model, not trained here
        return "pretrained", str(meta.get("model", "?")), f"{meta['source'].get('file_type') or 'GGUF'} import"
    config = meta.get("config") or {}
    model = config.get("model") or {}
    if model.get("path"):
        model_text = Path(model["path"]).name
    elif model:
        model_text = f"{model.get('arch', '?')} {model.get('num_layers', '?')}x{model.get('hidden_size', '?')}"
    else:
        model_text = "?"
    precision = training_precision(meta)
    if precision:
        model_text = f"{model_text} ({precision})"
    data = (config.get("data") or {}).get("source", "?")
    return meta.get("paradigm", "?"), model_text, data


def training_precision(meta: dict[str, Any]) -> str:
    """ "bf16, RoPE fp32" for a run trained under bf16 autocast, "" for an fp32 run (the model text
    as before). A bf16 run from before the rope_precision setting rotated in fp32: transformers'
    fp32 cos/sin promoted q and k (README, GPU section)."""
    config = meta.get("config") or {}
    if config.get("dtype") != "bf16":
        return ""
    rope = (meta.get("precision") or {}).get("rope") or config.get("rope_precision") or "fp32"
    return f"bf16, RoPE {rope}"


def summary_rows(summary: dict[str, Any]) -> list[ResultRow]:
    """Every number of a stored summary as a ResultRow (summaries of earlier versions included:
    a summary without a `benchmark` field is RULER's, as the first ones were)."""
    benchmark = summary.get("benchmark") or "ruler"
    paradigm, model, data = describe_checkpoint(summary)
    described = {"paradigm": paradigm, "model": model, "data": data}
    return [_row(benchmark, row, described) for row in summary.get("rows", [])]


def _row(benchmark: str, row: dict[str, Any], described: dict[str, str]) -> ResultRow:
    if "score" in row and "length" in row:  # RULER's shape: one score per task and length
        return ResultRow(
            benchmark,
            row["run"],
            int(row["step"]),
            row["task"],
            ruler_metric(row["task"]),
            float(row["score"]),
            _float(row.get("stderr")),
            row.get("n"),
            length=int(row["length"]),
            encoding=row_encoding(row),
            **described,
        )
    return ResultRow(
        benchmark,
        row["run"],
        int(row["step"]),
        row["task"],
        row["metric"],
        _float(row.get("value")),
        _float(row.get("stderr")),
        row.get("n"),
        length=row.get("length"),
        requested=row.get("requested"),
        filter=row.get("filter"),
        num_fewshot=row.get("num_fewshot"),
        **described,
    )


def row_encoding(row: dict[str, Any]) -> str:
    from evalkit.ruler.encoding import row_encoding as encoding_of

    return encoding_of(row)


def ruler_metric(task: str) -> str:
    """string_match_all or string_match_part, as RULER scores the task; "score" for a task it lacks."""
    from evalkit.ruler.spec import SPECS

    spec = SPECS.get(task)
    return _RULER_METRICS.get(spec.metric, spec.metric) if spec is not None else "score"


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
