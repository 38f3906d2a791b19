"""`evalkit general`: lm-evaluation-harness tasks on checkpoints."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli import options
from evalkit.cli.app import app


@app.command("general")
def general_command(
    paths: list[str] = options.PATHS,
    ckpts: list[str] = options.CKPTS,
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
    babilong_lengths: str = typer.Option(
        None,
        "--babilong-lengths",
        help="BABILong's lengths, comma-separated (0k,1k,2k,4k,...,128k): its tasks run once per length (lm-eval's "
        "max_seq_lengths), each stored and resumed apart, its rows at that length; other tasks once.",
    ),
    engine: str = options.ENGINE,
    dtype: str = options.DTYPE,
    batch_size: int = options.batch_size_option("Requests"),
    engine_arg: list[str] = options.ENGINE_ARG,
    max_length: int = options.max_length_option("requests"),
    last: int = options.LAST,
    avg: bool = options.avg_option(),
    include_path: list[str] = typer.Option(
        None, "--include-path", help="More folders of lm-eval task YAMLs (tasks/ is always included)."
    ),
    out: Path = options.out_option("results/general"),
    shard: str = options.SHARD,
    executor: str = options.EXECUTOR,
    ray_address: str = options.RAY_ADDRESS,
    ray_resources: str = options.RAY_RESOURCES,
) -> None:
    """Run lm-evaluation-harness tasks (mmlu, hellaswag, any task or group) on checkpoints."""
    from evalkit.arglists import parse_list
    from evalkit.engines.args import OWN_FLAGS, parse_engine_args
    from evalkit.general import GeneralBenchmark, GeneralSettings, general_checkpoint_table

    engine_settings = {
        **parse_engine_args(engine, engine_arg, OWN_FLAGS),
        "batch_size": batch_size,
        "max_length": max_length,
        **({"dtype": dtype} if dtype else {}),
    }
    settings = GeneralSettings(
        parse_list(tasks), num_fewshot, limit, engine, engine_settings, include_path or [], too_long,
        parse_list(babilong_lengths or ""),
    )  # fmt: skip
    benchmark = GeneralBenchmark(settings)
    options.run_command(
        benchmark, general_checkpoint_table, out, paths, ckpts, last, avg, shard, executor, ray_address, ray_resources
    )
