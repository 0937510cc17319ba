"""The one codec for every orl event: Avro single-object encoding.

Wire format: marker `C3 01`, the 8-byte little-endian CRC-64-AVRO fingerprint of the writer
schema's parsing canonical form, then the Avro binary body. `encode` writes with the event's
current schema (chosen by `envelope.event_type`) after a strict conformance check; `decode` finds
the writer schema by fingerprint (current or any frozen version) and resolves it to the current
reader schema, so events written by older producers still decode. Timestamps stay epoch-millis
ints (logical types are not applied). Every failure is an EventEncodeError / EventDecodeError.

With data keys installed (`install_data_keys`, which `orl`'s commands do from --key-store), an
event whose envelope names a session is sealed after encoding and opened before decoding
(orl.schemas.sealing): callers see the same events either way; a forgotten payload raises
PayloadForgotten (an EventDecodeError that carries the clear envelope).
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
from orl.schemas.sealing import (
    SEALED_HEADER,
    DataKeys,
    PayloadForgotten,
    open_event,
    seal_event,
    sealed_parts,
)

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

    def __init__(self, registry: Registry, data_keys: DataKeys | None = None) -> None:
        self._registry = registry
        self.data_keys = data_keys  # None: events are written in clear (sealed ones still need keys to read)
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
        envelope = event["envelope"]
        if self.data_keys is not None and envelope.get("session_id"):
            return seal_event(out.getvalue(), envelope, self.data_keys)
        return out.getvalue()

    def decode(self, data: Buffer) -> dict[str, Any]:
        reader = self._reader_for(data)
        if reader is None:  # a sealed event: open it, decode what it holds, keep the clear envelope
            envelope, plain = open_event(data, self.data_keys)
            event = self.decode(plain)
            event["envelope"] = envelope
            return event
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
        """The event type named by the header's fingerprint (of a sealed event: its clear envelope)."""
        reader = self._reader_for(data)
        if reader is None:
            return str(sealed_parts(data).envelope["event_type"])
        return reader.version.event_type

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

    def _reader_for(self, data: Buffer) -> _Reader | None:
        """The reader of the data's writer schema; None for a sealed event."""
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
        if bytes(data[:HEADER_LEN]) == SEALED_HEADER:
            return None
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


def install_data_keys(keys: DataKeys | None) -> None:
    """Seal every session's events with `keys` from now on in this process (None: write in clear)."""
    default_codec().data_keys = keys


def installed_data_keys() -> DataKeys | None:
    """The data keys `install_data_keys` gave this process (None: it writes in clear)."""
    return default_codec().data_keys


def encode(event: Mapping[str, Any]) -> bytes:
    """Encode an event with the current schema of its `envelope.event_type`."""
    return default_codec().encode(event)


def decode(data: Buffer) -> dict[str, Any]:
    """Decode an event written with any known version of its schema, as the current schema."""
    return default_codec().decode(data)


def event_type_of(data: Buffer) -> str:
    """The event type of encoded bytes, from the header alone."""
    return default_codec().event_type_of(data)


FORGOTTEN = "payload_forgotten"  # the key of `decode_or_forgotten`'s stub


def decode_or_forgotten(data: Buffer) -> dict[str, Any]:
    """decode(data); for an event whose payload was forgotten (`orl forget`), the stub
    `{"envelope": its clear envelope, "payload_forgotten": True}`, for readers that index or list
    events by their envelope (audit, export)."""
    try:
        return decode(data)
    except PayloadForgotten as forgotten:
        return {"envelope": forgotten.envelope, FORGOTTEN: True}


def payload_forgotten(data: Buffer) -> bool:
    """Whether these are a sealed event's bytes whose data key was destroyed (read from the clear
    parts; nothing is decrypted)."""
    keys = default_codec().data_keys
    if keys is None or bytes(data[:HEADER_LEN]) != SEALED_HEADER:
        return False
    return keys.key_for_reading(sealed_parts(data).key_id) is None
