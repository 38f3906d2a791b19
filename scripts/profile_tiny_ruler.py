"""Where RULER's time goes on a shipped tiny checkpoint: CPU seconds by stage and by kind of work.

CPU time of this process on one torch thread (cProfile with time.process_time as its clock), so
that other work on a shared machine does not inflate it. Per cell: the tokenizer load, the engine
set-up, the cached samples' read, then generation; inside generation, SDPA, the linear layers and
everything else the model's forward does (transformers' Python, norms, rotary, masks, cache),
apart from evalkit's own decoding loop.

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/profile_tiny_ruler.py --lengths 1024,2048
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

CHECKPOINT = Path(__file__).resolve().parent.parent / "evalkit/checkpoints/tiny-long/tiny-long-anchor-shipped/step-600"


def own_seconds(stats: pstats.Stats, needle: str) -> float:
    """Self time of every function whose name contains `needle`."""
    return sum(entry[2] for (_, _, name), entry in stats.stats.items() if needle in name)


def cumulative_seconds(stats: pstats.Stats, file_part: str, name: str) -> float:
    return sum(entry[3] for (path, _, fn), entry in stats.stats.items() if file_part in path and fn == name)


def profile_cell(task: str, length: int, samples: int, batch_size: int) -> dict:
    import torch
    from transformers import AutoTokenizer

    from evalkit.engines.hf import HFEngine
    from evalkit.ruler.cache import load_or_generate
    from evalkit.ruler.spec import task_spec

    torch.set_num_threads(1)
    load_or_generate(task, AutoTokenizer.from_pretrained(CHECKPOINT), length, samples, 42)  # cached, untimed
    clock = time.process_time
    t0 = clock()
    tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT, local_files_only=True)
    t1 = clock()
    engine = HFEngine(CHECKPOINT, batch_size=batch_size)
    t2 = clock()
    cell = load_or_generate(task, tokenizer, length, samples, 42)
    t3 = clock()
    prompts = [s.input + s.answer_prefix for s in cell]
    profiler = cProfile.Profile(clock)
    profiler.enable()
    engine.generate(prompts, task_spec(task).max_new_tokens)
    profiler.disable()
    t4 = clock()
    stats = pstats.Stats(profiler)
    generate = t4 - t3
    forward = cumulative_seconds(stats, "modeling_llama", "forward") and max(
        entry[3] for (path, _, fn), entry in stats.stats.items() if "modeling_llama" in path and fn == "forward"
    )
    sdpa = own_seconds(stats, "scaled_dot_product_attention")
    linear = own_seconds(stats, "torch._C._nn.linear")
    return {
        "task": task,
        "length": length,
        "samples": samples,
        "tokenizer load": t1 - t0,
        "engine set-up": t2 - t1,
        "cached samples": t3 - t2,
        "generate": generate,
        "  SDPA": sdpa,
        "  linear layers": linear,
        "  rest of the model's forward": forward - sdpa - linear,
        "  outside the forward": generate - forward,
        "new tokens": engine.stats.new_tokens,
        "prompt tokens computed": engine.stats.prefill_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="niah_single_1")
    parser.add_argument("--lengths", default="1024,2048")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    cells = [
        profile_cell(task, int(length), args.samples, args.batch_size)
        for task in args.tasks.split(",")
        for length in args.lengths.split(",")
    ]
    keys = list(cells[0])
    print("| " + " | ".join(["CPU s", *[f"{c['task']} @ {c['length']}" for c in cells]]) + " |")
    print("|" + "---|" * (len(cells) + 1))
    for key in keys[3:]:
        values = [f"{c[key]:.2f}" if isinstance(c[key], float) else str(c[key]) for c in cells]
        print(f"| {key} | " + " | ".join(values) + " |")


if __name__ == "__main__":
    main()
