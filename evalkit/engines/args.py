"""`--engine-arg KEY=VALUE` (docs/vllm.md): any keyword setting of an engine's constructor, checked
against its signature (name and type) before anything is loaded; values the engine validates further
(a choice among names, a positive count) are its own to refuse (check_settings).
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any

from evalkit.errors import UserError

_INTEGER = re.compile(r"[+-]?\d+")
# Engine settings `evalkit ruler` and `evalkit general` set with options of their own.
OWN_FLAGS = {"dtype": "--dtype", "batch_size": "--batch-size", "max_length": "--max-length"}


def engine_setting_types(engine: str) -> dict[str, Any]:
    """The engine's keyword settings and their types, read from its constructor."""
    from evalkit.engines import engine_class

    cls = engine_class(engine)
    hints = typing.get_type_hints(cls.__init__)
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name: hints.get(p.name, str) for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


def parse_engine_args(engine: str, assignments: list[str] | None, flags: dict[str, str]) -> dict[str, Any]:
    """{setting: value} of KEY=VALUE assignments for `engine`; `flags` maps the settings a command
    sets with its own option (batch_size -> --batch-size), which --engine-arg must not set twice."""
    if not assignments:
        return {}
    types_ = engine_setting_types(engine)
    settings: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UserError(f"--engine-arg {assignment!r}: expected KEY=VALUE, e.g. --engine-arg enforce_eager=true")
        if key in flags:
            raise UserError(f"--engine-arg {key}: this command sets it with {flags[key]}")
        if key not in types_:
            known = ", ".join(k for k in types_ if k not in flags)
            raise UserError(f"--engine-arg {key}: the {engine} engine has no setting {key!r}; its settings: {known}")
        settings[key] = _coerce(raw.strip(), types_[key], f"--engine-arg {key}")
    return settings


def _coerce(raw: str, hint: Any, what: str) -> Any:
    """`raw` as the setting's type (the first alternative of a union that reads it), or a UserError."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    if type(None) in options and raw.lower() in ("none", "null"):
        return None
    for option in options:
        if option is bool and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        if option is int and _INTEGER.fullmatch(raw):
            return int(raw)
        if option is float:
            try:
                return float(raw)
            except ValueError:
                pass
        if option is str:
            return raw
    names = " or ".join("none" if o is type(None) else getattr(o, "__name__", str(o)) for o in options)
    raise UserError(f"{what}: expected {names}, got {raw!r}")
