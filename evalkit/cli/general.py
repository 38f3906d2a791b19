"""`evalkit general`: lm-evaluation-harness tasks on checkpoints."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli.app import app
from evalkit.errors import UserError
from evalkit.sweep.options import EXECUTOR_HELP, RAY_ADDRESS_HELP, RAY_RESOURCES_HELP, SHARD_HELP, scale_options


@app.command("general")
def general_command(
    paths: list[str] = typer.Argument(
        None, help="More checkpoints or run directories (so --ckpts runs/*/ works).", show_default=False
    ),
    ckpts: list[str] = typer.Option(
        None,
        "--ckpts",
        help="A checkpoint, a run directory of step-* checkpoints (globs work), or a hub name "
        "org/name[@revision] (from the Hugging Face cache; HF_HUB_OFFLINE=1: the cache only).",
    ),
    tasks: str = typer.Option(
        ..., "--tasks", help="lm-eval tasks, groups or tags, comma-separated (mmlu,hellaswag,...)."
    ),
    num_fewshot: int = typer.Option(
        None, "--num-fewshot", help="Shots for every task (default: mmlu 5, hellaswag 0, others lm-eval's)."
    ),
    limit: float = typer.Option(None, "--limit", help="First N documents per task (for testing; below 1: a fraction)."),
    too_long: str = typer.Option(
        "task",
        "--too-long",
        help="A document longer than the window skips its whole task (task), only itself, counted in the "
        "results (documents: for LongBench-style tasks whose lengths vary), or, asked for explicitly, loses "
        "the middle of its generation prompt, counted (middle: LongBench's own truncation).",
    ),
    engine: str = typer.Option("hf", "--engine", help="hf (transformers) or vllm."),
    dtype: str = typer.Option(None, "--dtype", help="bf16, fp16 or fp32 (default: bf16 on GPU, fp32 on CPU)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Requests per batch."),
    engine_arg: list[str] = typer.Option(
        None,
        "--engine-arg",
        help="KEY=VALUE (repeatable): any other setting of the engine's, e.g. prefill=padded (hf), "
        "enforce_eager=false or max_num_batched_tokens=8192 (vllm). A wrong key lists the engine's settings.",
    ),
    max_length: int = typer.Option(
        None, "--max-length", help="Allow requests beyond the model's max_position_embeddings."
    ),
    last: int = typer.Option(None, "--last", help="Use only each run's newest N checkpoints."),
    avg: bool = typer.Option(False, "--avg", help="Also average each run over its checkpoints (mean ± std)."),
    include_path: list[str] = typer.Option(
        None, "--include-path", help="More folders of lm-eval task YAMLs (tasks/ is always included)."
    ),
    out: Path = typer.Option(Path("results/general"), "--out", help="Results directory."),
    shard: str = typer.Option(None, "--shard", help=SHARD_HELP),
    executor: str = typer.Option("local", "--executor", help=EXECUTOR_HELP),
    ray_address: str = typer.Option(None, "--ray-address", help=RAY_ADDRESS_HELP),
    ray_resources: str = typer.Option(None, "--ray-resources", help=RAY_RESOURCES_HELP),
) -> None:
    """Run lm-evaluation-harness tasks (mmlu, hellaswag, any task or group) on checkpoints."""
    from rich.console import Console

    from evalkit.engines.args import OWN_FLAGS, parse_engine_args
    from evalkit.general import checkpoint_table, parse_tasks, run_general
    from evalkit.models.refs import resolve_checkpoints

    console = Console(stderr=True)
    settings = {
        **parse_engine_args(engine, engine_arg, OWN_FLAGS),
        "batch_size": batch_size,
        "max_length": max_length,
        **({"dtype": dtype} if dtype else {}),
    }
    scale = scale_options(shard, executor, ray_address, avg, ray_resources)
    refs = resolve_checkpoints([*(ckpts or []), *(paths or [])], last=last)
    run = run_general(
        refs,
        parse_tasks(tasks),
        out=out,
        num_fewshot=num_fewshot,
        limit=limit,
        engine=engine,
        engine_settings=settings,
        include_path=include_path,  # type: ignore[arg-type]  # only read there: list[str] is safe
        avg=avg,
        too_long=too_long,
        progress=lambda event: (
            console.print(f"[dim]  {event.unit.task}: {event.done}/{event.total}[/dim]")
            if event.done == event.total
            else None
        ),
        on_checkpoint=lambda ref: console.print(f"[bold]{ref.run} step {ref.step}[/bold] ({ref.path})"),
        log=console.print,
        shard=scale[0],
        executor=scale[1],
    )
    if run.empty_shard is not None:
        return  # said by the run's log: a shard without units succeeds, for evalkit merge
    if not run.rows:
        raise UserError("no task produced a score (all skipped); see the reasons above")
    typer.echo(checkpoint_table(run.result_rows()))
    if run.averages is not None:
        typer.echo("\n" + run.averages.table)
    console.print(f"results in {out}")
