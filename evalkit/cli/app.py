"""The `evalkit` Typer application and what its commands share; each command is a module beside this one."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

app = typer.Typer(
    help="evalkit: train under the paper's attention paradigms, evaluate (RULER, general tasks), compare.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
probe_app = typer.Typer(
    help="Measure the BF16 RoPE relative-position error of a checkpoint (the paper's Figure 1).", no_args_is_help=True
)
app.add_typer(probe_app, name="probe")


def settings_from(cls: Any, ctx: typer.Context, **parsed: Any) -> Any:
    """The settings dataclass `cls` from a command's options of its fields' names, `parsed` (options
    parsed or named otherwise) over them."""
    names = {field.name for field in dataclasses.fields(cls)}
    return cls(**{**{name: value for name, value in ctx.params.items() if name in names}, **parsed})
