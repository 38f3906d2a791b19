"""Optimizer-step time of a recipe's model under each paradigm vs full: the quickstart's claim (b)
and `python -m perf train`.

One window per step (B=1), the same document stream for every paradigm, one untimed warm-up
step, then the median of the timed steps. Window building is not timed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from evalkit.attention import Paradigm


@dataclass
class TrainBenchRow:
    seq_len: int
    paradigm: str
    step_seconds: float
    tokens_per_s: float
    ratio_to_full: float
    docs_per_window: float
    ideal_ratio: float  # sum(d_i^2) / S^2 of the attention work, averaged over the timed windows


def run(
    seq_lens: list[int],
    paradigms: list[Paradigm],
    *,
    recipe: str = "tiny-cpu",
    sets: list[str] | None = None,
    steps: int = 3,
    progress: Callable[[str], None] = lambda _msg: None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[TrainBenchRow]:
    """Rows per length and paradigm, full first. `clock` times a step: wall clock by default;
    the quickstart passes the process's CPU time (on one thread), which others' work on a shared
    machine does not inflate."""
    from evalkit.train import load_recipe
    from evalkit.train.distributed import DistContext
    from evalkit.train.loop import autocast_context, build_stream, build_training, optimizer_step
    from evalkit.train.model import recipe_tokenizer

    ctx = DistContext()
    rows: list[TrainBenchRow] = []
    for seq_len in seq_lens:
        full_time = None
        for paradigm in [Paradigm.FULL, *[p for p in paradigms if p is not Paradigm.FULL]]:
            progress(f"S={seq_len}: {paradigm}")
            overrides = {"paradigm": paradigm.value, "seq_len": seq_len, "max_steps": steps + 1}
            config = load_recipe(
                recipe,
                overrides,
                ["windows_per_step=1", "micro_batch=1", f"model.max_position_embeddings={seq_len}", *(sets or [])],
            )
            tokenizer = recipe_tokenizer(config)
            _, stream = build_stream(config, tokenizer)
            model, optimizer, _ = build_training(config, tokenizer, ctx)
            windows = [[stream.next_window()] for _ in range(steps + 1)]
            autocast = autocast_context(config, ctx.device)
            times = []
            for i, batch in enumerate(windows):
                start = clock()
                optimizer_step(model, optimizer, batch, config, ctx, autocast, step=i + 1)
                if i:  # the first step warms up allocators and kernels
                    times.append(clock() - start)
            seconds = statistics.median(times)
            full_time = full_time or seconds
            timed = [w[0] for w in windows[1:]]
            docs = statistics.mean(len(w.doc_lengths) for w in timed)
            work = [sum(n * n for n in w.doc_lengths) / seq_len**2 for w in timed]  # Σd²/S² per window
            ideal = statistics.mean(work) if paradigm.masks_documents else 1.0
            rows.append(
                TrainBenchRow(seq_len, paradigm.value, seconds, seq_len / seconds, seconds / full_time, docs, ideal)
            )
    return rows
