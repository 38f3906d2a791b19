"""The tiny study on a lent GPU, as one prepared command: train, check, export checkpoints to ship.

    PYTHONPATH=. python scripts/gpu_study.py --out $OUT/study [--minutes 6] [--set KEY=VALUE ...]

1. Trains the recipe (default tiny-gpu) under each paradigm (default full, intra_doc, anchor),
   all at once, one process each on the same GPU: the models are tiny, so the GPU is shared
   and each process feeds its own windows from its own CPU core. Every run stops at its
   max_steps or when --minutes is up (counted from the script's start, the FlexAttention smoke
   test included, so that the whole study fits one 10-minute call), whichever comes first (killed, so the periodic
   checkpoints of the recipe are what remains; a later `evalkit train --resume` continues it).
2. Measures each run's last checkpoint with evalkit.train.retrieval_check (answer digits vs the
   first-statement control): whether the study can be meaningful before RULER is spent on it.
3. Exports the last --keep checkpoints of each run as bf16 safetensors without trainer state,
   one archive per run, OUT/<run>.tar holding <run>/step-N/ (unpack into checkpoints/ of the
   repository to ship them: the tiny-gpu recipe keeps two checkpoints of three paradigms under
   20 MB), and writes OUT/README.md: the command, the last losses, the retrieval and copy checks and the
   sizes. OUT holds only these few files (a lent machine returns at most 8, 16 MiB each); the
   runs themselves, trainer states included, go to --runs-dir.

Needs torch with CUDA, transformers, tokenizers, safetensors, pyyaml, rich (all on the lent
machine's image); no evalkit install, and nothing it imports needs datasets, lm-eval, wonderwords,
vLLM or flash-attn (tests/train/test_export.py runs it with those blocked). On a CPU it runs too
(for tests: --set model.attention=blocked).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalkit.files import atomic_write_text  # noqa: E402 - needs ROOT on sys.path
from evalkit.store.provenance import provenance_lines  # noqa: E402 - needs ROOT on sys.path
from evalkit.train import checkpoint as ckpt  # noqa: E402 - needs ROOT on sys.path
from evalkit.train import load_recipe  # noqa: E402 - needs ROOT on sys.path
from evalkit.train.retrieval_check import check_retrieval, retrieval_kind  # noqa: E402 - needs ROOT on sys.path


def _child(args: argparse.Namespace) -> int:
    """One paradigm's run, in this process (the parent starts one per paradigm)."""
    from evalkit.train import train

    config = load_recipe(args.recipe, {"paradigm": args.one, "out": args.run_dir}, args.set)
    train(config, resume=True, show_progress=False)
    return 0


def choose_attention(args: argparse.Namespace, runs_dir: Path) -> str:
    """The attention the runs use: the recipe's, unless FlexAttention fails a 2-step training smoke
    test on this GPU (it has never trained here before), then the blocked implementation."""
    from evalkit.train import train

    config = load_recipe(args.recipe, {}, args.set)
    if not torch.cuda.is_available() or config.model.attention not in ("auto", "flex"):
        return config.model.attention
    smoke = ["max_steps=2", "windows_per_step=2", "micro_batch=2", "checkpoint.every=1000", "checkpoint.final_count=1"]
    smoke_dir = runs_dir / "smoke-flex"
    shutil.rmtree(smoke_dir, ignore_errors=True)  # a rerun's old smoke checkpoints would refuse to train
    config = load_recipe(args.recipe, {"paradigm": "anchor", "out": str(smoke_dir)}, [*args.set, *smoke])
    try:
        train(config, show_progress=False)
        return config.model.attention
    except Exception as err:  # noqa: BLE001 -- any failure of the untried path: the study still runs, on the other one
        print(
            f"FlexAttention failed the smoke test ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
            "training with model.attention=blocked",
            flush=True,
        )
        args.set.append("model.attention=blocked")
        return "blocked (flex failed its smoke test)"


def train_all(args: argparse.Namespace, runs_dir: Path, deadline: float) -> dict[str, dict]:
    """Start every paradigm's run, wait until each ends or the deadline (time.monotonic());
    {paradigm: outcome}."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("OMP_NUM_THREADS", "1")  # one core each: the data stream is the CPU's share
    processes = {}
    for paradigm in args.paradigms:
        run_dir = runs_dir / f"{args.recipe}-{paradigm}"
        command = [sys.executable, __file__, "--one", paradigm, "--run-dir", str(run_dir), "--recipe", args.recipe]
        command += [item for pair in (("--set", s) for s in args.set) for item in pair]
        log = (runs_dir / f"{paradigm}.log").open("w")
        processes[paradigm] = (subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), run_dir, log)
    outcome = {}
    for paradigm, (process, run_dir, log) in processes.items():
        try:
            code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
            state = "finished" if code == 0 else f"failed (exit {code}, see {paradigm}.log)"
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            state = f"stopped at the {args.minutes:g}-minute limit"
        log.close()
        outcome[paradigm] = {"run_dir": run_dir, "state": state}
    return outcome


def last_metrics(run_dir: Path) -> dict:
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if not lines:
        return {}
    tail = lines[-20:]
    return {
        "step": lines[-1]["step"],
        "loss": sum(r["loss"] for r in tail) / len(tail),
        "tokens_per_s": sum(r["tokens_per_s"] for r in tail) / len(tail),
        "tokens_seen": lines[-1]["tokens_seen"],
    }


def export_archive(run_dir: Path, checkpoints: list[tuple[int, Path]], export_dir: Path, out: Path) -> int:
    """The checkpoints in bf16 without trainer state, archived as OUT/<run>.tar; returns their bytes."""
    import tarfile

    # export_dir is the study's own scratch: a rerun replaces the exports of the run before.
    exported = [
        ckpt.export_checkpoint(path, export_dir / run_dir.name / path.name, overwrite=True) for _, path in checkpoints
    ]
    archive = out / f"{run_dir.name}.tar"
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w") as tar:
        for path in exported:
            tar.add(path, arcname=f"{run_dir.name}/{path.name}")
    partial.replace(archive)
    return sum(f.stat().st_size for path in exported for f in path.iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where README.md and one checkpoint archive per run go")
    parser.add_argument("--runs-dir", type=Path, help="where the training runs go (default OUT/runs)")
    parser.add_argument("--recipe", default="tiny-gpu")
    parser.add_argument("--paradigms", default="full,intra_doc,anchor")
    parser.add_argument(
        "--minutes",
        type=float,
        default=6.0,
        help="wall-clock limit of the smoke test and training, from the start (the checks and export follow)",
    )
    parser.add_argument("--keep", type=int, default=2, help="checkpoints per run to export")
    parser.add_argument("--documents", type=int, default=200, help="held-out documents of the retrieval check")
    parser.add_argument("--set", action="append", default=[], help="recipe override KEY=VALUE (repeatable)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        return _child(args)
    if args.out is None:
        parser.error("--out is required")
    args.paradigms = [p.strip() for p in args.paradigms.split(",") if p.strip()]
    config = load_recipe(args.recipe, {}, args.set)  # a bad recipe or --set fails here, before any work
    runs_dir = args.runs_dir or args.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # The limit counts from the start, the smoke test's compile included: with the checks and the
    # export after it (well under a minute for tiny models), the study fits one 10-minute device call.
    deadline = time.monotonic() + args.minutes * 60
    attention = choose_attention(args, runs_dir)
    outcome = train_all(args, runs_dir, deadline)
    trained_s = time.perf_counter() - started

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows, total_bytes = [], 0
    for paradigm, result in outcome.items():
        checkpoints = ckpt.complete_checkpoints(result["run_dir"])
        metrics = last_metrics(result["run_dir"])
        check, copy = {}, {}
        if checkpoints:
            kind = retrieval_kind(config.data.retrieval_phrasing)  # checked in the wording the run trained on
            check = check_retrieval(checkpoints[-1][1], config.seq_len, args.documents, device, kind=kind)
            copy = check_retrieval(checkpoints[-1][1], config.seq_len, args.documents, device, kind="copy")
        check.update({f"copy_{key}": value for key, value in copy.items()})
        exported = [step for step, _ in checkpoints[-args.keep :]]
        if exported:
            total_bytes += export_archive(result["run_dir"], checkpoints[-args.keep :], runs_dir / "export", args.out)
        rows.append((paradigm, result["state"], metrics, check, exported))
        print(paradigm, result["state"], metrics, check, exported, flush=True)

    lines = [
        f"# {args.recipe} under {', '.join(args.paradigms)}",
        "",
        f"Command: `python {' '.join(['scripts/gpu_study.py', *(argv if argv is not None else sys.argv[1:])])}`",
        f"Training stage: {trained_s:.0f} s (limit {args.minutes:g} min), runs at once on one device; "
        f"attention {attention}.",
        "",
        "| paradigm | training | last step | tokens | loss (last 20 steps) | tokens/s | answer acc | control acc | "
        "answer NLL | copy acc | copy control | exported steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for paradigm, state, metrics, check, exported in rows:
        lines.append(
            f"| {paradigm} | {state} | {metrics.get('step', '-')} | {metrics.get('tokens_seen', 0) / 1e6:.1f}M | "
            f"{metrics.get('loss', float('nan')):.3f} | {metrics.get('tokens_per_s', 0):,.0f} | "
            f"{check.get('answer_accuracy', float('nan')):.3f} | {check.get('fact_accuracy', float('nan')):.3f} | "
            f"{check.get('answer_nll', float('nan')):.3f} | {check.get('copy_answer_accuracy', float('nan')):.3f} | "
            f"{check.get('copy_fact_accuracy', float('nan')):.3f} | {', '.join(map(str, exported)) or '-'} |"
        )
    archives = sum(1 for row in rows if row[4])
    exported_line = (
        f"Exported: {total_bytes / 2**20:.1f} MiB of bf16 checkpoints in {archives} archives "
        "(`tar -xf RUN.tar -C checkpoints/`)."
    )
    lines += ["", exported_line, "", *provenance_lines()]
    atomic_write_text(args.out / "README.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = [p for p, state, *_ in rows if state.startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
