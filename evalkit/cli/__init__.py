"""The `evalkit` command: thin parsing, one function call per command, one module per command.

Heavy libraries (transformers, lm-eval, vLLM) are imported inside the commands that need them,
so `evalkit --help` stays fast and never imports vllm or flash-attn.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

import typer

from evalkit.cli.app import app
from evalkit.errors import UserError
from evalkit.files import disk_full_advice, disk_full_error, file_error

# Importing a command's module registers it on the app; `evalkit --help` lists them in this order.
COMMAND_MODULES = "train checkpoints probe ruler general ppl merge leaderboard compare quickstart".split()
for _module in COMMAND_MODULES:
    importlib.import_module(f"evalkit.cli.{_module}")


def main(application: Callable[[], object] = app) -> None:
    """Entry point (of `evalkit`, and of `python -m perf` with its own app): user errors are one line."""
    import signal

    # SIGTERM (a scheduler's stop, `kill`) unwinds like an exception: engines close, so vLLM's
    # engine-core processes do not outlive this one, and locks and temporary files are released.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        application()
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as err:
        full = disk_full_error(err)
        if full is None:
            unreadable = file_error(err)
            if unreadable is None:
                raise
            typer.echo(f"error: {unreadable}", err=True)
            sys.exit(2)
        path = getattr(full, "filename", None)
        where = f" writing {path}" if path else ""
        advice = disk_full_advice(path) if path else "free some space (or choose another --out)"
        typer.echo(
            f"error: no space left on the device{where}: {advice}, and rerun the same command; what finished "
            "before is kept and resumes",
            err=True,
        )
        sys.exit(2)


def _exit_on_sigterm(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)
