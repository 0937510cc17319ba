"""turn_linker: joins requests and responses into turns and gives each main turn its next state.

Reads requests (RequestReceived), responses (ResponseGenerated), next_states (NextStateObserved
from connectors; its own are skipped) and sessions (SessionClosed from serving; its own skipped).
Writes next_states (NextStateObserved, source "conversation" or "session_end") and sessions
(SessionClosed, reason "idle_timeout").

- When the session's next MAIN request arrives, the previous main turn (greatest turn_index below
  it) gets a NextStateObserved holding ALL messages appended after its response (tool results and
  the new user message), role = the last appended message's role. It is emitted once that turn's
  response is known too, so a response that arrives after the next request (or before its own
  request) is handled. Side turns are recorded but never get a conversation next state.
- The last turn is judged on what is known: when the session closes (explicit SessionClosed from
  serving, or no activity for `idle_timeout_s`, detected by `on_tick`), its last main turn gets a
  NextStateObserved with source "session_end", role "environment" and a fixed content saying the
  user ended without replying, unless a connector already gave it a next state. The judge can
  then still vote (silence after an answer is weak evidence, and the judge prompt says so), and
  the session's state no longer leaks: a closed session keeps a small tombstone (for redelivery
  detection) that `on_tick` deletes after `closed_retention_s`.
- Topics are read in no fixed order relative to each other, so an explicit SessionClosed can be
  processed before the session's last requests. The close is therefore order-insensitive: it
  names its last turn (`last_turn_id`), which gets the session_end state once its request and
  response are known; requests that occurred at or before an explicit close belong to the
  closed session and never reopen it. A close that names no main turn is settled by `on_tick`
  `CLOSE_GRACE_S` after it, on the then-last main turn.
State per session: namespace, seen, last_activity_ms, closed, closed_at_ms, closed_reason,
session_end (the explicit close's trigger, until its turn is known), waiting_responses
(request_id -> response id, for responses before requests) and turns (turn_id -> index, kind,
request_id, request_event_id, response_event_id, message_count, messages_digest, pending,
next_state ("none" | "pending" | "emitted"), external).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from typing import Any

from orl.pipeline.processors import conversation_diff
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit, ProcessResult
from orl.pipeline.processors.event_building import (
    AnyEvent,
    Event,
    State,
    build_event,
    emitted_by,
    envelope_of,
    event_id_of,
    event_type_of,
    occurred_at_of,
    producer_name,
    remember_event,
    session_id_of,
    turn_id_of,
)
from orl.pipeline.processors.next_state_text import next_state_role, render_messages
from orl.pipeline.processors.topology import stage_named
from orl.schemas.event_types import NextStateObserved, RequestReceived, ResponseGenerated, SessionClosed

logger = logging.getLogger(__name__)

NAME = "turn_linker"
LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)
SESSION_END_CONTENT = "(the user ended the session without replying)"
RETRY_CONTENT = "(the user sent the same conversation again without a new message: a retry)"
# How long (event time) a close that names no known main turn waits for the session's late events.
CLOSE_GRACE_S = 30.0


class TurnLinker:
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs

    def process(self, state: State | None, event: Event, config: PipelineConfig) -> ProcessResult:
        state = state if state is not None else new_state(event)
        if not remember_event(state, event_id_of(event), config.seen_window):
            return state, []
        handler = HANDLERS.get(event_type_of(event))
        if handler is None or emitted_by(event, NAME):
            return state, []
        return state, handler(state, event, config)

    def on_tick(self, state: State, now_ms: int, config: PipelineConfig) -> ProcessResult:
        if state["closed"]:
            if state.get("session_end") and now_ms - state["closed_at_ms"] >= CLOSE_GRACE_S * 1000:
                # a new object (the contract): settling changes the state even when it emits nothing
                state = copy.deepcopy(state)
                return state, settle_session_end(state, config)
            expired = now_ms - state["closed_at_ms"] >= config.linker.closed_retention_s * 1000
            return (None, []) if expired else (state, [])
        deadline_ms = state["last_activity_ms"] + int(config.linker.idle_timeout_s * 1000)
        if now_ms < deadline_ms:
            return state, []
        return state, close_idle_session(state, deadline_ms, config)


def new_state(event: Event) -> State:
    return {
        "namespace": envelope_of(event)["namespace"],
        "session_id": session_id_of(event),
        "seen": [],
        "last_activity_ms": occurred_at_of(event),
        "closed": False,
        "closed_at_ms": None,
        "closed_reason": None,
        "session_end": None,
        "waiting_responses": {},
        "turns": {},
    }


def touch(state: State, event: AnyEvent) -> None:
    state["last_activity_ms"] = max(state["last_activity_ms"], occurred_at_of(event))


def on_request(state: State, event: RequestReceived, config: PipelineConfig) -> list[Emit]:
    touch(state, event)
    if state["closed"] and not belongs_to_closed_session(state, event):
        reopen(state)  # the user came back after the close: the session goes on
    turn_id = turn_id_of(event) or event["request_id"]
    messages: list[dict[str, Any]] = json.loads(event["messages_json"])
    waiting = state["waiting_responses"].pop(event["request_id"], None)
    turn = {
        "index": int(event["turn_index"]),
        "kind": event["turn_kind"],
        "request_id": event["request_id"],
        "request_event_id": event_id_of(event),
        "response_event_id": waiting,
        "message_count": len(messages),
        "messages_digest": conversation_diff.messages_digest(messages),
        "pending": None,
        "next_state": "none",
        "external": turn_id in state.get("external_turns", []),
    }
    state["turns"][turn_id] = turn
    if turn["kind"] != "main":
        return []
    previous_id = previous_main_turn(state, turn["index"])
    if previous_id is not None:
        link_conversation(state, previous_id, messages, event, config)
    assign_named_session_end(state)
    return flush_pending(state, config)


def belongs_to_closed_session(state: State, request: RequestReceived) -> bool:
    """A request that occurred at or before an explicit close was only read after it: it is part of the session."""
    return state.get("closed_reason") == "explicit" and occurred_at_of(request) <= state["closed_at_ms"]


def reopen(state: State) -> None:
    state["closed"], state["closed_at_ms"] = False, None
    state["closed_reason"], state["session_end"] = None, None


def previous_main_turn(state: State, index: int) -> str | None:
    earlier = [
        (t["index"], tid) for tid, t in state["turns"].items() if t["kind"] == "main" and t["index"] < index
    ]
    return max(earlier)[1] if earlier else None


def last_main_turn(state: State) -> str | None:
    mains = [(t["index"], tid) for tid, t in state["turns"].items() if t["kind"] == "main"]
    return max(mains)[1] if mains else None


def link_conversation(
    state: State,
    turn_id: str,
    messages: list[dict[str, Any]],
    trigger: RequestReceived,
    config: PipelineConfig,
) -> None:
    turn = state["turns"][turn_id]
    if turn["next_state"] != "none":
        return
    appended, how = conversation_diff.appended_messages(
        turn["message_count"], turn["messages_digest"], messages
    )
    if how != conversation_diff.PREFIX:
        logger.info(
            "turn %s: history was rewritten; next state taken after the last assistant message", turn_id
        )
    content = render_messages(appended) if appended else RETRY_CONTENT
    turn["pending"] = {
        "source": "conversation",
        "role": next_state_role(appended),
        "content": content,
        "messages_json": json.dumps(appended, ensure_ascii=False, sort_keys=True),
        "trigger_event_id": event_id_of(trigger),
        "occurred_at_ms": occurred_at_of(trigger),
    }
    turn["next_state"] = "pending"


def flush_pending(state: State, config: PipelineConfig) -> list[Emit]:
    """Emit every pending next state whose turn has its response; in turn order."""
    emits = []
    for turn_id, turn in sorted(state["turns"].items(), key=lambda item: item[1]["index"]):
        if turn["next_state"] == "pending" and turn["response_event_id"] is not None:
            emits.append(Emit("next_states", next_state_event(state, turn_id, turn["pending"], config)))
            turn["pending"], turn["next_state"] = None, "emitted"
    return emits


def next_state_event(state: State, turn_id: str, pending: dict[str, Any], config: PipelineConfig) -> Event:
    return build_event(
        "NextStateObserved",
        producer=PRODUCER,
        namespace=state["namespace"],
        session_id=state["session_id"],
        turn_id=turn_id,
        occurred_at_ms=pending["occurred_at_ms"],
        id_parts=(turn_id, pending["source"], pending["trigger_event_id"], config.linker.version),
        source=pending["source"],
        role=pending["role"],
        content=pending["content"],
        messages_json=pending["messages_json"],
        outcome=None,
    )


def on_response(state: State, event: ResponseGenerated, config: PipelineConfig) -> list[Emit]:
    touch(state, event)
    request_id = event["request_id"]
    for turn in state["turns"].values():
        if turn["request_id"] == request_id:
            turn["response_event_id"] = event_id_of(event)
            return flush_pending(state, config)
    state["waiting_responses"][request_id] = event_id_of(event)
    return []


def on_external_next_state(state: State, event: NextStateObserved, config: PipelineConfig) -> list[Emit]:
    """A connector observed what followed a turn: the session is active, and the turn needs no session_end state."""
    touch(state, event)
    turn_id = turn_id_of(event)
    if turn_id is None:
        return []
    if turn_id in state["turns"]:
        state["turns"][turn_id]["external"] = True
    else:
        state.setdefault("external_turns", []).append(turn_id)
    return []


def on_session_closed(state: State, event: SessionClosed, config: PipelineConfig) -> list[Emit]:
    if state["closed"]:
        return []
    close(state, occurred_at_of(event), "explicit")
    state["session_end"] = {
        "last_turn_id": event.get("last_turn_id"),
        "trigger_event_id": event_id_of(event),
        "occurred_at_ms": occurred_at_of(event),
    }
    assign_named_session_end(state)
    return flush_pending(state, config)


def close(state: State, closed_at_ms: int, reason: str) -> None:
    state["closed"], state["closed_at_ms"], state["closed_reason"] = True, closed_at_ms, reason
    state.pop("external_turns", None)


def assign_named_session_end(state: State) -> None:
    """Once the explicit close's named main turn is known, give it the session_end next state."""
    end = state.get("session_end")
    if not end:
        return
    turn = state["turns"].get(end["last_turn_id"])
    if turn is None or turn["kind"] != "main":
        return  # not read yet (or a side turn): wait for it, or for the grace period in on_tick
    state["session_end"] = None
    mark_session_end(state, end["last_turn_id"], end["trigger_event_id"], end["occurred_at_ms"])


def settle_session_end(state: State, config: PipelineConfig) -> list[Emit]:
    """The close named no known main turn and the grace period is over: end the then-last main turn."""
    end, state["session_end"] = state["session_end"], None
    last_turn_id = last_main_turn(state)
    if last_turn_id is None:
        return []
    mark_session_end(state, last_turn_id, end["trigger_event_id"], end["occurred_at_ms"])
    return flush_pending(state, config)


def mark_session_end(state: State, last_turn_id: str, trigger_id: str, occurred_at_ms: int) -> None:
    """Give the session's last main turn a session_end next state, unless it already has one."""
    turn = state["turns"][last_turn_id]
    if turn["next_state"] != "none" or turn["external"]:
        return
    turn["pending"] = {
        "source": "session_end",
        "role": "environment",
        "content": SESSION_END_CONTENT,
        "messages_json": None,
        "trigger_event_id": trigger_id,
        "occurred_at_ms": occurred_at_ms,
    }
    turn["next_state"] = "pending"


def close_idle_session(state: State, deadline_ms: int, config: PipelineConfig) -> list[Emit]:
    """No activity until `deadline_ms`: emit SessionClosed(idle_timeout) and the last turn's session_end state.

    The events carry the deadline as occurred_at (not the tick's time), so they do not depend on
    when the runtime happened to tick.
    """
    last_turn_id = last_main_turn(state)
    closed = build_event(
        "SessionClosed",
        producer=PRODUCER,
        namespace=state["namespace"],
        session_id=state["session_id"],
        turn_id=None,
        occurred_at_ms=deadline_ms,
        id_parts=(
            str(state["session_id"]),
            "idle_timeout",
            str(state["last_activity_ms"]),
            config.linker.version,
        ),
        reason="idle_timeout",
        last_turn_id=last_turn_id,
    )
    close(state, deadline_ms, "idle_timeout")
    if last_turn_id is not None:
        mark_session_end(state, last_turn_id, event_id_of(closed), deadline_ms)
    return [Emit("sessions", closed), *flush_pending(state, config)]


# Dispatch on envelope.event_type: each handler takes the TypedDict of the event type it is filed under.
HANDLERS: dict[str, Callable[[State, Any, PipelineConfig], list[Emit]]] = {
    "RequestReceived": on_request,
    "ResponseGenerated": on_response,
    "NextStateObserved": on_external_next_state,
    "SessionClosed": on_session_closed,
}

TURN_LINKER = TurnLinker()
