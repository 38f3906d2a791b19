"""A result's identity, read from the fields of the settings dataclass that produced it.

Every field of a benchmark's settings dataclass decides what a stored result means unless its
metadata (dataclasses.field(metadata=...), written with `setting` below) gives it another role:

    EXECUTION  how fast a result is computed, never what it is (batch size, device): no identity
    SELECTION  which units are evaluated (tasks, lengths): each unit names its own, no identity
    COUNT      how many of a unit's samples are averaged: the unit's score depends on it, no one
               sample's answer does, so a stored sample is reused at any count
    LOCATION   where input files are read from (RULER's --qa-dir, --essays): what they hold is
               keyed by its content where it is used (RULER's data key), so two paths to the same
               content are one identity; the field counts as at its default (keys made with it at
               its default are unchanged; `with_locations` gives the keys made before, path included)

Stored settings are compared field by field, a field missing from an older record standing for
its default (read from the dataclass), so adding a setting keeps every stored result valid. A
hashed key (`identity_key`) omits the fields marked `keyed_since_default`, while at their
default: fields added after keys were first stored, whose old keys must keep holding.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

ROLE = "evalkit.store.identity"  # the metadata key holding a field's role
RESULT, EXECUTION, SELECTION, COUNT, LOCATION = "result", "execution", "selection", "count", "location"
_LATE = "evalkit.store.identity.late"  # metadata: keyed only when not at its default
_EXECUTION_KEYS = "evalkit.store.identity.execution_keys"  # metadata: a dict field's execution-only keys


def setting(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    role: str = RESULT,
    keyed_since_default: bool = False,
    execution_keys: tuple[str, ...] = (),
) -> Any:
    """A settings field with its identity role (see the module docstring). `execution_keys`: for
    a dict of engine settings, the keys that only change speed (dropped from the identity)."""
    metadata = {ROLE: role, _LATE: keyed_since_default, _EXECUTION_KEYS: tuple(execution_keys)}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def _role(field: dataclasses.Field) -> str:
    return field.metadata.get(ROLE, RESULT)


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


def _fields(cls: type, roles: tuple[str, ...]) -> list[dataclasses.Field]:
    return [field for field in dataclasses.fields(cls) if _role(field) in roles]


def identity(
    settings: Any, *, with_count: bool = True, with_locations: bool = False, with_selection: bool = False
) -> dict[str, Any]:
    """The settings' fields that decide a result: every RESULT field, COUNT fields unless
    `with_count` is False (the identity of one sample's answer), and LOCATION fields at their
    default (their actual values with `with_locations`: the identity evalkit keyed by before).
    `with_selection` adds the SELECTION fields: the identity of a whole sweep (a shard plan's),
    which also decides which cells there are; never the EXECUTION fields."""
    roles: tuple[str, ...] = (RESULT, COUNT, LOCATION) if with_count else (RESULT, LOCATION)
    roles += (SELECTION,) if with_selection else ()
    return {
        field.name: _value(field, getattr(settings, field.name))
        if with_locations or _role(field) != LOCATION
        else _default(field)
        for field in _fields(type(settings), roles)
    }


def stored_identity(cls: type, record: dict[str, Any] | None, *, with_count: bool = True) -> dict[str, Any]:
    """identity() of settings stored as a dict (asdict) by this or an older evalkit: a field it
    does not hold stands for the field's default."""
    record = record or {}
    roles = (RESULT, COUNT, LOCATION) if with_count else (RESULT, LOCATION)
    return {
        field.name: _default(field)
        if _role(field) == LOCATION
        else _value(field, record.get(field.name, _default(field)))
        for field in _fields(cls, roles)
    }


def identity_key(settings: Any, *, with_count: bool = True, with_locations: bool = False, **more: Any) -> str:
    """A 16-hex hash of identity() plus `more`, without late fields at their default."""
    fields = {field.name: field for field in dataclasses.fields(type(settings))}
    chosen = {
        name: value
        for name, value in identity(settings, with_count=with_count, with_locations=with_locations).items()
        if not (fields[name].metadata.get(_LATE) and value == _value(fields[name], _default(fields[name])))
    }
    return hashlib.sha256(json.dumps({**chosen, **more}, sort_keys=True, default=str).encode()).hexdigest()[:16]
