"""`evalkit export` and `evalkit import`: checkpoints in and out."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli.app import app
from evalkit.errors import UserError
from evalkit.models.precision import check_dtype, torch_dtype


@app.command("export")
def export_command(
    ckpt: str = typer.Argument(
        ...,
        help="A checkpoint directory written by `evalkit train` (runs/<run>/step-<N>), or a hub name "
        "org/name\\[@revision] (from the Hugging Face cache).",
    ),
    dest: str = typer.Argument(
        ..., help="The directory to write: new or empty (or an earlier export, with --overwrite)."
    ),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 or fp32."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DEST if it holds an evalkit checkpoint."),
) -> None:
    """Copy a checkpoint to ship or share: weights in bf16 safetensors, no optimizer state."""
    from evalkit.train.checkpoint import export_checkpoint

    check_dtype(dtype, ("bf16", "fp32"))
    echo_size(export_checkpoint(ckpt, destination(dest), torch_dtype(dtype), overwrite=overwrite))


@app.command("import")
def import_command(
    source: Path = typer.Argument(
        ..., help="A GGUF model file (llama.cpp's format), e.g. SmolLM2-135M-Instruct.Q4_1.gguf."
    ),
    dest: str = typer.Argument(
        ..., help="The checkpoint directory to write (must not exist, or hold an earlier import)."
    ),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 or fp32 (fp32 keeps the dequantized weights exactly)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DEST if it holds an earlier `evalkit import`."),
) -> None:
    """Import a GGUF model as a plain HF checkpoint (dequantized safetensors, tokenizer, meta.json)."""
    from evalkit.models.gguf_import import import_gguf

    echo_size(import_gguf(source, destination(dest), dtype, overwrite=overwrite))


def destination(dest: str) -> Path:
    """DEST as a path; an empty one (which Path reads as the working directory) is refused."""
    if not dest.strip():
        raise UserError("DEST is empty: name a new or empty directory to write")
    return Path(dest)


def echo_size(checkpoint: Path) -> None:
    size = sum(f.stat().st_size for f in checkpoint.iterdir())
    typer.echo(f"{checkpoint}: {size / 2**20:.1f} MiB")
