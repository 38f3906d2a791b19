"""`evalkit ppl`: perplexity across context lengths on checkpoints."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli import options
from evalkit.cli.app import app, settings_from
from evalkit.lengths import parse_lengths


@app.command("ppl")
def ppl_command(
    ctx: typer.Context,
    paths: list[str] = options.PATHS,
    ckpts: list[str] = options.CKPTS,
    avg: bool = options.avg_option(),
    last: int = options.LAST,
    lengths: str = options.LENGTHS,
    data: str = typer.Option(
        "builtin", "--data", help="builtin (the bundled prose), a .jsonl with a text field, a .txt, or a datasets dir."
    ),
    docs: int = typer.Option(50, "--docs", help="Use the first N documents (at each length, those long enough)."),
    key_tokens: bool = typer.Option(
        False, "--key-tokens", help="Also LongPPL: perplexity over the tokens that need the long context."
    ),
    engine: str = options.ENGINE,
    dtype: str = options.DTYPE,
    batch_size: int = options.batch_size_option("Documents"),
    engine_arg: list[str] = options.ENGINE_ARG,
    max_length: int = options.max_length_option("lengths"),
    encoding: str = options.encoding_option(
        "sequence",
        "the document cut into pieces behind one anchor, each attending to itself and the anchor "
        "(AnchorAttention's packed documents).",
    ),
    doc_tokens: int = options.doc_tokens_option("tokens per piece."),
    out: Path = options.out_option("results/ppl"),
    shard: str = options.SHARD,
    executor: str = options.EXECUTOR,
    ray_address: str = options.RAY_ADDRESS,
    ray_resources: str = options.RAY_RESOURCES,
) -> None:
    """Perplexity at each context length on checkpoints, with loss per position; --avg over checkpoints."""
    from rich.console import Console

    from evalkit.engines.args import OWN_FLAGS, parse_engine_args
    from evalkit.ppl import PplBenchmark, PplSettings, checkpoint_table, draw

    settings = settings_from(
        PplSettings,
        ctx,
        lengths=parse_lengths(lengths),
        engine_args=parse_engine_args(engine, engine_arg, {**OWN_FLAGS, "packed": "--encoding"}),
    )
    benchmark = PplBenchmark(settings)
    run = options.run_command(
        benchmark, checkpoint_table, out, paths, ckpts, last, avg, shard, executor, ray_address, ray_resources
    )
    if run.summaries and shard is None:
        Console(stderr=True).print(f"wrote {draw(run.summaries, out)}")
