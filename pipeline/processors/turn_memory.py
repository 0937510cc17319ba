"""What the effect stages remember of a session's turns: the request and the response, by turn id.

Both effect stages need the turn's messages and response when a later event (a next state, a
selected hint) names the turn; this module keeps that per-session memory, bounded in turns and
forgotten `retention_ms` after the session's last event. Topics are read in no particular order
relative to each other, so a trigger can arrive before the turn's request or response: it is kept
as pending and released once the turn is complete.
The memory is a frozen `TurnMemory` (its turns `RememberedTurn`s), stored by `TURN_MEMORY_STATE`;
the dict states stored before 2026-12-02 have the same keys and read as they are.
Reads and writes no topics itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from orl.pipeline.processors.event_building import (
    AnyEvent,
    event_id_of,
    event_type_of,
    occurred_at_of,
    remembered,
    turn_id_of,
)
from orl.pipeline.processors.state_codec import evolved, frozen_state
from orl.schemas.event_types import RequestReceived, ResponseGenerated

MAX_TURNS_PER_SESSION = 64
Trigger = Mapping[str, Any]  # what waits for the turn (JSON): a next state, a selected hint


@dataclass(frozen=True)
class RememberedTurn:
    """What was seen of one turn. The messages are kept as the recorded JSON text: the state is
    serialised after every batch that touches it, and one string is far cheaper to write than the
    parsed messages (parsed once the turn is complete)."""

    messages_json: str | None = None  # None until the main request is seen
    tools: Any = None  # the request's tools, parsed
    request_event_id: str | None = None
    response_text: str | None = None  # None until the response is seen
    response_token_ids: Sequence[int] | None = None  # None where the stage needs no tokens (the judge)
    temperature: float | None = None
    response_event_id: str | None = None
    pending: tuple[Trigger, ...] = ()


@dataclass(frozen=True)
class TurnMemory:
    last_activity_ms: int = 0
    seen: tuple[str, ...] = ()
    turns: Mapping[str, RememberedTurn] = field(default_factory=dict)


def _messages_as_text(raw: dict[str, Any]) -> dict[str, Any]:
    """A turn stored with its messages parsed (before messages_json) keeps them as text."""
    if "messages" not in raw:
        return raw
    upgraded = {key: value for key, value in raw.items() if key != "messages"}
    upgraded["messages_json"] = json.dumps(raw["messages"], ensure_ascii=False)
    return upgraded


TURN_MEMORY_STATE = frozen_state(TurnMemory, upgrades={RememberedTurn: _messages_as_text})


def seen_first(memory: TurnMemory | None, event: AnyEvent, window: int) -> TurnMemory | None:
    """The memory with the event's id recorded, or None if it was seen before (a redelivery)."""
    memory = memory or TurnMemory()
    seen = remembered(memory.seen, event_id_of(event), window)
    return None if seen is None else evolved(memory, seen=seen)


def remember_turn_event(memory: TurnMemory, event: AnyEvent, *, keep_tokens: bool = True) -> TurnMemory:
    """The memory with what a RequestReceived (main turns only) or ResponseGenerated says about its
    turn; `keep_tokens=False` leaves out what only the teacher reads (token ids, temperature, tools)."""
    last_activity_ms = max(memory.last_activity_ms, occurred_at_of(event))
    turn_id = turn_id_of(event)
    kind = event_type_of(event)
    if turn_id is None or kind not in ("RequestReceived", "ResponseGenerated"):
        return evolved(memory, last_activity_ms=last_activity_ms)
    turn = memory.turns.get(turn_id) or RememberedTurn()
    if kind == "RequestReceived":
        request = cast(RequestReceived, event)
        if request["turn_kind"] != "main":
            return evolved(memory, last_activity_ms=last_activity_ms)
        tools_json = request["tools_json"]
        turn = evolved(
            turn,
            messages_json=request["messages_json"],
            tools=json.loads(tools_json) if tools_json and keep_tokens else None,
            request_event_id=event_id_of(request),
        )
    else:
        response = cast(ResponseGenerated, event)
        turn = evolved(
            turn,
            response_text=response["response_text"],
            response_token_ids=list(response["response_token_ids"]) if keep_tokens else None,
            temperature=float(response["sampling"]["temperature"]) if keep_tokens else None,
            response_event_id=event_id_of(response),
        )
    return _with_turn(evolved(memory, last_activity_ms=last_activity_ms), turn_id, turn)


def add_trigger(memory: TurnMemory, turn_id: str, trigger: Trigger) -> TurnMemory:
    """The memory with `trigger` (JSON) waiting for the turn's request and response."""
    turn = memory.turns.get(turn_id) or RememberedTurn()
    return _with_turn(memory, turn_id, evolved(turn, pending=(*turn.pending, trigger)))


def take_ready_triggers(
    memory: TurnMemory, turn_id: str | None
) -> tuple[TurnMemory, dict[str, Any] | None, list[Trigger]]:
    """(the memory, the complete turn, its pending triggers, now removed from the memory), or
    (the memory, None, []) while the turn is incomplete."""
    turn = memory.turns.get(turn_id) if turn_id is not None else None
    complete = complete_turn(turn)
    if turn is None or complete is None or turn_id is None:
        return memory, None, []
    if not turn.pending:
        return memory, complete, []
    return _with_turn(memory, turn_id, evolved(turn, pending=())), complete, list(turn.pending)


def complete_turn(turn: RememberedTurn | None) -> dict[str, Any] | None:
    """The turn as an effect call carries it (JSON, its messages parsed), if both its main request
    and its response were seen."""
    if turn is None or turn.response_text is None or turn.messages_json is None:
        return None
    return {
        "messages": json.loads(turn.messages_json),
        "tools": turn.tools,
        "request_event_id": turn.request_event_id,
        "response_text": turn.response_text,
        "response_token_ids": turn.response_token_ids,
        "temperature": turn.temperature,
        "response_event_id": turn.response_event_id,
    }


def forget_if_idle(memory: TurnMemory, now_ms: int, retention_ms: int) -> TurnMemory | None:
    return None if now_ms - memory.last_activity_ms > retention_ms else memory


def _with_turn(memory: TurnMemory, turn_id: str, turn: RememberedTurn) -> TurnMemory:
    """The memory with `turn` stored, the oldest turns dropped beyond MAX_TURNS_PER_SESSION."""
    turns = dict(memory.turns)
    turns[turn_id] = turn
    while len(turns) > MAX_TURNS_PER_SESSION:
        del turns[next(iter(turns))]
    return evolved(memory, turns=turns)
