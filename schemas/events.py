"""Builds events: the envelope (deterministic id, current schema version) plus the payload.

`make_event` fills nothing silently: a missing payload field is reported by the codec at encode
time (`EventEncodeError` naming the field), never defaulted here. Code outside `schemas/` writes
events through the typed constructors of `schemas/event_constructors.py` (generated), which take an
`EventOrigin` and every payload field by name, so that mypy checks each write.
Reads and writes no topics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    version = default_registry().current(event_type).version  # raises UnknownEventTypeError
    envelope = {
        "event_id": deterministic_id(event_type, namespace, *id_parts),
        "event_type": event_type,
        "schema_version": version,
        "occurred_at": occurred_at_ms,
        "producer": producer,
        "namespace": namespace,
        "session_id": session_id,
        "turn_id": turn_id,
    }
    return {"envelope": envelope, **payload}


@dataclass(frozen=True)
class EventOrigin:
    """Who wrote an event (`producer`), where (`namespace`, session, turn), when (`occurred_at_ms`),
    and the inputs its deterministic id comes from (`id_parts`, see `make_event`)."""

    namespace: str
    producer: str
    occurred_at_ms: int
    id_parts: tuple[object, ...]
    session_id: str | None = None
    turn_id: str | None = None


def event_from_origin(event_type: str, origin: EventOrigin, payload: Mapping[str, Any]) -> dict[str, Any]:
    """`make_event` for an origin and a payload mapping (what the generated constructors call)."""
    return make_event(
        event_type,
        namespace=origin.namespace,
        producer=origin.producer,
        occurred_at_ms=origin.occurred_at_ms,
        id_parts=origin.id_parts,
        session_id=origin.session_id,
        turn_id=origin.turn_id,
        **payload,
    )
