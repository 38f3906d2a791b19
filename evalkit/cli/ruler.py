"""`evalkit ruler`: RULER on checkpoints across lengths."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli import options
from evalkit.cli.app import app, settings_from
from evalkit.errors import UserError
from evalkit.lengths import LengthBeyondLimit, parse_lengths


@app.command("ruler")
def ruler_command(
    ctx: typer.Context,
    paths: list[str] = options.PATHS,
    ckpts: list[str] = options.CKPTS,
    avg: bool = options.avg_option("mean ± std of the per-length task average"),
    last: int = options.LAST,
    lengths: str = options.LENGTHS,
    tasks: str = typer.Option(
        "all",
        "--tasks",
        help="all (RULER's 13 tasks), task names or helmet_recall (HELMET's Recall: niah_multikey_2, "
        "niah_multikey_3, niah_multivalue, json_kv), comma-separated.",
    ),
    samples: int = typer.Option(500, "--samples", help="Samples per task and length."),
    seed: int = typer.Option(42, "--seed", help="Data seed (RULER's default 42)."),
    essays: str = typer.Option(
        None, "--essays", help="Essay haystack: a text or JSON file of essays (default: built-in prose)."
    ),
    qa_dir: str = typer.Option(
        None, "--qa-dir", help="Directory with SQuAD v2 dev and HotpotQA dev-distractor JSON (qa_1, qa_2)."
    ),
    engine: str = options.ENGINE,
    dtype: str = options.DTYPE,
    batch_size: int = options.batch_size_option("Prompts"),
    engine_arg: list[str] = options.ENGINE_ARG,
    max_length: int = options.max_length_option("lengths"),
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
    encoding: str = options.encoding_option(
        "prompt",
        "the instruction and the context's pieces as documents that attend to themselves and one shared "
        "anchor, the question to everything (AnchorAttention).",
    ),
    doc_tokens: int = options.doc_tokens_option("about this many tokens per document (cut at line breaks)."),
    out: Path = options.out_option("results/ruler"),
    shard: str = options.SHARD,
    executor: str = options.EXECUTOR,
    ray_address: str = options.RAY_ADDRESS,
    ray_resources: str = options.RAY_RESOURCES,
) -> None:
    """Run RULER on checkpoints across context lengths; --avg averages each run over its checkpoints."""
    from evalkit.engines.args import OWN_FLAGS, parse_engine_args
    from evalkit.ruler.runner import RulerBenchmark, RulerSettings, parse_ruler_tasks
    from evalkit.store.averages import checkpoint_table

    try:
        parsed_lengths = parse_lengths(lengths)
    except LengthBeyondLimit as err:  # the model is known: say the first checkpoint's window, not evalkit's limit
        from evalkit.models.refs import resolve_checkpoints
        from evalkit.sweep.pipeline import beyond_window

        try:
            why = beyond_window(err.text, resolve_checkpoints([*(ckpts or []), *(paths or [])])[0], max_length)
        except UserError:  # checkpoints that cannot be resolved: their error comes once the length is mended
            why = err
        raise why from None
    settings = settings_from(
        RulerSettings,
        ctx,
        tasks=parse_ruler_tasks(tasks),
        lengths=parsed_lengths,
        num_samples=samples,
        engine_args=parse_engine_args(engine, engine_arg, {**OWN_FLAGS, "packed": "--encoding"}),
    )
    benchmark = RulerBenchmark(settings)
    options.run_command(
        benchmark, checkpoint_table, out, paths, ckpts, last, avg, shard, executor, ray_address, ray_resources
    )
