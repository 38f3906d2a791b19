"""`evalkit probe shift|tokens|length`: the paper's BF16 RoPE measurements (Figure 1); `evalkit parity`:
an engine's forward against the trainer's own, served as trained and stock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from evalkit.arglists import parse_list
from evalkit.cli.app import app, probe_app
from evalkit.files import atomic_write_json, atomic_write_text, check_output_dir
from evalkit.lengths import parse_length
from evalkit.store.provenance import command_line, provenance_lines, stamp


def _probe(kind: str, params: dict) -> None:
    """Run `kind` with a command's parsed parameters (click's `ctx.params`); an option left out is the default."""
    from rich.console import Console

    from evalkit.probe import run_probe

    console = Console(stderr=True)
    names = {"n": "n_texts", "size": "lengths" if kind == "length" else "seq_len"}  # run_probe's names
    given = {names.get(name, name): value for name, value in params.items() if value is not None}
    ckpt, out = given.pop("ckpt"), given.pop("out", None)
    out_dir = out or Path("results") / "probe" / Path(ckpt).resolve().name
    result = run_probe(
        kind, ckpt, out_dir, progress=lambda msg: console.print(f"[dim]{msg}[/dim]"), command=command_line(), **given
    )
    typer.echo(Path(result["files"]["markdown"]).read_text())
    console.print("wrote " + ", ".join(result["files"].values()))


_CKPT = typer.Option(
    ...,
    "--ckpt",
    help="A Hugging Face checkpoint directory, or a hub name org/name\\[@revision] "
    "(Llama, Qwen2, Mistral, Gemma 3; sliding windows too).",
)
_TEXTS = typer.Option(None, "--texts", help="Plain text or JSONL with a text field (default: built-in prose).")
_N = typer.Option(None, "--n", help="Texts averaged (default 50).")
_DELTA2 = typer.Option(None, "--delta2", help="Reference shift (default 16).")
_DTYPES = typer.Option(None, "--dtypes", help="Weights' dtypes, comma-separated (default bf16,fp32).")
_ROPE = typer.Option(None, "--rope", help="RoPE precision: cast (as HF/vLLM), fp32 (rotate in FP32), or both.")
_SEED = typer.Option(None, "--seed", help="Seed of the random initialisation.")
_DEVICE = typer.Option(None, "--device", help="auto, cpu or cuda.")
_RANDOM_INIT = typer.Option(False, "--random-init", help="Add the same architecture freshly initialised, in BF16.")
_OUT = typer.Option(None, "--out", help="Output directory (default results/probe/<checkpoint name>).")


def _probe_command(kind: str, summary: str, size_type: type, size: Any, delta1_help: str) -> None:
    """One probe command; they differ in the option that sizes the texts (--seq or --lengths)."""

    def command(
        ctx: typer.Context,
        ckpt: str = _CKPT,
        texts: str = _TEXTS,
        size: str = size,
        n: int = _N,
        delta2: int = _DELTA2,
        delta1: str = typer.Option(None, "--delta1", help=delta1_help),
        dtypes: str = _DTYPES,
        rope: str = _ROPE,
        random_init: bool = _RANDOM_INIT,
        seed: int = _SEED,
        device: str = _DEVICE,
        out: Path = _OUT,
    ) -> None:
        _probe(kind, ctx.params)

    command.__annotations__["size"] = size_type  # typer reads the option's type from it: --seq takes an int
    command.__doc__ = summary
    probe_app.command(kind)(command)


_SEQ = typer.Option(None, "--seq", help="Tokens per text (default 4096, capped at the model's window).")
_probe_command(
    "shift",
    "D(X, Δ1, Δ2) of Eq. 4 for each Δ1: how far attention moves when positions shift (Fig. 1 left).",
    int,
    _SEQ,
    "Shifts Δ1, comma-separated (default the paper's list).",
)
_probe_command(
    "tokens",
    "The difference per key column and the first token's share of it (Fig. 1 middle).",
    int,
    _SEQ,
    "Shifts Δ1 (default 0).",
)
_probe_command(
    "length",
    "D_logit of Eq. 5: the first-token logit difference against length (Fig. 1 right).",
    str,
    typer.Option(None, "--lengths", help="Lengths, comma-separated (default 64..8192 doubling, capped)."),
    "Shift Δ1 (default 0).",
)


@app.command("parity")
def parity_command(
    ckpt: Path = typer.Argument(..., help="A checkpoint evalkit train wrote (runs/<run>/step-<N>)."),
    engines: str = typer.Option("hf", "--engines", help="hf, vllm, or both comma-separated."),
    length: str = typer.Option("1k", "--length", help="Tokens of the built-in prose to compare on (1k = 1024)."),
    out: Path = typer.Option(None, "--out", help="Directory for parity.md and parity.json."),
) -> None:
    """KL divergence and top-1 agreement of each engine's next-token distributions against the
    trainer's forward on the same tokens, per bucket of positions, served as trained and stock."""
    from evalkit.probe.parity import measure, parity_table

    if out is not None:
        check_output_dir(out)
    rows = measure(ckpt, parse_list(engines), parse_length(length))
    table = parity_table(rows)
    typer.echo(table)
    if out is not None:
        made = stamp()
        out.mkdir(parents=True, exist_ok=True)
        heading = [f"# Parity: {ckpt}", "", f"Command: `{made['command']}`", "", *provenance_lines(made)]
        atomic_write_text(out / "parity.md", "\n".join([*heading, "", table, ""]))
        atomic_write_json(out / "parity.json", {"checkpoint": str(ckpt), "provenance": made, "rows": rows})
