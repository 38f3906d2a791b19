"""`evalkit quickstart`: the whole study end to end on a CPU."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.attention.paradigms import parse_paradigms
from evalkit.cli.app import app
from evalkit.errors import UserError
from evalkit.lengths import parse_lengths
from evalkit.quickstart import QUICK_PARADIGMS, QUICK_RECIPE, QUICK_STEPS, STUDY, TRAIN_BENCH_SEQ


@app.command("quickstart")
def quickstart_command(
    ctx: typer.Context,
    out: Path = typer.Option(Path("results/quickstart"), "--out", help="Where results, leaderboard and plots go."),
    runs_dir: Path = typer.Option(Path("runs/quickstart"), "--runs", help="Where the training runs go."),
    recipe: str = typer.Option(QUICK_RECIPE, "--recipe", help="The recipe trained under each paradigm."),
    paradigms: str = typer.Option(",".join(QUICK_PARADIGMS), "--paradigms", help="Paradigms to train and compare."),
    max_steps: int = typer.Option(
        QUICK_STEPS, "--max-steps", help="Training steps per paradigm of its own runs (0: the recipe's own)."
    ),
    train: bool = typer.Option(
        False, "--train", help="Also train short runs of its own and evaluate them (always when no runs are shipped)."
    ),
    shipped: bool = typer.Option(
        True, "--shipped/--no-shipped", help="Evaluate the recipe's shipped runs (evalkit/checkpoints/<recipe>/)."
    ),
    sets: list[str] = typer.Option(None, "--set", help="Recipe overrides, e.g. --set seq_len=256."),
    samples: int = typer.Option(5, "--samples", help="RULER samples per task and length."),
    lengths: str = typer.Option(
        None,
        "--lengths",
        help="RULER and perplexity lengths (default: half the training length and the training length).",
    ),
    last: int = typer.Option(2, "--last", help="Checkpoints per run evaluated and averaged."),
    general: bool = typer.Option(False, "--general", help="Also run the general-task fixtures."),
    general_limit: int = typer.Option(None, "--general-limit", help="Questions per fixture task (default: all)."),
    probe: str = typer.Option(
        "auto",
        "--probe",
        help="Model of the BF16 probe: auto (SmolLM2 when installed, else the tiny base), tiny, none, "
        "or a checkpoint directory or hub name org/name\\[@revision].",
    ),
    train_bench: bool = typer.Option(
        True, "--train-bench/--no-train-bench", help="Time a training step under full and anchor attention."
    ),
    bench_seq: int = typer.Option(TRAIN_BENCH_SEQ, "--bench-seq", help="Window length of that timing, in tokens."),
    study: Path = typer.Option(
        STUDY, "--study", help="The study whose stored results claim (c) reads (results/study/)."
    ),
) -> None:
    """The paper's claims on a CPU: the BF16 probe, training-step cost, RULER per paradigm, RULER beside perplexity."""
    from evalkit.quickstart import QuickstartPlan, run_quickstart

    chosen = tuple(p.value for p in parse_paradigms(paradigms))
    if max_steps < 0:
        raise UserError(f"--max-steps must be at least 1 (or 0: the recipe's own steps), got {max_steps}")
    # The options are the plan's fields, by name; these four are parsed or defaulted first.
    parsed = {
        "paradigms": chosen,
        "max_steps": max_steps or None,
        "sets": list(sets or []),
        "lengths": parse_lengths(lengths) if lengths is not None else None,
    }
    run_quickstart(QuickstartPlan(**{**ctx.params, **parsed}))
