"""What the hf engine's fast decoding step (engines/fast_decode.py) buys, for issue 37's decision.

(a) SmolLM2-135M (the tests' imported checkpoint, tests/real_model.py), fp32, CPU: greedy
    generation of RULER prompts, two engines in this process (fast_decode on and off), calls in
    the order off, on, on, off per repeat; per call the wall time of the generation and the
    engine's own split (stats: prefill seconds, decode seconds), and whether the texts agree.
(b) `evalkit ruler` runs in this process, each into a fresh --out, fast_decode off and on
    alternating: the run's wall time and the time spent in the engine's decoding loop
    (HFEngine._greedy_decode, every step after the prefill), i.e. the decode share of the run.

    PYTHONPATH=. python scripts/measure_fast_decode_share.py
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.real_model locates the imported SmolLM2
TINY = ROOT / "evalkit/checkpoints/tiny-long/tiny-long-full-shipped/step-600"
TINY_TASKS = "niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multivalue,vt,fwe"


def smollm2() -> Path:
    from tests.real_model import imported_smollm2, smollm2_gguf

    gguf, why = smollm2_gguf()
    if gguf is None:
        sys.exit(f"error: {why}")
    return imported_smollm2(gguf)


def part_a(path: Path, cell: str, samples: int, new_tokens: int, batch: int, repeats: int) -> list[str]:
    from evalkit.engines.hf import GenerationStats, HFEngine
    from evalkit.ruler.cache import load_or_generate

    engines = {"off": HFEngine(path, batch_size=batch, fast_decode=False), "on": HFEngine(path, batch_size=batch)}
    assert engines["on"].engine_info()["decode_path"] == "fast", engines["on"].engine_info()["decode_path_reason"]
    task, length = cell.split("@")
    prompts = [
        s.input + s.answer_prefix for s in load_or_generate(task, engines["on"].tokenizer, int(length), samples, 42)
    ]
    for engine in engines.values():  # warm-up, untimed
        engine.generate(prompts[:1], 4)
    lines = [
        "| call | setting | wall s | CPU s | prefill s | decode s | new tokens | decode ms/token-row |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cpu = {"off": 0.0, "on": 0.0}
    totals = {"off": [0.0, 0.0, 0.0], "on": [0.0, 0.0, 0.0]}
    texts: dict[str, list] = {"off": [], "on": []}
    for call, setting in enumerate(["off", "on", "on", "off"] * repeats, 1):
        engine = engines[setting]
        engine.stats = GenerationStats()
        started, cpu_started = time.perf_counter(), time.process_time()
        texts[setting].append(engine.generate(prompts, new_tokens))
        wall = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started  # this process's CPU time: other jobs' load does not inflate it
        cpu[setting] += cpu_s
        s = engine.stats
        for i, value in enumerate((wall, s.prefill_seconds, s.decode_seconds)):
            totals[setting][i] += value
        per = 1000 * s.decode_seconds / max(s.new_tokens, 1)
        lines.append(
            f"| {call} | {setting} | {wall:.1f} | {cpu_s:.1f} | {s.prefill_seconds:.1f} | {s.decode_seconds:.1f} "
            f"| {s.new_tokens} | {per:.0f} |"
        )
        print(lines[-1], flush=True)
    off, on = totals["off"], totals["on"]
    lines.append(
        f"| sum | on/off | {on[0]:.1f} / {off[0]:.1f} = {on[0] / off[0]:.3f} "
        f"| {cpu['on']:.1f} / {cpu['off']:.1f} = {cpu['on'] / cpu['off']:.3f} | {on[1]:.1f} / {off[1]:.1f} "
        f"| {on[2]:.1f} / {off[2]:.1f} = {on[2] / off[2]:.3f} | | |"
    )
    same = all(t == texts["off"][0] for t in texts["off"] + texts["on"])
    lines.append(
        f"\ntexts of all {4 * repeats} calls equal: {same}; cell {cell}, {samples} samples, batch {batch}, "
        f"max {new_tokens} new tokens"
    )
    return lines


def part_b(label: str, args: list[str], runs: int) -> list[str]:
    from evalkit.cli.app import app
    from evalkit.engines.hf import HFEngine

    decode = [0.0]
    original = HFEngine._greedy_decode

    def timed(self, *a, **k):
        started = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            decode[0] += time.perf_counter() - started

    HFEngine._greedy_decode = timed
    lines = [f"\n{label}: evalkit ruler {' '.join(args)} --out <fresh> [--engine-arg fast_decode=false]\n"]
    lines += ["| run | fast_decode | wall s | decode s | decode share |", "|---|---|---|---|---|"]
    walls = {"off": 0.0, "on": 0.0}
    try:
        # off first: the first run also writes the sample cache, a cost charged against fast_decode=false
        for run, setting in enumerate(["off", "on", "on", "off"][: 2 * runs], 1):
            extra = ["--engine-arg", "fast_decode=false"] if setting == "off" else []
            with tempfile.TemporaryDirectory() as out:
                decode[0] = 0.0
                started = time.perf_counter()
                app(["ruler", *args, *extra, "--out", out], standalone_mode=False)
                wall = time.perf_counter() - started
            walls[setting] += wall
            lines.append(f"| {run} | {setting} | {wall:.1f} | {decode[0]:.1f} | {decode[0] / wall:.2f} |")
            print(lines[-1], flush=True)
    finally:
        HFEngine._greedy_decode = original
    lines.append(f"| sum | on/off | {walls['on']:.1f} / {walls['off']:.1f} = {walls['on'] / walls['off']:.3f} | | |")
    return lines


def warm_up(path: Path) -> None:
    """Imports and the SmolLM2 RULER samples made before any timed run (untimed)."""
    from evalkit.checkpoint_check import load_tokenizer
    from evalkit.cli.app import app
    from evalkit.ruler.cache import load_or_generate

    with tempfile.TemporaryDirectory() as out:
        app(
            ["ruler", "--ckpts", str(TINY), "--lengths", "1k", "--tasks", "vt", "--samples", "1", "--out", out],
            standalone_mode=False,
        )
    tokenizer = load_tokenizer(path)
    for cell in ("niah_single_1@2048", "vt@2048"):
        task, length = cell.split("@")
        load_or_generate(task, tokenizer, int(length), 4, 42)


def header() -> list[str]:
    import torch
    import transformers

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line), "?")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return [
        f"machine: nproc {os.cpu_count()}, {model}; Python {platform.python_version()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}",
        f"evalkit at {commit}{' (UNCOMMITTED CHANGES)' if dirty else ' (clean tree)'}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="niah_single_1@2048")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4, help="(a)'s batch")
    parser.add_argument("--tiny-ruler", default=f"--lengths 1k --tasks {TINY_TASKS} --samples 5")
    parser.add_argument("--smollm2-ruler", default="--lengths 2k --tasks niah_single_1,vt --samples 4")
    parser.add_argument("--skip-a", action="store_true")
    parser.add_argument("--only-a", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args()

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    lines = header()
    load = [f"load average before: {os.getloadavg()}"]
    print("\n".join(lines + load), flush=True)
    path = smollm2()
    warm_up(path)
    if not args.skip_a:
        lines += ["\n(a) SmolLM2-135M fp32, generate() on RULER prompts\n"]
        lines += part_a(path, args.cell, args.samples, args.new_tokens, args.batch_size, args.repeats)
    if args.only_a:
        print("\n" + "\n".join(lines))
        return
    lines += part_b(
        "(b) tiny-long-full-shipped/step-600",
        ["--ckpts", str(TINY), *args.tiny_ruler.split()],
        2,
    )  # off, on, on, off
    lines += part_b("(b) SmolLM2-135M", ["--ckpts", str(path), *args.smollm2_ruler.split()], 1)  # off, on
    load.append(f"load average after: {os.getloadavg()}")
    print("\n" + "\n".join(lines[:2] + load + lines[2:]))


if __name__ == "__main__":
    main()
