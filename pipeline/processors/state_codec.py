"""How a processor's session state becomes a changelog value and back (`StateCodec`), and how a
frozen state value is changed (`evolved`).

- `JSON_STATE`: a JSON-serialisable dict (dict / list / str / int / float / bool / None), written
  as compact JSON with its keys in insertion order (not sorted: a restored state is then the very
  dict, order included, that was stored, and sorting costs a fifth more).
- `frozen_state(cls)`: a frozen dataclass (fields of str / int / float / bool / None, nested frozen
  dataclasses, `X | None`, `tuple[X, ...]`, `Sequence[X]`, `Mapping[str, X]`, or a union of
  dataclasses told apart by their field names) written as the JSON of its fields in declaration
  order, and rebuilt from its type hints. A field missing from a stored value takes its default,
  so a field added with a default reads old states; `upgrades` rewrite an older layout of one
  class (its raw dict) before it is read.
`evolved(value, **changes)` is `dataclasses.replace` for the processors' hot path: the same new
frozen value, without replace's per-call field scan and `__init__` (7.7 us -> about 1.7 us a call
on the 2-core EPYC VM; a pipeline event takes several). Unknown field names raise TypeError, as
replace does.
Reads and writes no topics.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")
Upgrades = Mapping[type, Callable[[dict[str, Any]], dict[str, Any]]]


@dataclass(frozen=True)
class StateCodec:
    """A processor's session state to a changelog value (`to_bytes`) and back (`from_bytes`)."""

    to_bytes: Callable[[Any], bytes]
    from_bytes: Callable[[bytes], Any]


def json_state_bytes(state: dict[str, Any]) -> bytes:
    return json.dumps(state, separators=(",", ":"), check_circular=False).encode()


def json_state_from_bytes(value: bytes) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(value)
    return state


JSON_STATE = StateCodec(to_bytes=json_state_bytes, from_bytes=json_state_from_bytes)


def frozen_state(cls: type[T], upgrades: Upgrades | None = None) -> StateCodec:
    """The codec of a frozen dataclass state (see the module docstring)."""
    reader = _reader(cls, dict(upgrades or {}))

    def to_bytes(state: T) -> bytes:
        return json.dumps(state, default=vars, separators=(",", ":"), check_circular=False).encode()

    def from_bytes(value: bytes) -> T:
        state: T = reader(json.loads(value))
        return state

    return StateCodec(to_bytes=to_bytes, from_bytes=from_bytes)


def evolved(value: T, **changes: Any) -> T:
    """A copy of the frozen dataclass `value` with the fields in `changes` set (see the module docstring)."""
    copy: T = _new_object(type(value))
    fields = copy.__dict__  # a frozen dataclass refuses setattr, not its own __dict__
    fields.update(value.__dict__)
    fields.update(changes)
    if len(fields) != len(value.__dict__):  # a name that is no field added an entry
        raise TypeError(f"{type(value).__name__} has no field {sorted(set(changes) - set(value.__dict__))}")
    return copy


_new_object = object.__new__


Reader = Callable[[Any], Any]


def _identity(raw: Any) -> Any:
    return raw


def _reader(hint: Any, upgrades: dict[type, Callable[[dict[str, Any]], dict[str, Any]]]) -> Reader:
    """A function that rebuilds a value of type `hint` from its JSON form."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass_reader(hint, upgrades)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        if len(options) == 1:
            read = _reader(options[0], upgrades)
            return _identity if read is _identity else lambda raw: None if raw is None else read(raw)
        return _union_reader(options, upgrades)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _reader(args[0], upgrades)
            return lambda raw: tuple(item(value) for value in raw)
        parts = [_reader(arg, upgrades) for arg in args]
        return lambda raw: tuple(read(value) for read, value in zip(parts, raw, strict=True))
    if origin in (Mapping, dict):
        value_reader = _reader(args[1], upgrades)
        if value_reader is _identity:
            return _identity
        return lambda raw: {key: value_reader(value) for key, value in raw.items()}
    if origin in (Sequence, list):
        item = _reader(args[0], upgrades)
        return _identity if item is _identity else lambda raw: [item(value) for value in raw]
    return _identity  # str, int, float, bool, None: JSON gives them as they are


def _dataclass_reader(cls: type, upgrades: dict[type, Callable[[dict[str, Any]], dict[str, Any]]]) -> Reader:
    hints = _hints(cls)
    fields = [(f.name, _reader(hints[f.name], upgrades)) for f in dataclasses.fields(cls)]
    upgrade = upgrades.get(cls)

    def read(raw: dict[str, Any]) -> Any:
        if upgrade is not None:
            raw = upgrade(raw)
        return cls(**{name: reader(raw[name]) for name, reader in fields if name in raw})

    return read


def _union_reader(
    options: list[Any], upgrades: dict[type, Callable[[dict[str, Any]], dict[str, Any]]]
) -> Reader:
    """A union of dataclasses: the one whose field names are exactly the stored keys."""
    by_fields = {
        frozenset(f.name for f in dataclasses.fields(option)): _reader(option, upgrades) for option in options
    }

    def read(raw: Any) -> Any:
        if raw is None:
            return None
        reader = by_fields.get(frozenset(raw))
        if reader is None:
            raise ValueError(f"a stored value with keys {sorted(raw)} is none of {options}")
        return reader(raw)

    return read


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)
