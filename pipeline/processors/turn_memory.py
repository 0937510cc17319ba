"""What the effect stages remember of a session's turns: the request and the response, by turn id.

Both effect stages need the turn's messages and response when a later event (a next state, a
selected hint) names the turn; this module keeps that per-session memory, bounded in turns and
forgotten `retention_ms` after the session's last event. Topics are read in no particular order
relative to each other, so a trigger can arrive before the turn's request or response: it is kept
as pending and released once the turn is complete.
Reads and writes no topics itself.
"""

from __future__ import annotations

import json
from typing import Any, cast

from orl.pipeline.processors.event_building import (
    AnyEvent,
    State,
    event_id_of,
    event_type_of,
    occurred_at_of,
    turn_id_of,
)
from orl.schemas.event_types import RequestReceived, ResponseGenerated

MAX_TURNS_PER_SESSION = 64


def new_turn_memory() -> State:
    return {"turns": {}, "seen": [], "last_activity_ms": 0}


def remember_turn_event(state: State, event: AnyEvent) -> None:
    """Store what a RequestReceived (main turns only) or ResponseGenerated says about its turn."""
    state["last_activity_ms"] = max(state["last_activity_ms"], occurred_at_of(event))
    turn_id = turn_id_of(event)
    kind = event_type_of(event)
    if turn_id is None:
        return
    if kind == "RequestReceived":
        _remember_request(state, turn_id, cast(RequestReceived, event))
    elif kind == "ResponseGenerated":
        _remember_response(state, turn_id, cast(ResponseGenerated, event))


def _remember_request(state: State, turn_id: str, request: RequestReceived) -> None:
    if request["turn_kind"] != "main":
        return
    turn = state["turns"].setdefault(turn_id, {})
    # Kept as the recorded JSON text: the state is serialised after every batch that touches it,
    # and one string is far cheaper to write than the parsed messages (parsed in complete_turn).
    turn["messages_json"] = request["messages_json"]
    tools_json = request.get("tools_json")
    turn["tools"] = json.loads(tools_json) if tools_json else None
    turn["request_event_id"] = event_id_of(request)
    _bound(state)


def _remember_response(state: State, turn_id: str, response: ResponseGenerated) -> None:
    turn = state["turns"].setdefault(turn_id, {})
    turn["response_text"] = response["response_text"]
    turn["response_token_ids"] = list(response["response_token_ids"])
    turn["temperature"] = float(response["sampling"]["temperature"])
    turn["response_event_id"] = event_id_of(response)
    _bound(state)


def add_trigger(state: State, turn_id: str, trigger: dict[str, Any]) -> None:
    """Remember that `trigger` (JSON) waits for the turn's request and response."""
    state["turns"].setdefault(turn_id, {}).setdefault("pending", []).append(trigger)
    _bound(state)


def take_ready_triggers(
    state: State, turn_id: str | None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the complete turn, its pending triggers, now removed), or (None, []) while it is incomplete."""
    turn = complete_turn(state, turn_id)
    if turn is None or turn_id is None:
        return None, []
    triggers = state["turns"][turn_id].pop("pending", [])
    turn.pop("pending", None)
    return turn, triggers


def complete_turn(state: State | None, turn_id: str | None) -> dict[str, Any] | None:
    """A copy of the remembered turn, its messages parsed, if both its main request and its response
    were seen."""
    if state is None or turn_id is None:
        return None
    turn = state["turns"].get(turn_id)
    if turn is None or "response_text" not in turn:
        return None
    if "messages_json" in turn:
        complete = dict(turn)
        complete["messages"] = json.loads(complete.pop("messages_json"))
        return complete
    return dict(turn) if "messages" in turn else None  # a state stored before messages_json


def forget_if_idle(state: State, now_ms: int, retention_ms: int) -> State | None:
    return None if now_ms - state.get("last_activity_ms", 0) > retention_ms else state


def _bound(state: State) -> None:
    while len(state["turns"]) > MAX_TURNS_PER_SESSION:
        state["turns"].pop(next(iter(state["turns"])))
