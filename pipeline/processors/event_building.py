"""Reading envelopes, naming producers, and the processors' redelivery memory.

Every output event takes its namespace and session from its trigger, its `occurred_at` from the
trigger's (never a clock read), and its id from the trigger ids plus the emitting processor's
logic and config versions, so re-processing the same input gives byte-identical events; the events
are built by the typed constructors of orl.schemas.event_constructors.
Reads and writes no topics itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orl.schemas.event_types import Envelope

Event = dict[str, Any]
State = dict[str, Any]
# What the envelope readers accept: an untyped event or any TypedDict of orl.schemas.event_types.
AnyEvent = Mapping[str, Any]


def envelope_of(event: AnyEvent) -> Envelope:
    envelope: Envelope = event["envelope"]
    return envelope


def event_type_of(event: AnyEvent) -> str:
    return str(envelope_of(event)["event_type"])


def event_id_of(event: AnyEvent) -> str:
    return str(envelope_of(event)["event_id"])


def namespace_of(event: AnyEvent) -> str:
    return str(envelope_of(event)["namespace"])


def session_id_of(event: AnyEvent) -> str | None:
    session_id = envelope_of(event)["session_id"]
    return None if session_id is None else str(session_id)


def turn_id_of(event: AnyEvent) -> str | None:
    turn_id = envelope_of(event)["turn_id"]
    return None if turn_id is None else str(turn_id)


def occurred_at_of(event: AnyEvent) -> int:
    return int(envelope_of(event)["occurred_at"])


def producer_of(event: AnyEvent) -> str:
    return str(envelope_of(event)["producer"])


def producer_name(processor_name: str, logic_version: str) -> str:
    """The envelope producer of a processor: component and logic version."""
    return f"pipeline.{processor_name}/{logic_version}"


def emitted_by(event: AnyEvent, processor_name: str) -> bool:
    """Whether `event` was written by the named processor (processors skip their own outputs)."""
    return producer_of(event).startswith(f"pipeline.{processor_name}/")


def remembered(seen: tuple[str, ...], event_id: str, window: int) -> tuple[str, ...] | None:
    """A typed state's bounded seen ids with `event_id` added (the oldest dropped beyond `window`);
    None if it was there already (a redelivery)."""
    if event_id in seen:
        return None
    seen = (*seen, event_id)
    return seen[-window:] if len(seen) > window else seen


def remember_event(state: State, event_id: str, window: int) -> bool:
    """Record `event_id` in the state's bounded seen list; False if it was already there (redelivery)."""
    seen: list[str] = state.setdefault("seen", [])
    if event_id in seen:
        return False
    seen.append(event_id)
    if len(seen) > window:
        del seen[: len(seen) - window]
    return True
