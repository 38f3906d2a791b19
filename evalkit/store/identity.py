"""A result's identity, read from the fields of the settings dataclass that produced it.

Every field of a benchmark's settings dataclass decides what a stored result means unless its
metadata (dataclasses.field(metadata=...), written with `setting` below) gives it another role:

    EXECUTION  how fast a result is computed, never what it is (batch size, device): no identity
    SELECTION  which units are evaluated (tasks, lengths): each unit names its own, no identity
    COUNT      how many of a unit's samples are averaged: the unit's score depends on it, no one
               sample's answer does, so a stored sample is reused at any count
    LOCATION   where input files are read from (RULER's --qa-dir, --essays): what they hold is
               keyed by its content where it is used (RULER's data key), so two paths to the same
               content are one identity: no identity

Settings stored in a summary are compared field by field (`stored_identity`), a field the record
does not hold standing for its default (read from the dataclass).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

ROLE = "evalkit.store.identity"  # the metadata key holding a field's role
RESULT, EXECUTION, SELECTION, COUNT, LOCATION = "result", "execution", "selection", "count", "location"
_EXECUTION_KEYS = "evalkit.store.identity.execution_keys"  # metadata: a dict field's execution-only keys


def setting(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    role: str = RESULT,
    execution_keys: tuple[str, ...] = (),
) -> Any:
    """A settings field with its identity role (see the module docstring). `execution_keys`: for
    a dict of engine settings, the keys that only change speed (dropped from the identity)."""
    metadata = {ROLE: role, _EXECUTION_KEYS: tuple(execution_keys)}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _value(field: dataclasses.Field, value: Any) -> Any:
    dropped = field.metadata.get(_EXECUTION_KEYS, ())
    if dropped and isinstance(value, dict):
        return {key: value[key] for key in sorted(value) if key not in dropped}
    return value


def _fields(cls: type, with_count: bool, with_selection: bool = False) -> list[dataclasses.Field]:
    """The fields of the identity's roles: RESULT, and COUNT and SELECTION as asked."""
    roles = (RESULT,) + ((COUNT,) if with_count else ()) + ((SELECTION,) if with_selection else ())
    return [field for field in dataclasses.fields(cls) if field.metadata.get(ROLE, RESULT) in roles]


def identity(settings: Any, *, with_count: bool = True, with_selection: bool = False) -> dict[str, Any]:
    """The settings' fields that decide a result: every RESULT field, and COUNT fields unless
    `with_count` is False (the identity of one sample's answer). `with_selection` adds the
    SELECTION fields: the identity of a whole sweep (a shard plan's), which also decides which
    cells there are; never the EXECUTION or LOCATION fields."""
    return {
        field.name: _value(field, getattr(settings, field.name))
        for field in _fields(type(settings), with_count, with_selection)
    }


def stored_identity(cls: type, record: dict[str, Any] | None, *, with_count: bool = True) -> dict[str, Any]:
    """identity() of settings stored as a dict (asdict): a field it does not hold stands for the field's default."""
    record = record or {}
    return {field.name: _value(field, record.get(field.name, _default(field))) for field in _fields(cls, with_count)}


def identity_key(settings: Any, *, with_count: bool = True, **more: Any) -> str:
    """A 16-hex hash of identity() plus `more` (facts beyond the settings that decide the result)."""
    chosen = identity(settings, with_count=with_count)
    return hashlib.sha256(json.dumps({**chosen, **more}, sort_keys=True, default=str).encode()).hexdigest()[:16]
