"""`evalkit merge`: join the outputs of a sweep's shards into one results directory."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli.app import app
from evalkit.errors import UserError


@app.command("merge")
def merge_command(
    outputs: list[Path] = typer.Argument(..., help="The --out directories of every shard (--shard I/N) of one sweep."),
    out: Path = typer.Option(..., "--out", help="A new or empty directory for the merged results."),
) -> None:
    """Join the shard outputs of one sweep (per-sample logs and summaries) as if one run wrote them."""
    from evalkit.sweep.merge import merge_shards

    counts = merge_shards(outputs, out, redraw=_redraw)
    empty = f" ({counts['empty']} of them empty: no units)" if counts["empty"] else ""
    typer.echo(
        f"merged {counts['shards']} shards{empty}: {counts['summaries']} summaries, {counts['files']} files into {out}"
    )
    if counts["unscored"]:  # as the unsharded run of the sweep fails
        names = " and ".join(counts["unscored"])
        raise UserError(
            f"no task of the {names} sweep produced a score (all skipped); the reasons are in {out}'s summaries"
        )


def _redraw(summaries: list[dict], out: Path) -> None:
    """The files a benchmark's command derives from its summaries into --out, drawn from the merged
    ones as the unsharded run's command draws them (ppl's plot; --avg's tables come from a rerun)."""
    ppl = sorted((s for s in summaries if s.get("benchmark") == "ppl"), key=lambda s: (s["run"], s["step"]))
    if any(summary["rows"] for summary in ppl):
        from evalkit.ppl import draw

        draw(ppl, out)
