"""`evalkit train`: train a model under one attention paradigm."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli.app import app


@app.command("train")
def train_command(
    config: str = typer.Option("tiny-cpu", "--config", help="A recipe: configs/NAME.yaml or a YAML path."),
    model: str = typer.Option(
        None,
        "--model",
        help="An HF checkpoint directory, or a hub name org/name\\[@revision], to continue pretraining (model.path).",
    ),
    paradigm: str = typer.Option(
        None,
        "--paradigm",
        help="full, intra_doc, intra_doc_reset, anchor, anchor_tag, intra_doc_interleaved, anchor_interleaved; "
        "with --inspect, a comma-separated list.",
    ),
    seq_len: int = typer.Option(None, "--seq-len", help="Tokens per training window."),
    max_steps: int = typer.Option(None, "--max-steps", help="Optimizer steps."),
    sets: list[str] = typer.Option(
        None, "--set", help="Any other field, e.g. --set optim.lr=1e-4 or data.window_start=document (repeatable)."
    ),
    out: str = typer.Option(None, "--out", help="Run directory (default runs/<config>-<paradigm>)."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest complete checkpoint in the run directory."
    ),
    memory_estimate: bool = typer.Option(
        False, "--memory-estimate", help="Print the memory model's per-GPU estimate for this recipe and exit."
    ),
    gpus: int = typer.Option(None, "--gpus", help="GPUs for --memory-estimate (default: WORLD_SIZE, else 1)."),
    inspect: str = typer.Option(
        None,
        "--inspect",
        help="Train nothing: write the first window(s) as training would build them into DIR/<paradigm>/ "
        "(window.json: tokens, positions, documents, loss mask; mask.png: the attention mask, as Figure 2).",
        metavar="DIR",
    ),
    inspect_tokens: int = typer.Option(
        256, "--inspect-tokens", help="Tokens of each window the mask covers (mask.png, window.json)."
    ),
    inspect_windows: int = typer.Option(1, "--inspect-windows", help="Windows per paradigm --inspect writes."),
) -> None:
    """Train a model under one attention paradigm and save checkpoints (runs/<run>/step-<N>/).

    Precision: --set dtype=fp32|bf16|bf16_full, rope_precision=fp32|bf16 and grad_accum_dtype=fp32|bf16
    (docs/training.md).

    The paper recipes train in the released code's regime: dtype=bf16_full, rope_precision=bf16,
    grad_accum_dtype=bf16.

    Every paradigm's windows start with the BOS at position 0 (data.window_start=bos).
    """
    from evalkit.arglists import parse_list
    from evalkit.errors import UserError
    from evalkit.train import load_recipe, train

    paradigms = parse_list(paradigm) if paradigm is not None else [None]
    if not paradigms:  # "" would otherwise read as the recipe's paradigm, or with --inspect as every one
        raise UserError("--paradigm is empty: name a paradigm, or leave the option out for the recipe's")
    overrides = {"model.path": model, "seq_len": seq_len, "max_steps": max_steps, "out": out}
    if inspect is not None:
        if resume or memory_estimate:
            raise UserError("--inspect trains nothing: leave out --resume and --memory-estimate")
        from evalkit.train import inspection

        configs = [load_recipe(config, {**overrides, "paradigm": p}, sets) for p in paradigms]
        for path in inspection.inspect_windows(configs, Path(inspect), windows=inspect_windows, tokens=inspect_tokens):
            typer.echo(f"wrote {path}")
        return
    if len(paradigms) > 1:
        raise UserError(f"--paradigm takes one paradigm to train, got {paradigm!r} (a list only with --inspect)")
    cfg = load_recipe(config, {**overrides, "paradigm": paradigms[0]}, sets)
    if memory_estimate:
        from evalkit.arglists import environ_int
        from evalkit.train import memory

        count = gpus if gpus is not None else environ_int("WORLD_SIZE", 1, fix="give --gpus N instead")
        typer.echo(memory.report(cfg, memory.architecture(cfg), count))
        return
    run_dir = train(cfg, resume=resume)
    typer.echo(f"checkpoints in {run_dir}")
