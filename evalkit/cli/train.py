"""`evalkit train`: train a model under one attention paradigm."""

from __future__ import annotations

import typer

from evalkit.cli.app import app


@app.command("train")
def train_command(
    config: str = typer.Option("tiny-cpu", "--config", help="A recipe: configs/NAME.yaml or a YAML path."),
    model: str = typer.Option(None, "--model", help="A local HF checkpoint to continue pretraining (model.path)."),
    paradigm: str = typer.Option(
        None,
        "--paradigm",
        help="full, intra_doc, intra_doc_reset, anchor, anchor_tag, intra_doc_interleaved, anchor_interleaved.",
    ),
    seq_len: int = typer.Option(None, "--seq-len", help="Tokens per training window."),
    max_steps: int = typer.Option(None, "--max-steps", help="Optimizer steps."),
    sets: list[str] = typer.Option(None, "--set", help="Any other field, e.g. --set optim.lr=1e-4 (repeatable)."),
    out: str = typer.Option(None, "--out", help="Run directory (default runs/<config>-<paradigm>)."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest complete checkpoint in the run directory."
    ),
    memory_estimate: bool = typer.Option(
        False, "--memory-estimate", help="Print the memory model's per-GPU estimate for this recipe and exit."
    ),
    gpus: int = typer.Option(None, "--gpus", help="GPUs for --memory-estimate (default: WORLD_SIZE, else 1)."),
) -> None:
    """Train a model under one attention paradigm and save checkpoints (runs/<run>/step-<N>/)."""
    from evalkit.train import load_config, train

    overrides = {"model.path": model, "paradigm": paradigm, "seq_len": seq_len, "max_steps": max_steps, "out": out}
    cfg = load_config(config, overrides, sets)
    if memory_estimate:
        import os

        from evalkit.train import memory

        count = gpus if gpus is not None else int(os.environ.get("WORLD_SIZE", "1"))
        typer.echo(memory.report(cfg, memory.architecture(cfg), count))
        return
    run_dir = train(cfg, resume=resume)
    typer.echo(f"checkpoints in {run_dir}")
