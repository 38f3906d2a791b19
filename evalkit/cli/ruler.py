"""`evalkit ruler`: RULER on checkpoints across lengths."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli.app import app
from evalkit.errors import UserError
from evalkit.files import check_output_dir
from evalkit.lengths import LengthBeyondLimit, parse_lengths
from evalkit.sweep.options import EXECUTOR_HELP, RAY_ADDRESS_HELP, RAY_RESOURCES_HELP, SHARD_HELP, scale_options


@app.command("ruler")
def ruler_command(
    paths: list[str] = typer.Argument(
        None, help="More checkpoints or run directories (so --ckpts runs/*/ works).", show_default=False
    ),
    ckpts: list[str] = typer.Option(
        None,
        "--ckpts",
        help="A checkpoint, a run directory of step-* checkpoints (globs work), or a hub name "
        "org/name[@revision] (from the Hugging Face cache; HF_HUB_OFFLINE=1: the cache only).",
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
    engine_arg: list[str] = typer.Option(
        None,
        "--engine-arg",
        help="KEY=VALUE (repeatable): any other setting of the engine's, e.g. prefill=padded (hf), "
        "enforce_eager=false or max_num_batched_tokens=8192 (vllm). A wrong key lists the engine's settings.",
    ),
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
    encoding: str = typer.Option(
        "standard",
        "--encoding",
        help="standard: one causal prompt; anchor: the instruction and the context's pieces as documents "
        "that attend to themselves and one shared anchor, the question to everything (AnchorAttention).",
    ),
    doc_tokens: int = typer.Option(
        512, "--doc-tokens", help="--encoding anchor: about this many tokens per document (cut at line breaks)."
    ),
    out: Path = typer.Option(Path("results/ruler"), "--out", help="Results directory."),
    shard: str = typer.Option(None, "--shard", help=SHARD_HELP),
    executor: str = typer.Option("local", "--executor", help=EXECUTOR_HELP),
    ray_address: str = typer.Option(None, "--ray-address", help=RAY_ADDRESS_HELP),
    ray_resources: str = typer.Option(None, "--ray-resources", help=RAY_RESOURCES_HELP),
) -> None:
    """Run RULER on checkpoints across context lengths; --avg averages each run over its checkpoints."""
    from rich.console import Console

    from evalkit.engines.args import OWN_FLAGS, parse_engine_args
    from evalkit.models.refs import resolve_checkpoints
    from evalkit.ruler.runner import RulerSettings, parse_tasks

    console = Console(stderr=True)
    try:
        parsed_lengths = parse_lengths(lengths)
    except LengthBeyondLimit as err:  # the model is known: say its window, not evalkit's limit
        raise _beyond_window(err, [*(ckpts or []), *(paths or [])], max_length) from None
    settings = RulerSettings(
        tasks=parse_tasks(tasks),
        lengths=parsed_lengths,
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
        encoding=encoding,
        doc_tokens=doc_tokens,
        engine_args=parse_engine_args(engine, engine_arg, {**OWN_FLAGS, "packed": "--encoding"}),
    )
    scale = scale_options(shard, executor, ray_address, avg, ray_resources)
    check_output_dir(out)  # before the checkpoints are resolved: a bad --out is named first
    refs = resolve_checkpoints([*(ckpts or []), *(paths or [])], last=last)
    run = _run_with_progress(console, refs, settings, out, avg, scale)
    _report_ruler(console, run, out)


def _beyond_window(err: LengthBeyondLimit, paths: list[str], max_length: int | None) -> UserError:
    """A length above evalkit's limit, said against the first checkpoint's window (the limit's own
    message when the checkpoints cannot be resolved: their error comes once the length is mended)."""
    from evalkit.models.refs import resolve_checkpoints
    from evalkit.ruler.runner import beyond_window

    try:
        ref = resolve_checkpoints(paths)[0]
        return beyond_window(err.text, ref, max_length)
    except UserError:
        return err


def _run_with_progress(console, refs, settings, out: Path, avg: bool, scale=(None, None)):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from evalkit.ruler.runner import run_ruler

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        tasks: dict = {}

        def on_checkpoint(ref) -> None:
            tasks.clear()
            console.print(f"[bold]{ref.run} step {ref.step}[/bold] ({ref.path})")

        def progress(event) -> None:  # evalkit.sweep.pipeline.ProgressEvent
            if event.unit not in tasks:
                tasks[event.unit] = bar.add_task(f"  {event.unit.label()}", total=event.total)
            bar.update(tasks[event.unit], completed=event.done)

        return run_ruler(
            refs,
            settings,
            out,
            progress=progress,
            on_checkpoint=on_checkpoint,
            avg=avg,
            log=console.print,
            shard=scale[0],
            executor=scale[1],
        )


def _report_ruler(console, run, out: Path) -> None:
    from evalkit.store.averages import checkpoint_table

    if run.empty_shard is not None:
        return  # said by the run's log: a shard without units succeeds, for evalkit merge
    if not run.rows:
        raise UserError("no task produced a score (all skipped); see the reasons above")
    typer.echo(checkpoint_table(run.result_rows()))
    if run.averages is not None:
        typer.echo("\n" + run.averages.table)
        console.print(f"wrote {run.files['averages_markdown']}")
    console.print(f"results in {out}")
