"""Builds events: the envelope (deterministic id, current schema version) plus the payload.

`make_event` fills nothing silently: a missing payload field is reported by the codec at encode
time (`EventEncodeError` naming the field), never defaulted here. Code outside `schemas/` writes
events through the typed constructors of `schemas/event_constructors.py` (generated), which take an
`EventOrigin` and every payload field by name, so that mypy checks each write.
Reads and writes no topics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from orl.schemas.errors import EventEncodeError
from orl.schemas.ids import deterministic_id
from orl.schemas.registry import default_registry
from orl.schemas.topics import DEAD_LETTER_EVENT, TOPICS

# Catalog order: the events of each topic, then the dead-letter event.
EVENT_TYPES: tuple[str, ...] = (*(event for events in TOPICS.values() for event in events), DEAD_LETTER_EVENT)


def make_event(
    event_type: str,
    *,
    namespace: str,
    producer: str,
    occurred_at_ms: int,
    id_parts: Sequence[object],
    session_id: str | None = None,
    turn_id: str | None = None,
    **payload: Any,
) -> dict[str, Any]:
    """An event dict ready for `orl.schemas.codec.encode`.

    `id_parts` are the inputs that determine the event (e.g. the request id, or the next-state
    event id and judge config version): the event id is `deterministic_id(event_type, namespace,
    *id_parts)`, so a re-run produces the same id.
    """
    if "envelope" in payload:
        raise EventEncodeError(
            f"{event_type}: pass envelope fields as keyword arguments, not an 'envelope' payload"
        )
    origin = EventOrigin(namespace, producer, occurred_at_ms, tuple(id_parts), session_id, turn_id)
    return {"envelope": envelope_for(event_type, origin), **payload}


class EventOrigin(NamedTuple):  # a tuple: one is made per event written, and tuples are the cheapest to make
    """Who wrote an event (`producer`), where (`namespace`, session, turn), when (`occurred_at_ms`),
    and the inputs its deterministic id comes from (`id_parts`, see `make_event`)."""

    namespace: str
    producer: str
    occurred_at_ms: int
    id_parts: tuple[object, ...]
    session_id: str | None = None
    turn_id: str | None = None


def envelope_for(event_type: str, origin: EventOrigin) -> dict[str, Any]:
    """The envelope of an event of `event_type` from `origin`: its deterministic id and current schema version."""
    namespace, producer, occurred_at_ms, id_parts, session_id, turn_id = origin
    return {
        "event_id": deterministic_id(event_type, namespace, *id_parts),
        "event_type": event_type,
        "schema_version": default_registry().current(event_type).version,  # raises UnknownEventTypeError
        "occurred_at": occurred_at_ms,
        "producer": producer,
        "namespace": namespace,
        "session_id": session_id,
        "turn_id": turn_id,
    }


def event_from_origin(event_type: str, origin: EventOrigin, payload: dict[str, Any]) -> dict[str, Any]:
    """The event of a generated constructor: `payload` is its own new dict, completed in place with
    the envelope (Avro encodes fields in schema order, so the dict's key order does not matter)."""
    payload["envelope"] = envelope_for(event_type, origin)
    return payload
