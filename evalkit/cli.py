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
probe_app = typer.Typer(
    help="Measure the BF16 RoPE relative-position error of a checkpoint (the paper's Figure 1).", no_args_is_help=True
)
app.add_typer(probe_app, name="probe")

_PENDING = {
    "ruler": ("Run RULER on checkpoints across context lengths (--avg: mean over a run's checkpoints).", 4),
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

        command = "evalkit " + " ".join(sys.argv[1:])
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


@bench_app.command("train")
def bench_train(
    seq: str = typer.Option("4096,16384", help="Window lengths, comma-separated (16k = 16384)."),
    paradigms: str = typer.Option("", help="Paradigms to time besides full (default: all)."),
    config: str = typer.Option("tiny-cpu", "--config", help="The recipe whose model is timed."),
    sets: list[str] = typer.Option(None, "--set", help="Recipe overrides, e.g. --set dtype=bf16."),
    steps: int = typer.Option(3, help="Timed optimizer steps per cell (median reported), after one warm-up."),
    out: Path = typer.Option(None, help="Also write the table, with its conditions, to this markdown file."),
) -> None:
    """Optimizer-step time and tokens/s of a recipe's model under each paradigm vs full."""
    from evalkit.attention import Paradigm
    from evalkit.bench import train as bench

    try:
        chosen = [Paradigm.parse(p.strip()) for p in paradigms.split(",") if p.strip()] or list(Paradigm)
    except ValueError as err:
        raise UserError(str(err)) from None
    from rich.console import Console

    console = Console(stderr=True)
    rows = bench.run(parse_lengths(seq), chosen, recipe=config, sets=sets, steps=steps,
                     progress=lambda msg: console.print(f"[dim]{msg}[/dim]"))  # fmt: skip
    table = bench.to_markdown(rows)
    typer.echo(table)
    if out is not None:
        from evalkit.bench.report import write_report

        conditions = (
            f"recipe {config} ({', '.join(sets or []) or 'as shipped'}), one window per optimizer step, "
            f"forward+backward+AdamW; median of {steps} timed steps after one warm-up; windows built untimed."
        )
        write_report(out, "Training: optimizer-step time per paradigm vs full", "evalkit " + " ".join(sys.argv[1:]), conditions, table)
        console.print(f"wrote {out}")


def _probe(kind: str, ckpt: str, out: Path | None, options: dict) -> None:
    from rich.console import Console

    from evalkit.probe import run_probe

    console = Console(stderr=True)
    out_dir = out or Path("results") / "probe" / Path(ckpt).resolve().name
    given = {key: value for key, value in options.items() if value is not None}
    result = run_probe(kind, ckpt, out_dir, progress=lambda msg: console.print(f"[dim]{msg}[/dim]"), **given)
    typer.echo(Path(result["files"]["markdown"]).read_text())
    console.print("wrote " + ", ".join(result["files"].values()))


_CKPT = typer.Option(..., "--ckpt", help="A Hugging Face checkpoint directory (Llama, Qwen2, Mistral).")
_TEXTS = typer.Option(None, "--texts", help="Plain text or JSONL with a text field (default: built-in prose).")
_N = typer.Option(None, "--n", help="Texts averaged (default 50).")
_DELTA2 = typer.Option(None, "--delta2", help="Reference shift (default 16).")
_DTYPES = typer.Option(None, "--dtypes", help="Weights' dtypes, comma-separated (default bf16,fp32).")
_ROPE = typer.Option(None, "--rope", help="RoPE precision: cast (as HF/vLLM), fp32 (rotate in FP32), or both.")
_SEED = typer.Option(None, "--seed", help="Seed of the random initialisation.")
_DEVICE = typer.Option(None, "--device", help="auto, cpu or cuda.")
_OUT = typer.Option(None, "--out", help="Output directory (default results/probe/<checkpoint name>).")


@probe_app.command("shift")
def probe_shift(
    ckpt: str = _CKPT, texts: str = _TEXTS,
    seq: int = typer.Option(None, "--seq", help="Tokens per text (default 4096, capped at the model's window)."),
    n: int = _N, delta2: int = _DELTA2,
    delta1: str = typer.Option(None, "--delta1", help="Shifts Δ1, comma-separated (default the paper's list)."),
    dtypes: str = _DTYPES, rope: str = _ROPE,
    random_init: bool = typer.Option(False, "--random-init", help="Add the same architecture freshly initialised, in BF16."),
    seed: int = _SEED, device: str = _DEVICE, out: Path = _OUT,
) -> None:  # fmt: skip
    """D(X, Δ1, Δ2) of Eq. 4 for each Δ1: how far attention moves when positions shift (Fig. 1 left)."""
    _probe("shift", ckpt, out, dict(texts=texts, seq_len=seq, n_texts=n, delta2=delta2, delta1=delta1, dtypes=dtypes,
                                    rope=rope, random_init=random_init, seed=seed, device=device))  # fmt: skip


@probe_app.command("tokens")
def probe_tokens(
    ckpt: str = _CKPT, texts: str = _TEXTS,
    seq: int = typer.Option(None, "--seq", help="Tokens per text (default 4096, capped at the model's window)."),
    n: int = _N, delta2: int = _DELTA2,
    delta1: str = typer.Option(None, "--delta1", help="Shifts Δ1 (default 0)."),
    dtypes: str = _DTYPES, rope: str = _ROPE,
    random_init: bool = typer.Option(False, "--random-init", help="Add the same architecture freshly initialised, in BF16."),
    seed: int = _SEED, device: str = _DEVICE, out: Path = _OUT,
) -> None:  # fmt: skip
    """The difference per key column and the first token's share of it (Fig. 1 middle)."""
    _probe("tokens", ckpt, out, dict(texts=texts, seq_len=seq, n_texts=n, delta2=delta2, delta1=delta1, dtypes=dtypes,
                                     rope=rope, random_init=random_init, seed=seed, device=device))  # fmt: skip


@probe_app.command("length")
def probe_length(
    ckpt: str = _CKPT, texts: str = _TEXTS,
    lengths: str = typer.Option(None, "--lengths", help="Lengths, comma-separated (default 64..8192 doubling, capped)."),
    n: int = _N, delta2: int = _DELTA2,
    delta1: str = typer.Option(None, "--delta1", help="Shift Δ1 (default 0)."),
    dtypes: str = _DTYPES, rope: str = _ROPE,
    random_init: bool = typer.Option(False, "--random-init", help="Add the same architecture freshly initialised, in BF16."),
    seed: int = _SEED, device: str = _DEVICE, out: Path = _OUT,
) -> None:  # fmt: skip
    """D_logit of Eq. 5: the first-token logit difference against length (Fig. 1 right)."""
    _probe("length", ckpt, out, dict(texts=texts, lengths=lengths, n_texts=n, delta2=delta2, delta1=delta1,
                                     dtypes=dtypes, rope=rope, random_init=random_init, seed=seed, device=device))  # fmt: skip


@app.command("train")
def train_command(
    config: str = typer.Option("tiny-cpu", "--config", help="A recipe: configs/NAME.yaml or a YAML path."),
    model: str = typer.Option(None, "--model", help="A local HF checkpoint to continue pretraining (model.path)."),
    paradigm: str = typer.Option(None, "--paradigm", help="full, intra_doc, intra_doc_reset, anchor, anchor_tag, intra_doc_interleaved, anchor_interleaved."),
    seq_len: int = typer.Option(None, "--seq-len", help="Tokens per training window."),
    max_steps: int = typer.Option(None, "--max-steps", help="Optimizer steps."),
    sets: list[str] = typer.Option(None, "--set", help="Any other field, e.g. --set optim.lr=1e-4 (repeatable)."),
    out: str = typer.Option(None, "--out", help="Run directory (default runs/<config>-<paradigm>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest complete checkpoint in the run directory."),
) -> None:
    """Train a model under one attention paradigm and save checkpoints (runs/<run>/step-<N>/)."""
    from evalkit.train import load_config, train

    overrides = {"model.path": model, "paradigm": paradigm, "seq_len": seq_len, "max_steps": max_steps, "out": out}
    cfg = load_config(config, overrides, sets)
    run_dir = train(cfg, resume=resume)
    typer.echo(f"checkpoints in {run_dir}")


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
