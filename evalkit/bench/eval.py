"""`evalkit bench eval`: RULER evaluation throughput of each engine on one checkpoint.

Every engine answers the same cached samples (generated once with the checkpoint's tokenizer,
untimed), one `generate` call per task and length as `evalkit ruler` makes them. Timed: that
call, wall clock. Reported beside it: where the hf engine's time went (prefill, decode), how
many prompt tokens it computed (the rest came from prefixes shared with the sample before), the
RULER score, and how many predictions equal the first engine's, so a speed-up that changed an
answer shows in the same table.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import UserError

# Engine variants a user can time: a name, the engine, and its settings.
ENGINE_VARIANTS: dict[str, tuple[str, dict]] = {
    "hf": ("hf", {}),
    "hf-padded": ("hf", {"prefill": "padded"}),  # the padded-batch prefill, nothing shared
    "vllm": ("vllm", {}),
    "vllm-no-prefix-cache": ("vllm", {"enable_prefix_caching": False}),
}


@dataclass
class EvalBenchRow:
    engine: str
    task: str
    length: int
    samples: int
    seconds: float
    prompt_tokens: int
    score: float
    same_as_first: int  # predictions identical to the first engine's on the same samples
    prefill_seconds: float | None = None  # hf only: vLLM interleaves prefill and decode
    decode_seconds: float | None = None
    computed_tokens: int | None = None  # prompt tokens run through the model (hf only)
    new_tokens: int | None = None
    skipped: str = ""  # why the task has no samples here (qa without its files), when it has none

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


def parse_engines(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in ENGINE_VARIANTS]
    if unknown or not names:
        raise UserError(f"unknown engine variant(s) {', '.join(unknown) or '(none given)'}; "
                        f"choose from: {', '.join(ENGINE_VARIANTS)}")  # fmt: skip
    if len(set(names)) != len(names):
        raise UserError(f"--engines lists a variant twice: {text}")
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
    seed: int = 42,
    progress: Callable[[str], None] = lambda _msg: None,
) -> list[EvalBenchRow]:
    from evalkit.engines import get_engine
    from evalkit.ruler.errors import TaskSkipped

    rows: list[EvalBenchRow] = []
    first_predictions: dict[tuple[str, int], list[str]] = {}
    for name in engines:
        engine_name, settings = ENGINE_VARIANTS[name]
        progress(f"starting {name}")
        engine = get_engine(engine_name, checkpoint, batch_size=batch_size, **({"dtype": dtype} if dtype else {}),
                            **settings)  # fmt: skip
        try:
            for length in lengths:
                for task in tasks:
                    progress(f"{name}: {task} at {length}")
                    try:
                        row, predictions = _time_cell(engine, name, task, length, num_samples, seed)
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


def _time_cell(engine, name: str, task: str, length: int, num_samples: int, seed: int):
    from evalkit.ruler.cache import load_or_generate
    from evalkit.ruler.metrics import score
    from evalkit.ruler.spec import task_spec

    samples = load_or_generate(task, engine.tokenizer, length, num_samples, seed)
    prompts = [sample.input + sample.answer_prefix for sample in samples]
    stats = _fresh_stats(engine)
    start = time.perf_counter()
    predictions = engine.generate(prompts, task_spec(task).max_new_tokens)
    seconds = time.perf_counter() - start
    row = EvalBenchRow(
        engine=name, task=task, length=length, samples=len(samples), seconds=seconds,
        prompt_tokens=sum(engine.count_tokens(p) for p in prompts),
        score=score(task, predictions, [sample.outputs for sample in samples]), same_as_first=0,
    )  # fmt: skip
    if stats is not None:
        row.prefill_seconds, row.decode_seconds = stats.prefill_seconds, stats.decode_seconds
        row.computed_tokens, row.new_tokens = stats.prefill_tokens, stats.new_tokens
    return row, predictions


def _fresh_stats(engine):
    """The engine's counters, zeroed, where it keeps them (the hf engine); else None."""
    if not hasattr(engine, "stats"):
        return None
    engine.stats = type(engine.stats)()
    return engine.stats


def to_markdown(rows: Sequence[EvalBenchRow]) -> str:
    first_engine = rows[0].engine if rows else ""
    skipped = sorted({f"{r.task} at {r.length} ({r.skipped})" for r in rows if r.skipped})
    rows = [r for r in rows if not r.skipped]
    baseline = {(r.task, r.length): r.seconds for r in rows if r.engine == first_engine}
    lines = [
        (
            f"| engine | task | length | samples | seconds | samples/s | speed vs {first_engine} | prefill / decode s "
            "| prompt tokens computed | new tokens | score | predictions = first |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        split = "-" if r.prefill_seconds is None else f"{r.prefill_seconds:.0f} / {r.decode_seconds:.0f}"
        computed = (
            "-" if r.computed_tokens is None else f"{r.computed_tokens / r.prompt_tokens:.0%} of {r.prompt_tokens:,}"
        )
        new = "-" if r.new_tokens is None else f"{r.new_tokens:,}"
        lines.append(
            f"| {r.engine} | {r.task} | {r.length} | {r.samples} | {r.seconds:.0f} | {r.samples_per_second:.3f} "
            f"| {baseline[r.task, r.length] / r.seconds:.2f}x | {split} | {computed} | {new} | {r.score:.1f} "
            f"| {r.same_as_first}/{r.samples} |"
        )
    lines.append(_totals_line(rows, first_engine))
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
    ]
    return f"\nTotal wall time per engine (speed vs {first_engine}): " + ", ".join(parts) + "."
