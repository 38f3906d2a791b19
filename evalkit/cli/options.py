"""What every benchmark's command shares, declared once (docs/architecture.md): its options, their
checks before any work (--shard, --executor, --ray-address), and run_command, the one way to a run."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from evalkit.errors import UserError
from evalkit.models.precision import check_dtype

if TYPE_CHECKING:
    from evalkit.sweep.pipeline import Benchmark, EvaluationRun

EXECUTORS = ("local", "ray")

# The options: each typer's default for its parameter (`ckpts: list[str] = options.CKPTS`); a
# function where a word differs with the benchmark (its units, its default --out).
PATHS = typer.Argument(None, help="More checkpoints or run directories (so --ckpts runs/*/ works).", show_default=False)
CKPTS = typer.Option(
    None,
    "--ckpts",
    help="A checkpoint, a run directory of step-* checkpoints (globs work), or a hub name "
    "org/name\\[@revision] (from the Hugging Face cache; HF_HUB_OFFLINE=1: the cache only).",
)
LAST = typer.Option(None, "--last", help="Use only each run's newest N checkpoints.")
LENGTHS = typer.Option("4k", "--lengths", help="Context lengths, comma-separated (4k = 4096).")
ENGINE = typer.Option("hf", "--engine", help="hf (transformers) or vllm.")
DTYPE = typer.Option(
    None,
    "--dtype",
    help="bf16, fp16 or fp32 (default: a checkpoint's trained regime, where its meta.json records one; "
    "else bf16 on GPU, fp32 on CPU).",
    # Checked as given: an empty --dtype "" is refused, not read as "not given" (the default).
    callback=lambda value: value if value is None else check_dtype(value),
)
ENGINE_ARG = typer.Option(
    None,
    "--engine-arg",
    help="KEY=VALUE (repeatable): any other setting of the engine's, e.g. serving=stock (a bf16 run served "
    "as transformers and vLLM load it, not as trained), prefill=padded (hf), enforce_eager=false (vllm). "
    "A wrong key lists the engine's settings.",
)
SHARD = typer.Option(
    None,
    "--shard",
    help="Evaluate only shard I of N of the (checkpoint, unit) pairs, balanced by estimated tokens; "
    "'slurm' or 'sge': this job-array task's shard, from the scheduler's array variables (any first "
    "index and step). Join the shards with evalkit merge.",
)
EXECUTOR = typer.Option(
    "local",
    "--executor",
    help="local: this process; ray: the units on a Ray cluster's workers (pip install 'evalkit[ray]').",
)
RAY_ADDRESS = typer.Option(
    None,
    "--ray-address",
    help="--executor ray: the cluster to join (ray://host:10001 or host:6379; default: a local one).",
)
RAY_RESOURCES = typer.Option(
    None,
    "--ray-resources",
    help="--executor ray: what each task (one model copy) asks of a node, e.g. cpus=4,memory=8G or gpus=2 "
    "(default: 1 CPU and 3x the weights' size in memory on CPUs; the GPUs of its tensor-parallel size on GPUs).",
)


def avg_option(what: str = "mean ± std") -> Any:
    return typer.Option(False, "--avg", help=f"Also average each run over its checkpoints ({what}).")


def batch_size_option(items: str) -> Any:
    return typer.Option(8, "--batch-size", help=f"{items} per batch.")


def max_length_option(items: str) -> Any:
    return typer.Option(None, "--max-length", help=f"Allow {items} beyond the model's max_position_embeddings.")


def encoding_option(standard: str, anchor: str) -> Any:
    return typer.Option("standard", "--encoding", help=f"standard: one causal {standard}; anchor: {anchor}")


def doc_tokens_option(what: str) -> Any:
    return typer.Option(512, "--doc-tokens", help=f"--encoding anchor: {what}")


def out_option(default: str) -> Any:
    return typer.Option(Path(default), "--out", help="Results directory.")


@contextmanager
def progress_display(console) -> Iterator[dict[str, Callable]]:
    """The callbacks run_benchmark takes (progress, on_checkpoint, log), shown on `console`: each
    checkpoint's name, then a bar per unit counting its work (samples, requests, documents)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        bars: dict = {}

        def on_checkpoint(ref) -> None:
            bars.clear()
            console.print(f"[bold]{ref.run} step {ref.step}[/bold] ({ref.path})")

        def progress(event) -> None:  # evalkit.sweep.pipeline.ProgressEvent
            if event.unit not in bars:
                bars[event.unit] = bar.add_task(f"  {event.unit.label()}", total=event.total)
            bar.update(bars[event.unit], completed=event.done)

        yield {"progress": progress, "on_checkpoint": on_checkpoint, "log": console.print}


def run_command(
    benchmark: Benchmark,
    table: Callable[[list], str],
    out: Path,
    paths: list[str] | None,
    ckpts: list[str] | None,
    last: int | None,
    avg: bool,
    shard: str | None,
    executor: str,
    ray_address: str | None,
    ray_resources: str | None,
) -> EvaluationRun:
    """A benchmark command's body past its own settings: run_benchmark on the checkpoints named,
    shown as it goes, then its table per checkpoint (stdout), --avg's table and where the files
    are; no score at all (every unit skipped) is a failure."""
    from rich.console import Console

    from evalkit.models.refs import resolve_checkpoints
    from evalkit.sweep.pipeline import run_benchmark
    from evalkit.sweep.plan import parse_shard

    console = Console(stderr=True)
    parsed = parse_shard(shard)
    if parsed is not None and avg:
        raise UserError("--avg averages over every checkpoint; with --shard, run it after evalkit merge instead")
    chosen = make_executor(executor, ray_address, ray_resources)
    refs = resolve_checkpoints([*(ckpts or []), *(paths or [])], last=last)  # --ckpts, then the arguments
    with progress_display(console) as shown:
        result = run_benchmark(benchmark, refs, out, avg=avg, shard=parsed, executor=chosen, **shown)
    if result.empty_shard is not None:
        return result  # said by the run's log: a shard without units succeeds, for evalkit merge
    if not result.rows and parsed is not None:  # whether the sweep scored anything is evalkit merge's to say
        console.print(
            f"shard {parsed.index}/{parsed.count}: every unit skipped (reasons above), recorded for evalkit merge"
        )
        return result
    if not result.rows:
        raise UserError("no task produced a score (all skipped); see the reasons above")
    typer.echo(table(result.result_rows()))
    if result.averages is not None:
        typer.echo("\n" + result.averages.table)
        console.print(f"wrote {result.files['averages_markdown']}")
    console.print(f"results in {out}")
    return result


def make_executor(name: str, ray_address: str | None, ray_resources: str | None = None):
    """None for the local executor (the pipeline's own loop), else the Ray executor."""
    if name not in EXECUTORS:
        raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
    if name == "local":
        if ray_address is not None:
            raise UserError("--ray-address needs --executor ray")
        if ray_resources is not None:
            raise UserError("--ray-resources needs --executor ray")
        return None
    import importlib.util

    check_ray_address(ray_address)
    if importlib.util.find_spec("ray") is None:
        raise UserError("--executor ray needs Ray: pip install 'evalkit[ray]'")
    from evalkit.sweep.ray_executor import RayExecutor, parse_ray_resources

    return RayExecutor(address=ray_address, resources=parse_ray_resources(ray_resources))


# What ray.init takes: the head's HOST:PORT (a name, IPv4 or [IPv6]), ray://HOST[:PORT] (Ray Client),
# or a keyword: "auto" (the cluster this node joined), "local" (start one here).
_HOST = r"(\[[0-9a-fA-F:]+\]|[^\s:/\[\]]+)"
RAY_ADDRESS_PATTERN = re.compile(rf"^(ray://{_HOST}(:\d+)?|{_HOST}:\d+|auto|local)$")


def check_ray_address(address: str | None) -> None:
    """A malformed --ray-address is one line before any work, not Ray's "Invalid address format" traceback."""
    if address is not None and not RAY_ADDRESS_PATTERN.match(address):
        raise UserError(
            f"--ray-address {address!r} is not a Ray address: give the head node's HOST:PORT (as `ray start "
            "--head` printed it, e.g. 10.0.0.5:6379), ray://HOST:10001 (Ray Client), or auto (this node's cluster)"
        )
