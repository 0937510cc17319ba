"""Building events with make_event."""

from __future__ import annotations

import pytest
from orl.schemas.codec import decode, encode
from orl.schemas.errors import EventEncodeError, UnknownEventTypeError
from orl.schemas.events import EVENT_TYPES, make_event
from orl.schemas.ids import deterministic_id
from orl.schemas.registry import default_registry


def closed(**overrides: object) -> dict[str, object]:
    arguments: dict[str, object] = {
        "namespace": "live",
        "producer": "pipeline/0.1.0",
        "occurred_at_ms": 1_000,
        "id_parts": ["sess-1"],
        "session_id": "sess-1",
        "reason": "explicit",
        "last_turn_id": None,
    }
    return make_event("SessionClosed", **(arguments | overrides))  # type: ignore[arg-type]


def test_envelope_is_filled_from_the_arguments() -> None:
    envelope = closed()["envelope"]
    assert envelope == {
        "event_id": deterministic_id("SessionClosed", "live", "sess-1"),
        "event_type": "SessionClosed",
        "schema_version": default_registry().current("SessionClosed").version,
        "occurred_at": 1_000,
        "producer": "pipeline/0.1.0",
        "namespace": "live",
        "session_id": "sess-1",
        "turn_id": None,
    }


def test_same_inputs_same_id_other_namespace_other_id() -> None:
    assert closed()["envelope"]["event_id"] == closed(occurred_at_ms=2_000)["envelope"]["event_id"]  # type: ignore[index]
    assert closed()["envelope"]["event_id"] != closed(namespace="replay")["envelope"]["event_id"]  # type: ignore[index]


def test_missing_payload_field_fails_at_encode() -> None:
    event = make_event("SessionClosed", namespace="live", producer="p/1", occurred_at_ms=1, id_parts=["s"])
    with pytest.raises(EventEncodeError, match=r"SessionClosed\.reason: missing"):
        encode(event)


def test_built_event_round_trips() -> None:
    event = closed()
    assert decode(encode(event)) == event


def test_unknown_event_type() -> None:
    with pytest.raises(UnknownEventTypeError):
        make_event("Nope", namespace="live", producer="p/1", occurred_at_ms=1, id_parts=[])


def test_envelope_cannot_be_passed_as_payload() -> None:
    with pytest.raises(EventEncodeError, match="envelope"):
        closed(envelope={})


def test_event_types_are_in_catalog_order() -> None:
    assert EVENT_TYPES[:2] == ("RequestReceived", "ResponseGenerated")
    assert EVENT_TYPES[-1] == "DeadLettered"
