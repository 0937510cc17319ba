"""Sealing: the payload of every event that names a session is encrypted with that session's data key.

Erasure on an immutable log works by crypto-shredding: each session gets its own random 512-bit
AES-SIV data key, kept in a key store apart from the log (orl.connectors.key_store). Destroying the
key (`orl forget`) makes every copy of the session's payloads unreadable at once: the log, its
archives, spools, changelogs and exports, wherever they were copied.

A sealed event is an Avro record of its own (`SealedEvent`, single-object encoded like every
event, under its own fingerprint): the event's envelope in clear (ids, type, session, namespace,
time: ordering, keying, linking and lineage keep working), the data key's id, and the AES-SIV
ciphertext of the event's ordinary encoding. The associated data binds the ciphertext to the
envelope's event id, type and session and to the key id, so a payload cannot be moved to another
event. The namespace is not bound: a replay rewrites it in place.

AES-SIV (RFC 5297) is deterministic: the same event sealed twice under the same key is the same
bytes. So sealing keeps what orl's exactly-once rests on: a stage restarted after kill -9, a second
worker, a replay write byte-identical events, and the log's duplicate checks and the golden streams
still hold. It tells an onlooker no more than that two sealed events carry the same payload, and
event ids already make every event's payload distinct.

`seal_blob` / `open_blob` do the same for bytes that are no event (a processor's session state on
its changelog, a stored Responses API conversation in a spool).

The cryptography is the `cryptography` package's AESSIV; orl writes none of its own. Pure logic:
the keys come from a `DataKeys` (the key store implements it); reads and writes no files.
"""

from __future__ import annotations

import json
import struct
from io import BytesIO
from typing import Any, NamedTuple, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from orl.schemas.errors import EventDecodeError, OrlError
from orl.schemas.registry import AVRO_DIR
from orl.schemas.schema_forms import fingerprint_of, self_contained, without_logical_types

KEY_BYTES = 64  # AES-SIV with two AES-256 keys (one for the synthetic IV, one for the cipher)


class PayloadForgotten(EventDecodeError):
    """The payload's data key was destroyed (`orl forget`): only the envelope can still be read.

    `envelope` is the sealed event's clear envelope (None for a sealed blob); `session_id` the
    session whose key it was. Readers skip such an event and say how many they skipped."""

    def __init__(self, message: str, session_id: str, envelope: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.envelope = envelope


class UnknownDataKey(OrlError):
    """A sealed payload names a data key that the key store never had (a different deployment's key
    store, or a key store that was deleted): not the same as forgotten."""


class DataKeys(Protocol):
    """Where sealing gets its keys: one live key per session, and every key ever made by id."""

    def key_for_writing(self, session_id: str) -> tuple[str, bytes]:
        """(key id, key) of the session's live data key, made on first use."""
        ...

    def key_for_reading(self, key_id: str) -> bytes | None:
        """The key with this id; None when it was destroyed; raises UnknownDataKey when it never existed."""
        ...

    def was_forgotten(self, session_id: str) -> bool:
        """Whether `orl forget` destroyed a key of this session (it stays forgotten: no state is kept for it)."""
        ...

    def assign_tenant(self, session_id: str, tenant: str) -> None:
        """Record whose session it is (the id of the client key that opened it), for `orl forget --tenant`."""
        ...

    def name_tenant(self, tenant: str, name: str) -> None:
        """Record that the client key with id `tenant` belongs to the named tenant `name`."""
        ...


def new_data_key() -> bytes:
    return AESSIV.generate_key(bit_length=KEY_BYTES * 8)


def _sealed_schema() -> dict[str, Any]:
    envelope = json.loads((AVRO_DIR / "Envelope.avsc").read_text())
    schema = {
        "type": "record",
        "name": "SealedEvent",
        "namespace": "orl.sealing",
        "doc": "An event whose payload is encrypted with its session's data key (orl.schemas.sealing).",
        "fields": [
            {"name": "envelope", "type": envelope},
            {"name": "key_id", "type": "string"},
            {
                "name": "ciphertext",
                "type": "bytes",
                "doc": "AES-SIV of the event's ordinary encoding (its 16-byte synthetic IV first).",
            },
        ],
    }
    return self_contained(schema, "SealedEvent")


SEALED_SCHEMA = _sealed_schema()
SEALED_HEADER = b"\xc3\x01" + fingerprint_of(SEALED_SCHEMA)  # the Avro single-object marker + fingerprint
_PARSED = parse_schema(without_logical_types(SEALED_SCHEMA))


class SealedParts(NamedTuple):
    envelope: dict[str, Any]
    key_id: str
    ciphertext: bytes


def is_sealed(data: bytes | bytearray | memoryview) -> bool:
    return bytes(data[: len(SEALED_HEADER)]) == SEALED_HEADER


def _event_aad(envelope: dict[str, Any], key_id: str) -> bytes:
    parts = (envelope["event_id"], envelope["event_type"], envelope["session_id"] or "", key_id)
    return b"orl-sealed-event\x00" + "\x00".join(parts).encode()


def seal_event(encoded: bytes, envelope: dict[str, Any], keys: DataKeys) -> bytes:
    """The sealed form of an encoded event (`encoded` is orl.schemas.codec's ordinary encoding)."""
    key_id, key = keys.key_for_writing(envelope["session_id"])
    ciphertext = AESSIV(key).encrypt(encoded, [_event_aad(envelope, key_id)])
    out = BytesIO()
    out.write(SEALED_HEADER)
    record = {"envelope": envelope, "key_id": key_id, "ciphertext": ciphertext}
    schemaless_writer(out, _PARSED, record)
    return out.getvalue()


def sealed_parts(data: bytes | bytearray | memoryview) -> SealedParts:
    """The clear parts of a sealed event (raises EventDecodeError when they do not parse)."""
    source = BytesIO(bytes(data))
    source.seek(len(SEALED_HEADER))
    try:
        record = schemaless_reader(source, _PARSED, None)
    except (EOFError, ValueError, TypeError, IndexError, KeyError, struct.error) as exc:
        raise EventDecodeError(f"SealedEvent: body does not parse: {type(exc).__name__}: {exc}") from exc
    if not isinstance(record, dict) or source.tell() != len(data):
        raise EventDecodeError("SealedEvent: trailing bytes after the body")
    return SealedParts(record["envelope"], record["key_id"], record["ciphertext"])


def open_event(data: bytes | bytearray | memoryview, keys: DataKeys | None) -> tuple[dict[str, Any], bytes]:
    """(clear envelope, the event's ordinary encoding) of a sealed event.

    Raises PayloadForgotten when the key was destroyed, UnknownDataKey when the key store never had
    it, EventDecodeError when there is no key store or the ciphertext does not authenticate."""
    parts = sealed_parts(data)
    envelope = parts.envelope
    session_id = envelope["session_id"] or ""
    if keys is None:
        raise EventDecodeError(
            f"{envelope['event_type']} {envelope['event_id']}: its payload is sealed and this process has no "
            "key store (--key-store / ORL_KEY_STORE; orl's commands open <data-dir>/keys.db)"
        )
    key = keys.key_for_reading(parts.key_id)
    if key is None:
        raise PayloadForgotten(
            f"{envelope['event_type']} {envelope['event_id']}: the payload of session {session_id!r} was "
            "forgotten (its data key is destroyed)",
            session_id,
            envelope,
        )
    try:
        plain = AESSIV(key).decrypt(parts.ciphertext, [_event_aad(envelope, parts.key_id)])
    except InvalidTag:
        raise EventDecodeError(
            f"{envelope['event_type']} {envelope['event_id']}: the sealed payload does not authenticate "
            "(altered, or moved from another event)"
        ) from None
    return envelope, plain


BLOB_MAGIC = b"orl-sealed-blob-2\x00"


def seal_blob(plaintext: bytes, session_id: str, purpose: str, keys: DataKeys) -> bytes:
    """`plaintext` sealed with the session's data key; `purpose` (e.g. "changelog:judge") is bound in."""
    key_id, key = keys.key_for_writing(session_id)
    ciphertext = AESSIV(key).encrypt(plaintext, [_blob_aad(session_id, purpose, key_id)])
    key_id_bytes = key_id.encode()
    return BLOB_MAGIC + bytes([len(key_id_bytes)]) + key_id_bytes + ciphertext


def is_sealed_blob(data: bytes) -> bool:
    return data.startswith(BLOB_MAGIC)


def open_blob(data: bytes, session_id: str, purpose: str, keys: DataKeys) -> bytes:
    """The plaintext of `seal_blob`'s output; raises PayloadForgotten when the key was destroyed."""
    pos = len(BLOB_MAGIC)
    length = data[pos]
    key_id = data[pos + 1 : pos + 1 + length].decode()
    ciphertext = data[pos + 1 + length :]
    key = keys.key_for_reading(key_id)
    if key is None:
        raise PayloadForgotten(f"{purpose} of session {session_id!r} was forgotten", session_id)
    try:
        return AESSIV(key).decrypt(ciphertext, [_blob_aad(session_id, purpose, key_id)])
    except InvalidTag:
        raise EventDecodeError(f"{purpose} of session {session_id!r} does not authenticate") from None


def _blob_aad(session_id: str, purpose: str, key_id: str) -> bytes:
    return b"orl-sealed-blob\x00" + "\x00".join((purpose, session_id, key_id)).encode()
