"""RULER generation CPU time on a shipped tiny checkpoint, the hf engine's decoding through
transformers (fast_decode=false, before) against its fast step (after), in one process.

Per cell: the generation call's CPU time (time.process_time, one torch thread) for each
setting, run in the order before, after, after, before so that drift in the machine's load
falls on both alike; the mean of the two runs of each is reported. Predictions are compared in
the same run: the four answers of a cell must be equal, and the logits of every decoding step
of the two settings equal bit for bit. Both engines are loaded and warmed up (one call each)
before any cell is timed.

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/measure_fast_decode.py
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "evalkit/checkpoints/tiny-long/tiny-long-anchor-shipped/step-600"
PROFILE_CELLS = "niah_single_1@1024,niah_single_1@2048,vt@1024,vt@2048"


def recorded_steps(engine) -> list:
    """The logits of every decoding step `engine` takes from now on (cleared by the caller)."""
    steps: list = []
    original = engine._decode_step

    def recording(state, next_tokens):
        state = original(state, next_tokens)
        steps.append(state.logits.clone())
        return state

    engine._decode_step = recording
    return steps


def measure_cell(engines: dict, steps: dict, task: str, length: int, samples: int) -> dict:
    import torch

    from evalkit.ruler.cache import load_or_generate
    from evalkit.ruler.spec import task_spec

    cell = load_or_generate(task, engines["before"].tokenizer, length, samples, 42)
    prompts = [s.input + s.answer_prefix for s in cell]
    budget = task_spec(task).max_new_tokens
    seconds = {"before": 0.0, "after": 0.0}
    answers, logits = [], {}
    for setting in ("before", "after", "after", "before"):
        steps[setting].clear()
        started = time.process_time()
        answers.append(engines[setting].generate(prompts, budget))
        seconds[setting] += (time.process_time() - started) / 2
        logits[setting] = list(steps[setting])
    equal_logits = len(logits["before"]) == len(logits["after"]) and all(
        torch.equal(a, b) for a, b in zip(logits["before"], logits["after"])
    )
    return {
        "cell": f"{task} @ {length}",
        "before": seconds["before"],
        "after": seconds["after"],
        "texts equal": all(a == answers[0] for a in answers),
        "step logits bit-equal": equal_logits,
        "steps": len(logits["after"]),
    }


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line), "?")
    return f"{os.cpu_count()} cores ({model}), {platform.python_version()}"


def git_commit() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return commit.stdout.strip() + (" (uncommitted changes)" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=PROFILE_CELLS, help="task@length,... (default: the profile's four)")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    import torch
    import transformers

    from evalkit.engines.hf import HFEngine

    torch.set_num_threads(1)
    engines = {
        "before": HFEngine(CHECKPOINT, batch_size=args.batch_size, fast_decode=False),
        "after": HFEngine(CHECKPOINT, batch_size=args.batch_size),
    }
    assert engines["before"].engine_info()["decode_path"] == "transformers"
    assert engines["after"].engine_info()["decode_path"] == "fast"
    warm_up = [[engines["before"].tokenizer.bos_token_id, *range(100, 400)]] * 2
    for engine in engines.values():
        engine.generate(warm_up, 16)
    steps = {setting: recorded_steps(engine) for setting, engine in engines.items()}
    load_before = os.getloadavg()
    rows = []
    for cell in args.cells.split(","):
        task, length = cell.split("@")
        rows.append(measure_cell(engines, steps, task, int(length), args.samples))
    load_after = os.getloadavg()

    print(f"machine: {machine()}; torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"evalkit at {git_commit()}; checkpoint {CHECKPOINT.relative_to(ROOT)}")
    print(f"batch {args.batch_size}, {args.samples} samples per cell, torch threads {torch.get_num_threads()}")
    print(f"load average (1, 5, 15 min) before: {load_before}, after: {load_after}")
    print()
    print("| cell | before CPU s | after CPU s | after/before | texts equal | step logits bit-equal | steps |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['cell']} | {r['before']:.2f} | {r['after']:.2f} | {r['after'] / r['before']:.2f} "
            f"| {r['texts equal']} | {r['step logits bit-equal']} | {r['steps']} |"
        )
    before, after = sum(r["before"] for r in rows), sum(r["after"] for r in rows)
    same = all(r["texts equal"] and r["step logits bit-equal"] for r in rows)
    print(f"| all {len(rows)} cells | {before:.2f} | {after:.2f} | {after / before:.2f} | {same} | {same} | |")


if __name__ == "__main__":
    main()
