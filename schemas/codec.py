"""The one codec for every orl event: Avro single-object encoding.

Wire format: marker `C3 01`, the 8-byte little-endian CRC-64-AVRO fingerprint of the writer
schema's parsing canonical form, then the Avro binary body. `encode` writes with the event's
current schema (chosen by `envelope.event_type`) after a strict conformance check; `decode` finds
the writer schema by fingerprint (current or any frozen version) and resolves it to the current
reader schema, so events written by older producers still decode. Timestamps stay epoch-millis
ints (logical types are not applied). Every failure is an EventEncodeError / EventDecodeError.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from orl.schemas.conformance import Check, compile_check
from orl.schemas.errors import EventDecodeError, EventEncodeError, UnknownEventTypeError
from orl.schemas.registry import Registry, SchemaVersion, default_registry
from orl.schemas.schema_forms import Schema, without_logical_types

MARKER = b"\xc3\x01"
HEADER_LEN = len(MARKER) + 8
Buffer = bytes | bytearray | memoryview

# What fastavro, struct and the str decoder raise on a body that is not what the schema says.
_BODY_ERRORS = (
    EOFError,
    ValueError,  # includes UnicodeDecodeError
    TypeError,
    IndexError,
    KeyError,
    OverflowError,
    MemoryError,
    struct.error,
    SchemaResolutionError,
)


@dataclass(frozen=True)
class _Writer:
    event_type: str
    header: bytes
    schema: Schema
    check: Check


@dataclass(frozen=True)
class _Reader:
    version: SchemaVersion
    writer_schema: Schema
    reader_schema: Schema | None  # None when the writer is the current schema


class Codec:
    """Encodes and decodes events with the schemas of one registry."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        current = {name: registry.current(name) for name in registry.event_types}
        parsed = {name: _codec_schema(version.schema) for name, version in current.items()}
        self._writers = {
            name: _Writer(name, MARKER + version.fingerprint, parsed[name], compile_check(version.schema))
            for name, version in current.items()
        }
        self._readers = {
            version.fingerprint: _reader(version, current[version.event_type], parsed[version.event_type])
            for version in registry.writers()
        }
        self._readers_by_header = {
            MARKER + fingerprint: reader for fingerprint, reader in self._readers.items()
        }

    def encode(self, event: Mapping[str, Any]) -> bytes:
        writer = self._writer_for(event)
        problem = writer.check(event, writer.event_type)
        if problem is not None:
            raise EventEncodeError(problem)
        out = BytesIO()
        out.write(writer.header)
        try:
            schemaless_writer(out, writer.schema, event)
        except (ValueError, TypeError, OverflowError, struct.error) as exc:
            raise EventEncodeError(f"{writer.event_type}: {type(exc).__name__}: {exc}") from exc
        return out.getvalue()

    def decode(self, data: Buffer) -> dict[str, Any]:
        reader = self._reader_for(data)
        source = BytesIO(data)
        source.seek(HEADER_LEN)
        try:
            record = schemaless_reader(source, reader.writer_schema, reader.reader_schema)
        except _BODY_ERRORS as exc:
            raise EventDecodeError(
                f"{_label(reader.version)}: body does not parse: {type(exc).__name__}: {exc}"
            ) from exc
        if source.tell() != len(data):
            raise EventDecodeError(
                f"{_label(reader.version)}: {len(data) - source.tell()} trailing bytes after the body"
            )
        if not isinstance(record, dict):
            raise EventDecodeError(f"{_label(reader.version)}: body is not a record")
        return record

    def event_type_of(self, data: Buffer) -> str:
        """The event type named by the header's fingerprint; the body is not read."""
        return self._reader_for(data).version.event_type

    def _writer_for(self, event: Mapping[str, Any]) -> _Writer:
        if not isinstance(event, Mapping):
            raise EventEncodeError(f"an event must be a mapping, got {type(event).__name__}")
        envelope = event.get("envelope")
        event_type = envelope.get("event_type") if isinstance(envelope, Mapping) else None
        if not isinstance(event_type, str):
            raise EventEncodeError(
                "event has no envelope.event_type (build events with orl.schemas.events.make_event)"
            )
        writer = self._writers.get(event_type)
        if writer is None:
            self._registry.current(event_type)  # raises UnknownEventTypeError listing the known types
            raise UnknownEventTypeError(event_type)
        return writer

    def _reader_for(self, data: Buffer) -> _Reader:
        if type(data) is bytes:  # the common case: one lookup by marker + fingerprint
            reader = self._readers_by_header.get(data[:HEADER_LEN])
            if reader is not None:
                return reader
        if not isinstance(data, bytes | bytearray | memoryview):
            raise EventDecodeError(f"expected bytes, got {type(data).__name__}")
        if len(data) < HEADER_LEN:
            raise EventDecodeError(
                f"too short for an event: {len(data)} bytes, the header alone is {HEADER_LEN}"
            )
        if data[:2] != MARKER:
            raise EventDecodeError(
                f"bad marker {bytes(data[:2]).hex()}: not Avro single-object encoding (c301)"
            )
        fingerprint = bytes(data[2:HEADER_LEN])
        reader = self._readers.get(fingerprint)
        if reader is None:
            raise EventDecodeError(f"unknown writer schema fingerprint {fingerprint.hex()}")
        return reader


def _codec_schema(schema: Schema) -> Schema:
    return parse_schema(without_logical_types(schema))


def _reader(version: SchemaVersion, current: SchemaVersion, current_parsed: Schema) -> _Reader:
    if version.fingerprint == current.fingerprint:
        return _Reader(version, current_parsed, None)
    return _Reader(version, _codec_schema(version.schema), current_parsed)


def _label(version: SchemaVersion) -> str:
    return f"{version.event_type} v{version.version}"


@cache
def default_codec() -> Codec:
    """The codec of the schemas shipped in this package."""
    return Codec(default_registry())


def encode(event: Mapping[str, Any]) -> bytes:
    """Encode an event with the current schema of its `envelope.event_type`."""
    return default_codec().encode(event)


def decode(data: Buffer) -> dict[str, Any]:
    """Decode an event written with any known version of its schema, as the current schema."""
    return default_codec().decode(data)


def event_type_of(data: Buffer) -> str:
    """The event type of encoded bytes, from the header alone."""
    return default_codec().event_type_of(data)
