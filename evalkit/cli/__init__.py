"""The `evalkit` command: thin parsing, one function call per command, one module per command.

Heavy libraries (transformers, lm-eval, vLLM) are imported inside the commands that need them,
so `evalkit --help` stays fast and never imports vllm or flash-attn.
"""

from __future__ import annotations

import importlib
import sys

import typer

from evalkit.cli.app import app
from evalkit.errors import UserError

# Importing a command's module registers it on the app; `evalkit --help` lists them in this order.
COMMAND_MODULES = ("train", "checkpoints", "bench", "probe", "ruler", "general", "merge", "leaderboard", "quickstart")
for _module in COMMAND_MODULES:
    importlib.import_module(f"evalkit.cli.{_module}")


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
