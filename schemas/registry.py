"""The schema registry: every event's current schema, its frozen history and the writer-fingerprint table.

Reads `schemas/avro/*.avsc` (one named type per file, file name = record name; named types are
shared across files by full name, e.g. `orl.events.Envelope`) and
`schemas/history/<EventType>/v<N>.avsc` (frozen, self-contained, written by `python -m orl.schemas.freeze`).
An event is a record whose first field is `envelope`. The current schema of an event has the number
of its latest frozen version; a current schema that differs from it is *unfrozen* and numbered one
higher until it is frozen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from orl.schemas.errors import SchemaDefinitionError, UnknownEventTypeError
from orl.schemas.schema_forms import Schema, expand, fingerprint_of, parse_named, self_contained, short_name

AVRO_DIR = Path(__file__).parent / "avro"
HISTORY_DIR = Path(__file__).parent / "history"
_VERSION_FILE = re.compile(r"v([1-9][0-9]*)\.avsc")


@dataclass(frozen=True)
class SchemaVersion:
    """One version of one event's schema, in self-contained form."""

    event_type: str
    version: int
    schema: dict[str, Any]
    fingerprint: bytes


class Registry:
    """Current and historical schemas of every event type, looked up by name or writer fingerprint."""

    def __init__(self, current: Mapping[str, Schema], history: Mapping[str, Sequence[Schema]]) -> None:
        unknown = sorted(set(history) - set(current))
        if unknown:
            raise SchemaDefinitionError(f"history exists for events without a current schema: {unknown}")
        self.event_types: tuple[str, ...] = tuple(sorted(current))
        self._history = {name: _versions(name, history.get(name, ())) for name in self.event_types}
        self._current = {name: self._current_version(name, current[name]) for name in self.event_types}
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        for name in self.event_types:
            for version in (*self._history[name], self._current[name]):
                self._by_fingerprint[version.fingerprint] = version  # later versions win on equal forms

    def current(self, event_type: str) -> SchemaVersion:
        try:
            return self._current[event_type]
        except KeyError:
            raise UnknownEventTypeError(
                f"unknown event_type {event_type!r}; known: {', '.join(self.event_types)}"
            ) from None

    def history(self, event_type: str) -> tuple[SchemaVersion, ...]:
        """The frozen versions, oldest first (empty if never frozen)."""
        self.current(event_type)
        return self._history[event_type]

    def unfrozen(self) -> tuple[str, ...]:
        """Event types whose current schema is not yet their latest frozen version."""
        return tuple(name for name in self.event_types if self._is_unfrozen(name))

    def writer(self, fingerprint: bytes) -> SchemaVersion | None:
        """The schema version with this writer fingerprint, current or historical."""
        return self._by_fingerprint.get(fingerprint)

    def writers(self) -> tuple[SchemaVersion, ...]:
        return tuple(self._by_fingerprint.values())

    def _is_unfrozen(self, event_type: str) -> bool:
        frozen = self._history[event_type]
        return not frozen or frozen[-1].schema != self._current[event_type].schema

    def _current_version(self, event_type: str, schema: Schema) -> SchemaVersion:
        frozen = self._history[event_type]
        if frozen and frozen[-1].schema == schema:
            return frozen[-1]
        return SchemaVersion(event_type, len(frozen) + 1, schema, fingerprint_of(schema))


def load_registry(avro_dir: Path = AVRO_DIR, history_dir: Path = HISTORY_DIR) -> Registry:
    return Registry(load_current_schemas(avro_dir), load_history(history_dir))


@cache
def default_registry() -> Registry:
    """The registry of the schemas shipped in this package (loaded once)."""
    return load_registry()


def load_current_schemas(avro_dir: Path) -> dict[str, Schema]:
    """Self-contained current schema of every event defined in `avro_dir`, by event type."""
    raw = {path.stem: _read_json(path) for path in sorted(avro_dir.glob("*.avsc"))}
    shared = {stem: schema for stem, schema in raw.items() if not _is_event(schema)}
    named = _parse_shared(shared, avro_dir)
    events: dict[str, Schema] = {}
    for stem, schema in raw.items():
        if stem in shared:
            continue
        local = dict(named)
        parsed = parse_named(schema, local, str(avro_dir / f"{stem}.avsc"))
        _check_file_name(stem, parsed["name"], avro_dir)
        events[stem] = expand(parsed, local)
    return events


def load_history(history_dir: Path) -> dict[str, list[Schema]]:
    """Frozen versions per event type, oldest first; versions must be numbered 1..N without gaps."""
    if not history_dir.is_dir():
        return {}
    history: dict[str, list[Schema]] = {}
    for folder in sorted(p for p in history_dir.iterdir() if p.is_dir()):
        numbered = _numbered_files(folder)
        if numbered:
            history[folder.name] = [_read_json(numbered[n]) for n in sorted(numbered)]
    return history


def _numbered_files(folder: Path) -> dict[int, Path]:
    numbered: dict[int, Path] = {}
    for path in folder.glob("*.avsc"):
        match = _VERSION_FILE.fullmatch(path.name)
        if match is None:
            raise SchemaDefinitionError(f"{path}: history files must be named v<N>.avsc")
        numbered[int(match.group(1))] = path
    if numbered and sorted(numbered) != list(range(1, len(numbered) + 1)):
        raise SchemaDefinitionError(f"{folder}: versions {sorted(numbered)} are not 1..N without gaps")
    return numbered


def _versions(event_type: str, schemas: Sequence[Schema]) -> tuple[SchemaVersion, ...]:
    return tuple(
        _frozen_version(event_type, number, schema) for number, schema in enumerate(schemas, start=1)
    )


def _frozen_version(event_type: str, number: int, schema: Schema) -> SchemaVersion:
    normal = self_contained(schema, f"history of {event_type}, v{number}")
    return SchemaVersion(event_type, number, normal, fingerprint_of(normal))


def _parse_shared(shared: Mapping[str, Schema], avro_dir: Path) -> dict[str, Schema]:
    """Parse the non-event types in dependency order (retry until nothing is left or nothing parses)."""
    named: dict[str, Schema] = {}
    pending = dict(shared)
    while pending:
        progressed = False
        for stem, schema in list(pending.items()):
            attempt = dict(named)
            try:
                parsed = parse_named(schema, attempt, str(avro_dir / f"{stem}.avsc"))
            except SchemaDefinitionError:
                continue
            _check_file_name(stem, parsed["name"], avro_dir)
            named = attempt
            del pending[stem]
            progressed = True
        if not progressed:
            stem = next(iter(pending))
            parse_named(pending[stem], dict(named), str(avro_dir / f"{stem}.avsc"))  # raises the real error
            raise SchemaDefinitionError(f"{avro_dir / stem}.avsc: cannot be parsed")
    return named


def _is_event(schema: Schema) -> bool:
    if not isinstance(schema, dict) or not schema.get("fields"):
        return False
    first = schema["fields"][0]
    return isinstance(first, dict) and first.get("name") == "envelope"


def _check_file_name(stem: str, fullname: str, avro_dir: Path) -> None:
    if short_name(fullname) != stem:
        raise SchemaDefinitionError(
            f"{avro_dir / stem}.avsc defines {fullname}; name the file after the type"
        )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchemaDefinitionError(f"{path}: cannot read JSON: {exc}") from exc
