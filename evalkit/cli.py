"""The `evalkit` command: thin parsing, one function call per command.

Heavy libraries (transformers, lm-eval, vLLM) are imported inside the commands that need them,
so `evalkit --help` stays fast and never imports vllm or flash-attn.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from evalkit.errors import UserError
from evalkit.lengths import parse_lengths

app = typer.Typer(
    help="evalkit: train under the paper's attention paradigms, evaluate (RULER, general tasks), compare.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks users can run; reports go to results/.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

_PENDING = {
    "train": ("Train a model under one attention paradigm and save checkpoints.", 3),
    "ruler": ("Run RULER on checkpoints across context lengths (--avg: mean over a run's checkpoints).", 4),
    "probe": ("Measure the BF16 RoPE relative-position error of a checkpoint (the paper's Figure 1).", 5),
    "general": ("Run lm-evaluation-harness tasks (mmlu, hellaswag, ...) on checkpoints.", 6),
    "leaderboard": ("Write leaderboards and plots from stored results, never re-running.", 7),
    "quickstart": ("The whole study end to end on a CPU: train tiny models, evaluate, leaderboard.", 7),
}


def _pending_command(name: str, summary: str, issue: int) -> None:
    def command(ctx: typer.Context) -> None:
        raise UserError(f"`evalkit {name}` is not built yet (issue #{issue})")

    command.__doc__ = f"{summary} [not built yet]"
    app.command(name, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(command)


for _name, (_summary, _issue) in _PENDING.items():
    _pending_command(_name, _summary, _issue)


@bench_app.command("attention")
def bench_attention(
    seq: str = typer.Option("4096,16384", help="Sequence lengths, comma-separated (16k = 16384)."),
    heads: int = typer.Option(8, help="Query heads."),
    kv_heads: int = typer.Option(0, help="Key/value heads (0: same as --heads)."),
    head_dim: int = typer.Option(64, help="Head dimension."),
    dtype: str = typer.Option("fp32", help="fp32, bf16 or fp16."),
    mean_doc: int = typer.Option(1024, help="Mean document length in tokens (exponential distribution)."),
    repeats: int = typer.Option(3, help="Timed repeats per cell (median reported), after one warm-up."),
    paradigms: str = typer.Option("", help="Document-masked paradigms to time (default: all of them)."),
    impls: str = typer.Option("", help="Implementations to time (default: all that run forward+backward here)."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    seed: int = typer.Option(0, help="Seed of the document-length draw."),
    out: Path = typer.Option(None, help="Also write the table, with its conditions, to this markdown file."),
) -> None:
    """Forward+backward time of each paradigm's attention vs full causal, with the ideal ratio."""
    from evalkit.attention import Paradigm, available_implementations
    from evalkit.bench import attention as bench

    if dtype not in bench.DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose one of: {', '.join(bench.DTYPES)}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda but no CUDA device is visible; use --device cpu")
    try:
        chosen = [Paradigm.parse(p.strip()) for p in paradigms.split(",") if p.strip()] or None
    except ValueError as err:
        raise UserError(str(err)) from None
    if chosen and not all(p.masks_documents for p in chosen):
        raise UserError("full is the baseline and always timed; list only document-masked paradigms")
    runnable = available_implementations(device)
    chosen_impls = [i.strip() for i in impls.split(",") if i.strip()] or None
    for impl in chosen_impls or []:
        if impl not in runnable:
            raise UserError(f"implementation {impl!r} cannot run forward+backward on {device}; available: {', '.join(runnable)}")

    from rich.console import Console

    console = Console(stderr=True)
    seq_lens = parse_lengths(seq)
    rows = bench.run(
        seq_lens, heads=heads, kv_heads=kv_heads or None, head_dim=head_dim, dtype=dtype, mean_doc=mean_doc,
        repeats=repeats, paradigms=chosen, impls=chosen_impls, seed=seed, device=device,
        progress=lambda msg: console.print(f"[dim]{msg}[/dim]"),
    )  # fmt: skip
    table = bench.to_markdown(rows)
    typer.echo(table)
    if out is not None:
        from evalkit.bench.report import write_report

        command = "evalkit bench attention " + " ".join(sys.argv[3:]) if len(sys.argv) > 3 else "evalkit bench attention"
        conditions = (
            f"B=1, H={heads}, Hkv={kv_heads or heads}, D={head_dim}, {dtype}, device {device}; document lengths "
            f"exponential with mean {mean_doc} (seed {seed}); median of {repeats} timed runs after one warm-up."
        )
        skipped = [impl for impl in ("dense", "blocked", "flex", "flash") if impl not in runnable]
        notes = "Not timed on this device (no forward+backward here): " + ", ".join(skipped) + "." if skipped else ""
        if "flex" in skipped:
            notes += " FlexAttention has no CPU backward; its CPU forward is tested for correctness only."
        if "flash" in skipped:
            notes += " flash-attn needs CUDA; its varlen layout is tested on CPU against an emulation."
        write_report(out, "Attention: forward+backward time vs full causal", command, conditions, table, notes)
        console.print(f"wrote {out}")


def main() -> None:
    """Entry point: user errors become one line on stderr and exit status 2."""
    try:
        app()
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
