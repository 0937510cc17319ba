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
The state of a session is a frozen `LinkerSession` (its turns `LinkedTurn`s), stored by
`LINKER_STATE` (state_codec.frozen_state); the dict states stored before 2026-12-02 read as they are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from orl.pipeline.processors import conversation_diff
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import (
    Event,
    emitted_by,
    event_id_of,
    event_type_of,
    namespace_of,
    occurred_at_of,
    producer_name,
    remembered,
    session_id_of,
    turn_id_of,
)
from orl.pipeline.processors.next_state_text import next_state_role, render_messages
from orl.pipeline.processors.state_codec import StateCodec, evolved, frozen_state
from orl.pipeline.processors.topology import stage_named
from orl.schemas.event_constructors import next_state_observed, session_closed
from orl.schemas.event_types import NextStateObserved, RequestReceived, ResponseGenerated, SessionClosed
from orl.schemas.events import EventOrigin

logger = logging.getLogger(__name__)

NAME = "turn_linker"
LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)
SESSION_END_CONTENT = "(the user ended the session without replying)"
RETRY_CONTENT = "(the user sent the same conversation again without a new message: a retry)"
# How long (event time) a close that names no known main turn waits for the session's late events.
CLOSE_GRACE_S = 30.0


@dataclass(frozen=True)
class PendingNextState:
    """A turn's next state, written once the turn's response is known."""

    source: str  # "conversation" | "session_end"
    role: str
    content: str
    messages_json: str | None
    trigger_event_id: str
    occurred_at_ms: int


@dataclass(frozen=True)
class LinkedTurn:
    index: int
    kind: str
    request_id: str
    request_event_id: str
    response_event_id: str | None
    message_count: int
    messages_digest: str
    pending: PendingNextState | None = None
    next_state: str = "none"  # "none" | "pending" | "emitted"
    external: bool = False  # a connector gave it a next state: it needs no session_end one


@dataclass(frozen=True)
class SessionEnd:
    """An explicit close, until the main turn it names is known."""

    last_turn_id: str | None
    trigger_event_id: str
    occurred_at_ms: int


@dataclass(frozen=True)
class LinkerSession:
    """One session: `waiting_responses` maps request ids to the ids of responses read before their
    request; `external_turns` names turns a connector observed before their request was read."""

    namespace: str
    session_id: str | None
    last_activity_ms: int
    seen: tuple[str, ...] = ()
    closed: bool = False
    closed_at_ms: int | None = None
    closed_reason: str | None = None
    session_end: SessionEnd | None = None
    waiting_responses: Mapping[str, str] = field(default_factory=dict)
    turns: Mapping[str, LinkedTurn] = field(default_factory=dict)
    external_turns: tuple[str, ...] = ()


Linked = tuple[LinkerSession, list[Emit]]


class TurnLinker:
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs

    @property
    def state_codec(self) -> StateCodec:
        return LINKER_STATE

    def process(self, state: LinkerSession | None, event: Event, config: PipelineConfig) -> Linked:
        if state is None:
            state = LinkerSession(namespace_of(event), session_id_of(event), occurred_at_of(event))
        seen = remembered(state.seen, event_id_of(event), config.seen_window)
        if seen is None:
            return state, []
        event_type = event_type_of(event)
        if emitted_by(event, NAME) or event_type not in HANDLED_TYPES:
            return evolved(state, seen=seen), []
        if event_type == "SessionClosed":  # a close is no activity
            return on_session_closed(evolved(state, seen=seen), cast(SessionClosed, event), config)
        last_activity_ms = max(state.last_activity_ms, occurred_at_of(event))
        state = evolved(state, seen=seen, last_activity_ms=last_activity_ms)
        if event_type == "RequestReceived":
            return on_request(state, cast(RequestReceived, event), config)
        if event_type == "ResponseGenerated":
            return on_response(state, cast(ResponseGenerated, event), config)
        return on_external_next_state(state, cast(NextStateObserved, event)), []

    def on_tick(
        self, state: LinkerSession, now_ms: int, config: PipelineConfig
    ) -> tuple[LinkerSession | None, list[Emit]]:
        if state.closed:
            assert state.closed_at_ms is not None
            if state.session_end is not None and now_ms - state.closed_at_ms >= CLOSE_GRACE_S * 1000:
                return settle_session_end(state, state.session_end, config)
            expired = now_ms - state.closed_at_ms >= config.linker.closed_retention_s * 1000
            return (None, []) if expired else (state, [])
        deadline_ms = state.last_activity_ms + int(config.linker.idle_timeout_s * 1000)
        if now_ms < deadline_ms:
            return state, []
        return close_idle_session(state, deadline_ms, config)


HANDLED_TYPES = frozenset(("RequestReceived", "ResponseGenerated", "NextStateObserved", "SessionClosed"))


def with_turn(state: LinkerSession, turn_id: str, turn: LinkedTurn) -> LinkerSession:
    return evolved(state, turns={**state.turns, turn_id: turn})


def on_request(state: LinkerSession, event: RequestReceived, config: PipelineConfig) -> Linked:
    if state.closed and not belongs_to_closed_session(state, event):
        # the user came back after the close: the session goes on
        state = evolved(state, closed=False, closed_at_ms=None, closed_reason=None, session_end=None)
    request_id = event["request_id"]
    turn_id = turn_id_of(event) or request_id
    messages: list[dict[str, Any]] = json.loads(event["messages_json"])
    waiting = dict(state.waiting_responses)
    turn = LinkedTurn(
        index=int(event["turn_index"]),
        kind=event["turn_kind"],
        request_id=request_id,
        request_event_id=event_id_of(event),
        response_event_id=waiting.pop(request_id, None),
        message_count=len(messages),
        messages_digest=conversation_diff.messages_digest(messages),
        external=turn_id in state.external_turns,
    )
    state = with_turn(evolved(state, waiting_responses=waiting), turn_id, turn)
    if turn.kind != "main":
        return state, []
    previous_id = previous_main_turn(state, turn.index)
    if previous_id is not None:
        state = link_conversation(state, previous_id, messages, event)
    return flush_pending(assign_named_session_end(state), config)


def belongs_to_closed_session(state: LinkerSession, request: RequestReceived) -> bool:
    """A request that occurred at or before an explicit close was only read after it: it is part of the session."""
    return (
        state.closed_reason == "explicit"
        and state.closed_at_ms is not None
        and occurred_at_of(request) <= state.closed_at_ms
    )


def previous_main_turn(state: LinkerSession, index: int) -> str | None:
    earlier = [(t.index, tid) for tid, t in state.turns.items() if t.kind == "main" and t.index < index]
    return max(earlier)[1] if earlier else None


def last_main_turn(state: LinkerSession) -> str | None:
    mains = [(t.index, tid) for tid, t in state.turns.items() if t.kind == "main"]
    return max(mains)[1] if mains else None


def link_conversation(
    state: LinkerSession, turn_id: str, messages: list[dict[str, Any]], trigger: RequestReceived
) -> LinkerSession:
    """The previous main turn's next state: every message the client appended after its response."""
    turn = state.turns[turn_id]
    if turn.next_state != "none":
        return state
    appended, how = conversation_diff.appended_messages(turn.message_count, turn.messages_digest, messages)
    if how != conversation_diff.PREFIX:
        logger.info(
            "turn %s: history was rewritten; next state taken after the last assistant message", turn_id
        )
    pending = PendingNextState(
        source="conversation",
        role=next_state_role(appended),
        content=render_messages(appended) if appended else RETRY_CONTENT,
        messages_json=json.dumps(appended, ensure_ascii=False, sort_keys=True),
        trigger_event_id=event_id_of(trigger),
        occurred_at_ms=occurred_at_of(trigger),
    )
    return with_turn(state, turn_id, evolved(turn, pending=pending, next_state="pending"))


def flush_pending(state: LinkerSession, config: PipelineConfig) -> Linked:
    """Emit every pending next state whose turn has its response; in turn order."""
    emits, turns = [], dict(state.turns)
    for turn_id, turn in sorted(state.turns.items(), key=lambda item: item[1].index):
        if turn.next_state == "pending" and turn.pending is not None and turn.response_event_id is not None:
            emits.append(Emit("next_states", dict(next_state_event(state, turn_id, turn.pending, config))))
            turns[turn_id] = evolved(turn, pending=None, next_state="emitted")
    return (evolved(state, turns=turns), emits) if emits else (state, [])


def next_state_event(
    state: LinkerSession, turn_id: str, pending: PendingNextState, config: PipelineConfig
) -> NextStateObserved:
    origin = EventOrigin(
        namespace=state.namespace,
        producer=PRODUCER,
        occurred_at_ms=pending.occurred_at_ms,
        id_parts=(turn_id, pending.source, pending.trigger_event_id, config.linker.version),
        session_id=state.session_id,
        turn_id=turn_id,
    )
    return next_state_observed(
        origin,
        source=pending.source,
        role=pending.role,
        content=pending.content,
        messages_json=pending.messages_json,
        outcome=None,
    )


def on_response(state: LinkerSession, event: ResponseGenerated, config: PipelineConfig) -> Linked:
    request_id = event["request_id"]
    for turn_id, turn in state.turns.items():
        if turn.request_id == request_id:
            return flush_pending(
                with_turn(state, turn_id, evolved(turn, response_event_id=event_id_of(event))), config
            )
    return evolved(state, waiting_responses={**state.waiting_responses, request_id: event_id_of(event)}), []


def on_external_next_state(state: LinkerSession, event: NextStateObserved) -> LinkerSession:
    """A connector observed what followed a turn: the session is active, and the turn needs no session_end state."""
    turn_id = turn_id_of(event)
    if turn_id is None:
        return state
    turn = state.turns.get(turn_id)
    if turn is not None:
        return with_turn(state, turn_id, evolved(turn, external=True))
    return evolved(state, external_turns=(*state.external_turns, turn_id))


def on_session_closed(state: LinkerSession, event: SessionClosed, config: PipelineConfig) -> Linked:
    if state.closed:
        return state, []
    end = SessionEnd(event["last_turn_id"], event_id_of(event), occurred_at_of(event))
    state = evolved(closed(state, occurred_at_of(event), "explicit"), session_end=end)
    return flush_pending(assign_named_session_end(state), config)


def closed(state: LinkerSession, closed_at_ms: int, reason: str) -> LinkerSession:
    return evolved(state, closed=True, closed_at_ms=closed_at_ms, closed_reason=reason, external_turns=())


def assign_named_session_end(state: LinkerSession) -> LinkerSession:
    """Once the explicit close's named main turn is known, give it the session_end next state."""
    end = state.session_end
    if end is None or end.last_turn_id is None:
        return state
    turn = state.turns.get(end.last_turn_id)
    if turn is None or turn.kind != "main":
        return state  # not read yet (or a side turn): wait for it, or for the grace period in on_tick
    state = evolved(state, session_end=None)
    return with_session_end(state, end.last_turn_id, end.trigger_event_id, end.occurred_at_ms)


def settle_session_end(state: LinkerSession, end: SessionEnd, config: PipelineConfig) -> Linked:
    """The close named no known main turn and the grace period is over: end the then-last main turn."""
    state = evolved(state, session_end=None)
    last_turn_id = last_main_turn(state)
    if last_turn_id is None:
        return state, []
    return flush_pending(
        with_session_end(state, last_turn_id, end.trigger_event_id, end.occurred_at_ms), config
    )


def with_session_end(
    state: LinkerSession, last_turn_id: str, trigger_id: str, occurred_at_ms: int
) -> LinkerSession:
    """The session's last main turn with a session_end next state, unless it already has one."""
    turn = state.turns[last_turn_id]
    if turn.next_state != "none" or turn.external:
        return state
    pending = PendingNextState(
        "session_end", "environment", SESSION_END_CONTENT, None, trigger_id, occurred_at_ms
    )
    return with_turn(state, last_turn_id, evolved(turn, pending=pending, next_state="pending"))


def close_idle_session(state: LinkerSession, deadline_ms: int, config: PipelineConfig) -> Linked:
    """No activity until `deadline_ms`: emit SessionClosed(idle_timeout) and the last turn's session_end state.

    The events carry the deadline as occurred_at (not the tick's time), so they do not depend on
    when the runtime happened to tick.
    """
    last_turn_id = last_main_turn(state)
    origin = EventOrigin(
        namespace=state.namespace,
        producer=PRODUCER,
        occurred_at_ms=deadline_ms,
        id_parts=(str(state.session_id), "idle_timeout", str(state.last_activity_ms), config.linker.version),
        session_id=state.session_id,
        turn_id=None,
    )
    closing = session_closed(origin, reason="idle_timeout", last_turn_id=last_turn_id)
    state = closed(state, deadline_ms, "idle_timeout")
    if last_turn_id is not None:
        state = with_session_end(state, last_turn_id, event_id_of(closing), deadline_ms)
    state, next_states = flush_pending(state, config)
    return state, [Emit("sessions", dict(closing)), *next_states]


LINKER_STATE = frozen_state(LinkerSession)
TURN_LINKER = TurnLinker()
